package store

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/pressly/goose/v3"
)

// Backfill fills what an expand step added, for the rows that existed
// before it, in bounded batches: one UPDATE per batch of keys, each its own
// transaction, walking the primary key in order. A whole-table UPDATE is
// one transaction that holds its row locks to the end (old replicas'
// writes to those rows wait behind it) and that an asynchronous replica
// applies as one, lagging by its whole length; batches bound both. Where
// selects the rows that still need filling, so a backfill stopped halfway
// (a crash, a killed migrator) resumes where it was, and running it twice
// changes nothing.
type Backfill struct {
	// Table and Key: the table and its primary key (one column).
	Table, Key string
	// Set is the assignment list, e.g. "workload = JSON_OBJECT(...)".
	Set string
	// Where selects the rows still to fill, e.g. "workload IS NULL".
	Where string
	// Batch bounds the rows of one transaction; default 1000.
	Batch int
	// Pause is waited between batches (a replica catching up, old
	// replicas' writes); default none.
	Pause time.Duration
}

// BackfillProgress is where a backfill stands.
type BackfillProgress struct {
	Done, Total int // rows filled, and to fill when it started
	Batches     int
	// Longest is the longest batch's transaction.
	Longest time.Duration
}

// Run fills the rows on db (the migrator's connections: a large backfill
// outlasts the serving pool's read timeout), calling progress (when not
// nil) after each batch.
func (b Backfill) Run(ctx context.Context, db *sql.DB, progress func(BackfillProgress)) (BackfillProgress, error) {
	batch := b.Batch
	if batch <= 0 {
		batch = 1000
	}
	var p BackfillProgress
	if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+b.Table+" WHERE "+b.Where).Scan(&p.Total); err != nil {
		return p, fmt.Errorf("backfill %s: count the rows to fill: %w", b.Table, err)
	}
	// Keys walk in order from the smallest: each batch is the next Batch
	// keys still to fill, found and filled in one transaction so a row
	// filled by someone else meanwhile is simply skipped.
	var after any = nil
	for {
		begin := time.Now()
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return p, fmt.Errorf("backfill %s: %w", b.Table, err)
		}
		q := "SELECT " + b.Key + " FROM " + b.Table + " WHERE (" + b.Where + ")"
		args := []any{}
		if after != nil {
			q += " AND " + b.Key + " > ?"
			args = append(args, after)
		}
		var last any
		var n int
		rows, err := tx.QueryContext(ctx, q+" ORDER BY "+b.Key+" LIMIT ? FOR UPDATE", append(args, batch)...)
		if err == nil {
			for rows.Next() {
				var k []byte
				if err = rows.Scan(&k); err != nil {
					break
				}
				last, n = string(k), n+1
			}
			if err == nil {
				err = rows.Err()
			}
			rows.Close()
		}
		if err == nil && n > 0 {
			upd := "UPDATE " + b.Table + " SET " + b.Set + " WHERE (" + b.Where + ") AND " + b.Key + " <= ?"
			uargs := []any{last}
			if after != nil {
				upd += " AND " + b.Key + " > ?"
				uargs = append(uargs, after)
			}
			var res sql.Result
			if res, err = tx.ExecContext(ctx, upd, uargs...); err == nil {
				filled, _ := res.RowsAffected()
				p.Done += int(filled)
			}
		}
		if err != nil {
			_ = tx.Rollback()
			return p, fmt.Errorf("backfill %s after key %v: %w (filled rows stay filled: run the migration again to go on)", b.Table, after, err)
		}
		if err := tx.Commit(); err != nil {
			return p, fmt.Errorf("backfill %s after key %v: commit: %w", b.Table, after, err)
		}
		if n == 0 {
			return p, nil
		}
		p.Batches++
		p.Longest = max(p.Longest, time.Since(begin))
		after = last
		if progress != nil {
			progress(p)
		}
		if b.Pause > 0 {
			if err := sleepCtx(ctx, b.Pause); err != nil {
				return p, err
			}
		}
	}
}

// BackfillMigration is a migration written in Go that runs a Backfill: an
// expand step (it fills, never removes), numbered among the SQL files.
type BackfillMigration struct {
	Version int64
	Name    string // e.g. "00062_backfill_sentinel_workload"
	Backfill
}

// backfills are the releases' backfill steps, beside the SQL files.
var backfills []BackfillMigration

// goMigrations are the backfills as goose runs them: on the migrator's
// pool (RunDB: no transaction around the whole), reporting each batch.
func (s *Store) goMigrations(report func(name string, p BackfillProgress)) []*goose.Migration {
	var out []*goose.Migration
	for _, b := range append(backfills, s.extraBackfills...) {
		up := &goose.GoFunc{RunDB: func(ctx context.Context, db *sql.DB) error {
			_, err := b.Run(ctx, db, func(p BackfillProgress) {
				if report != nil {
					report(b.Name, p)
				}
			})
			return err
		}}
		// Down leaves the filled column: the expand step's own Down drops
		// it, if ever.
		down := &goose.GoFunc{RunDB: func(context.Context, *sql.DB) error { return nil }}
		out = append(out, goose.NewGoMigration(b.Version, up, down))
	}
	return out
}

// backfillInfos are the backfills as the plan lists them.
func (s *Store) backfillInfos() []MigrationInfo {
	var out []MigrationInfo
	for _, b := range append(backfills, s.extraBackfills...) {
		out = append(out, MigrationInfo{Version: b.Version, Name: b.Name + " (backfill of " + b.Table + ")", Phase: Expand})
	}
	return out
}
