package store

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"time"
)

// The database's generation names its history of versions (see doc.go,
// "A database that goes back in time"). Versions are only comparable
// within one generation: after a restore from a backup, or a failover to a
// replica that had not received the last commits, versions at or below
// the cursors krane hosts hold are issued again, to other changes. A
// stream states the generation its versions belong to, and a resuming
// stream whose cursor belongs to another generation, or is ahead of the
// head, is refused (CursorError): the host bootstraps that kind again. The
// generation itself changes on the operator's word, or when several
// clusters' cursors agree that the database went back (CheckCursor).

// CursorError refuses a stream's cursor: it was given by another history
// of the database than the one it has now.
type CursorError struct {
	// After and Generation are what the stream asked to resume from;
	// Head and Current are the database's.
	After, Head         uint64
	Generation, Current string
	// Detected: the cursor was ahead of the head and claims of enough
	// clusters agreed, so this check gave the database a new generation.
	Detected bool
}

func (e *CursorError) Error() string {
	if e.Detected || e.After > e.Head {
		return fmt.Sprintf("cursor %d is ahead of the database's head %d: this cluster's state is from another history of the database (restored or failed over); bootstrap again from after_version=0 (generation %s)", e.After, e.Head, e.Current)
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

// Claims of clusters that the database went back in time change its
// generation only when at least ClaimQuorum distinct clusters made one
// within ClaimWindow, and at most once per ClaimWindow.
const (
	ClaimQuorum = 2
	ClaimWindow = 10 * time.Minute
)

// CheckCursor checks a stream's resume point against the database and
// returns the generation the stream's versions belong to. It refuses
// (*CursorError) a cursor of another generation, and a cursor ahead of
// the head. after = 0 (a bootstrap) is never refused.
//
// A cursor ahead of the head says the database went back in time (a
// restore, a failover to a lagging replica), but it is one cluster's word:
// a cluster token, or a host restored from an old backup, can claim it at
// will. So the stream is refused (its host bootstraps again, which harms
// no one else) and the claim is kept (cursor_claims, one row per cluster);
// the database takes a new generation, refusing every host's cursor, only
// when clusters of ClaimQuorum distinct ids claimed it within ClaimWindow,
// and not again within ClaimWindow of its last change. Otherwise the
// operator's word is needed: `ctrl admin db restored` (NewGeneration).
func (s *Store) CheckCursor(ctx context.Context, clusterID, region string, after uint64, generation string) (string, error) {
	var cur string
	var head uint64
	var changedAt int64
	err := s.db.QueryRowContext(ctx, "SELECT g.generation, g.updated_at, v.head FROM db_generation g JOIN version_seq v ON v.id = 1 WHERE g.id = 1").Scan(&cur, &changedAt, &head)
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
	refused := &CursorError{After: after, Head: head, Generation: generation, Current: cur}
	now := nowMillis()
	if _, err := s.db.ExecContext(ctx, `INSERT INTO cursor_claims (cluster_id, region, cursor_at, head, generation, claimed_at) VALUES (?, ?, ?, ?, ?, ?)
ON DUPLICATE KEY UPDATE region = VALUES(region), cursor_at = VALUES(cursor_at), head = VALUES(head), generation = VALUES(generation), claimed_at = VALUES(claimed_at)`,
		clusterID, region, after, head, cur, now); err != nil {
		return "", fmt.Errorf("store: record cluster %s's claim that the database went back in time: %w", clusterID, err)
	}
	window := ClaimWindow.Milliseconds()
	if now-changedAt < window {
		return cur, refused
	}
	// Claims count toward the current generation only, made since it
	// began, of cursors still ahead of the head.
	var clusters int
	if err := s.db.QueryRowContext(ctx, "SELECT COUNT(*) FROM cursor_claims WHERE generation = ? AND claimed_at >= ? AND claimed_at >= ? AND cursor_at > ?",
		cur, now-window, changedAt, head).Scan(&clusters); err != nil {
		return "", fmt.Errorf("store: count the clusters that claim the database went back in time: %w", err)
	}
	if clusters < ClaimQuorum {
		return cur, refused
	}
	next := newGeneration()
	res, err := s.db.ExecContext(ctx, "UPDATE db_generation SET generation = ?, reason = ?, updated_at = ? WHERE id = 1 AND generation = ?",
		next, truncate(fmt.Sprintf("the cursors of %d clusters were ahead of the head (%d)", clusters, head), 255), now, cur)
	if err != nil {
		return "", fmt.Errorf("store: write a new database generation: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 1 {
		cur = next
	} else if cur, err = s.Generation(ctx); err != nil {
		return "", err
	}
	refused.Current, refused.Detected = cur, true
	return cur, refused
}

// CursorClaim is a cluster's claim that the database went back in time.
type CursorClaim struct {
	ClusterID, Region string
	Cursor, Head      uint64
	Generation        string
	ClaimedAt         time.Time
}

// CursorClaims lists the clusters' claims, one per cluster, newest first.
func (s *Store) CursorClaims(ctx context.Context) ([]CursorClaim, error) {
	rows, err := s.db.QueryContext(ctx, "SELECT cluster_id, region, cursor_at, head, generation, claimed_at FROM cursor_claims ORDER BY claimed_at DESC, cluster_id")
	if err != nil {
		return nil, fmt.Errorf("store: read the clusters' claims that the database went back in time: %w", err)
	}
	defer rows.Close()
	var out []CursorClaim
	for rows.Next() {
		var c CursorClaim
		var at int64
		if err := rows.Scan(&c.ClusterID, &c.Region, &c.Cursor, &c.Head, &c.Generation, &at); err != nil {
			return nil, err
		}
		c.ClaimedAt = time.UnixMilli(at)
		out = append(out, c)
	}
	return out, rows.Err()
}

func newGeneration() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
