package store

import (
	"context"
	"fmt"
	"time"
)

// Replica is a ctrl replica sharing the database, as it last said.
type Replica struct {
	ID, Version string
	StartedAt   time.Time
	// SeenAt is when it last wrote its row; RevocationsReadAt the
	// database's time when its last read of the revoked tokens began: every
	// revocation committed before it is refused by that replica.
	SeenAt, RevocationsReadAt time.Time
}

// dbNowMillis is the database's clock, in milliseconds: one clock for
// every replica and CLI, whatever theirs say.
const dbNowMillis = "CAST(ROUND(UNIX_TIMESTAMP(NOW(3)) * 1000) AS SIGNED)"

// Now is the database's clock.
func (s *Store) Now(ctx context.Context) (time.Time, error) {
	var ms int64
	if err := s.db.QueryRowContext(ctx, "SELECT "+dbNowMillis).Scan(&ms); err != nil {
		return time.Time{}, fmt.Errorf("store: read the database's clock: %w", err)
	}
	return time.UnixMilli(ms), nil
}

// RevokedTokensRead is RevokedTokensSince, with the database's time read
// just before: every revocation committed before that time (and revoked
// since since) is in the answer, the read starting after it.
func (s *Store) RevokedTokensRead(ctx context.Context, since time.Time) ([]Token, time.Time, error) {
	readAt, err := s.Now(ctx)
	if err != nil {
		return nil, time.Time{}, err
	}
	toks, err := s.RevokedTokensSince(ctx, since)
	return toks, readAt, err
}

// RecordRevocationsRead records that replica id (of version) read the
// revoked tokens from the database's time readAt; rows of replicas silent
// for an hour go.
func (s *Store) RecordRevocationsRead(ctx context.Context, id, version string, startedAt, readAt time.Time) error {
	if err := s.execRetried(ctx, `INSERT INTO ctrl_replicas (id, version, started_at, seen_at, revocations_read_at) VALUES (?, ?, ?, `+dbNowMillis+`, ?)
ON DUPLICATE KEY UPDATE version = VALUES(version), seen_at = VALUES(seen_at), revocations_read_at = GREATEST(revocations_read_at, VALUES(revocations_read_at))`,
		id, truncate(version, 64), startedAt.UnixMilli(), readAt.UnixMilli()); err != nil {
		return fmt.Errorf("store: record what replica %s read of the revoked tokens: %w", id, err)
	}
	return nil
}

// Replicas lists the replicas that wrote their row within the last hour,
// with the database's time now.
func (s *Store) Replicas(ctx context.Context) ([]Replica, time.Time, error) {
	if err := s.execRetried(ctx, "DELETE FROM ctrl_replicas WHERE seen_at < "+dbNowMillis+" - 3600000"); err != nil {
		return nil, time.Time{}, fmt.Errorf("store: forget silent ctrl replicas: %w", err)
	}
	rows, err := s.db.QueryContext(ctx, "SELECT n.now, r.id, r.version, r.started_at, r.seen_at, r.revocations_read_at FROM (SELECT "+dbNowMillis+" AS now) n LEFT JOIN ctrl_replicas r ON TRUE ORDER BY r.id")
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("store: read ctrl replicas: %w", err)
	}
	defer rows.Close()
	var out []Replica
	var now int64
	for rows.Next() {
		var id, version *string
		var started, seen, read *int64
		if err := rows.Scan(&now, &id, &version, &started, &seen, &read); err != nil {
			return nil, time.Time{}, fmt.Errorf("store: read ctrl replicas: %w", err)
		}
		if id == nil {
			continue
		}
		out = append(out, Replica{ID: *id, Version: *version, StartedAt: time.UnixMilli(*started), SeenAt: time.UnixMilli(*seen), RevocationsReadAt: time.UnixMilli(*read)})
	}
	return out, time.UnixMilli(now), rows.Err()
}

// execRetried runs one statement (its own transaction), again after a
// deadlock or a lock wait timeout: the replicas' upserts and a lister's
// delete of silent rows lock rows of one small table in orders MySQL may
// find circular, and either side simply runs again.
func (s *Store) execRetried(ctx context.Context, query string, args ...any) error {
	var err error
	for attempt := 1; attempt <= maxTxAttempts; attempt++ {
		if _, err = s.db.ExecContext(ctx, query, args...); err == nil || !isRetryable(err) {
			return err
		}
		if err := sleepCtx(ctx, time.Duration(attempt*attempt)*5*time.Millisecond); err != nil {
			return err
		}
	}
	return fmt.Errorf("kept deadlocking (%d attempts): %w", maxTxAttempts, err)
}
