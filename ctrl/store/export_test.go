package store

import (
	"context"
	"io/fs"
)

// QueuedWrites is how many WriteTx calls wait for a group commit (tests
// use it to build a batch of a known size).
func (s *Store) QueuedWrites() int {
	if s.writes == nil {
		return 0
	}
	s.writes.mu.Lock()
	defer s.writes.mu.Unlock()
	return len(s.writes.queue)
}

// MigrateDownTo rolls the migrations back to version v.
func (s *Store) MigrateDownTo(ctx context.Context, v int64) error {
	p, err := s.provider(s.db, nil)
	if err != nil {
		return err
	}
	_, err = p.DownTo(ctx, v)
	return err
}

// UseMigrations makes the store apply fsys's migrations instead of the
// embedded ones.
func (s *Store) UseMigrations(fsys fs.FS) { s.migrations = fsys }

// EmbeddedMigrations are the migrations the binary carries.
func EmbeddedMigrations() fs.FS { return migrationsFS() }

// UseBackfills adds backfill steps to the releases'.
func (s *Store) UseBackfills(b ...BackfillMigration) {
	s.extraBackfills = append(s.extraBackfills, b...)
}
