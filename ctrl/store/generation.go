package store

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
)

// The database's generation names its history of versions (see doc.go,
// "A database that goes back in time"). Versions are only comparable
// within one generation: after a restore from a backup, or a failover to a
// replica that had not received the last commits, versions at or below
// the cursors krane hosts hold are issued again, to other changes. A
// stream states the generation its versions belong to, and a resuming
// stream whose cursor belongs to another generation, or is ahead of the
// head, is refused (CursorError): the host bootstraps that kind again.

// CursorError refuses a stream's cursor: it was given by another history
// of the database than the one it has now.
type CursorError struct {
	// After and Generation are what the stream asked to resume from;
	// Head and Current are the database's.
	After, Head         uint64
	Generation, Current string
	// Detected: the cursor was ahead of the head, so this check found the
	// database had gone back in time and gave it a new generation.
	Detected bool
}

func (e *CursorError) Error() string {
	if e.Detected || e.After > e.Head {
		return fmt.Sprintf("cursor %d is ahead of the database's head %d: the database went back in time (restored or failed over); bootstrap again from after_version=0 (generation %s)", e.After, e.Head, e.Current)
	}
	return fmt.Sprintf("cursor %d belongs to database generation %s, the database is at generation %s (restored or failed over since); bootstrap again from after_version=0", e.After, e.Generation, e.Current)
}

// Generation returns the database's current generation.
func (s *Store) Generation(ctx context.Context) (string, error) {
	var g string
	err := s.db.QueryRowContext(ctx, "SELECT generation FROM db_generation WHERE id = 1").Scan(&g)
	if errors.Is(err, sql.ErrNoRows) {
		return "", errors.New("store: the database has no generation row; run `ctrl admin migrate`")
	}
	if err != nil {
		return "", fmt.Errorf("store: read the database generation: %w", err)
	}
	return g, nil
}

// NewGeneration gives the database a new generation and returns it: every
// cursor krane hosts hold is refused from now on, and each host
// bootstraps again. `ctrl admin db restored` calls it after a restore or a
// failover, where the head may not show that the database went back.
func (s *Store) NewGeneration(ctx context.Context, reason string) (string, error) {
	g := newGeneration()
	if _, err := s.db.ExecContext(ctx, `INSERT INTO db_generation (id, generation, reason, updated_at) VALUES (1, ?, ?, ?)
ON DUPLICATE KEY UPDATE generation = VALUES(generation), reason = VALUES(reason), updated_at = VALUES(updated_at)`,
		g, truncate(reason, 255), nowMillis()); err != nil {
		return "", fmt.Errorf("store: write a new database generation: %w", err)
	}
	return g, nil
}

// CheckCursor checks a stream's resume point against the database and
// returns the generation the stream's versions belong to. It refuses
// (*CursorError) a cursor of another generation, and a cursor ahead of
// the head: the database went back in time, which it records by giving
// itself a new generation (once: a check that finds the generation
// changed already does not change it again), so that hosts whose cursors
// happen to be at or below the new head are refused too. after = 0 (a
// bootstrap) is never refused.
func (s *Store) CheckCursor(ctx context.Context, after uint64, generation string) (string, error) {
	var cur string
	var head uint64
	err := s.db.QueryRowContext(ctx, "SELECT g.generation, v.head FROM db_generation g JOIN version_seq v ON v.id = 1 WHERE g.id = 1").Scan(&cur, &head)
	if errors.Is(err, sql.ErrNoRows) {
		return "", errors.New("store: the database has no generation row; run `ctrl admin migrate`")
	}
	if err != nil {
		return "", fmt.Errorf("store: read the database generation and head: %w", err)
	}
	switch {
	case after == 0:
		return cur, nil
	case generation != "" && generation != cur:
		return cur, &CursorError{After: after, Head: head, Generation: generation, Current: cur}
	case after <= head:
		return cur, nil
	}
	next := newGeneration()
	res, err := s.db.ExecContext(ctx, "UPDATE db_generation SET generation = ?, reason = ?, updated_at = ? WHERE id = 1 AND generation = ?",
		next, truncate(fmt.Sprintf("a cursor (%d) was ahead of the head (%d)", after, head), 255), nowMillis(), cur)
	if err != nil {
		return "", fmt.Errorf("store: write a new database generation: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 1 {
		cur = next
	} else if cur, err = s.Generation(ctx); err != nil {
		return "", err
	}
	return cur, &CursorError{After: after, Head: head, Generation: generation, Current: cur, Detected: true}
}

func newGeneration() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
