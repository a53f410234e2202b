package store

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"time"

	"github.com/pressly/goose/v3"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// migrationLock names the MySQL user lock that serialises migrators: several
// ctrl replicas starting at once must not run the same DDL concurrently.
const migrationLock = "krane_ctrl_migrate"

// gooseTable is goose's bookkeeping table.
const gooseTable = "goose_db_version"

func migrationsFS() fs.FS {
	sub, err := fs.Sub(migrationFiles, "migrations")
	if err != nil {
		panic(err) // the embed pattern above guarantees the directory
	}
	return sub
}

func (s *Store) provider() (*goose.Provider, error) {
	return goose.NewProvider(goose.DialectMySQL, s.db, migrationsFS(), goose.WithTableName(gooseTable),
		// Each area of the schema numbers its migrations in a range of its
		// own, so a new one may sort below one a database already has.
		goose.WithAllowOutofOrder(true))
}

// MigrationResult names one applied migration.
type MigrationResult struct {
	Version  int64
	Source   string
	Duration time.Duration
}

// Migrate applies every pending migration. Concurrent callers (in any
// process) wait for each other on a MySQL user lock; the second finds
// nothing left to do.
func (s *Store) Migrate(ctx context.Context) ([]MigrationResult, error) {
	p, err := s.provider()
	if err != nil {
		return nil, fmt.Errorf("store: load migrations: %w", err)
	}
	// The lock covers all of Up. goose's own session locker does not: Up
	// first runs HasPending, which creates goose's table unlocked, and on
	// MySQL that CREATE commits before the zero-version row is inserted, so
	// a concurrent migrator could find the table empty ("missing zero
	// version migration").
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return nil, fmt.Errorf("store: migrate: %w", err)
	}
	defer conn.Close()
	locker := getLockLocker{}
	if err := locker.SessionLock(ctx, conn); err != nil {
		return nil, fmt.Errorf("store: migrate: %w", err)
	}
	defer func() { _ = locker.SessionUnlock(context.WithoutCancel(ctx), conn) }()
	results, err := p.Up(ctx)
	if err != nil {
		return nil, fmt.Errorf("store: apply migrations: %w (the database is left at the last migration that succeeded; fix the cause and run `ctrl admin migrate` again)", err)
	}
	out := make([]MigrationResult, 0, len(results))
	for _, r := range results {
		out = append(out, MigrationResult{Version: r.Source.Version, Source: r.Source.Path, Duration: r.Duration})
	}
	return out, nil
}

// MigrationsCurrent reports whether every embedded migration is applied. It
// only reads (a readiness probe must not create goose's table as a side
// effect); a database never migrated is simply not current.
func (s *Store) MigrationsCurrent(ctx context.Context) (bool, error) {
	want := map[int64]bool{}
	entries, err := fs.ReadDir(migrationsFS(), ".")
	if err != nil {
		return false, err
	}
	for _, e := range entries {
		v, err := goose.NumericComponent(e.Name())
		if err != nil {
			return false, fmt.Errorf("store: migration file %s: %w", e.Name(), err)
		}
		want[v] = true
	}
	rows, err := s.db.QueryContext(ctx, "SELECT version_id, is_applied FROM "+gooseTable+" ORDER BY id")
	if err != nil {
		if mysqlErrNumber(err) == 1146 { // no such table: never migrated
			return false, nil
		}
		return false, fmt.Errorf("store: read applied migrations: %w", err)
	}
	defer rows.Close()
	applied := map[int64]bool{}
	for rows.Next() {
		var v int64
		var ok bool
		if err := rows.Scan(&v, &ok); err != nil {
			return false, err
		}
		applied[v] = ok // the latest row of a version decides (up, then down, ...)
	}
	if err := rows.Err(); err != nil {
		return false, err
	}
	for v := range want {
		if !applied[v] {
			return false, nil
		}
	}
	return true, nil
}

// getLockLocker is a session lock on MySQL's GET_LOCK, which works
// the same on MySQL and MariaDB and is released if the session dies.
type getLockLocker struct{}

func (getLockLocker) SessionLock(ctx context.Context, conn *sql.Conn) error {
	for {
		var got sql.NullInt64
		// Wait in short slices so ctx cancellation is honoured.
		if err := conn.QueryRowContext(ctx, "SELECT GET_LOCK(?, 5)", migrationLock).Scan(&got); err != nil {
			return fmt.Errorf("take migration lock %q: %w", migrationLock, err)
		}
		if got.Valid && got.Int64 == 1 {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("take migration lock %q: another migrator holds it: %w", migrationLock, err)
		}
	}
}

func (getLockLocker) SessionUnlock(ctx context.Context, conn *sql.Conn) error {
	var released sql.NullInt64
	if err := conn.QueryRowContext(ctx, "SELECT RELEASE_LOCK(?)", migrationLock).Scan(&released); err != nil {
		return fmt.Errorf("release migration lock %q: %w", migrationLock, err)
	}
	if !released.Valid || released.Int64 != 1 {
		return errors.New("release migration lock: this session did not hold it")
	}
	return nil
}
