package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// PendingKey names the changes a cluster had not applied: those of kind in
// region with a version above cursor.
type PendingKey struct {
	Region string
	Kind   string
	Cursor uint64
}

// PendingSince returns, for each key, when the oldest change above its
// cursor got its version (committed, for every reader's purpose: the
// stamp runs just before COMMIT). A key with no such change, or whose
// oldest change was versioned before ctrl recorded these times, is left
// out. One indexed read of one row per key: callers pass only the keys
// that are behind, and clusters at the same cursor share a key.
func (s *Store) PendingSince(ctx context.Context, keys []PendingKey) (map[PendingKey]time.Time, error) {
	out := make(map[PendingKey]time.Time, len(keys))
	for _, k := range keys {
		if _, done := out[k]; done {
			continue
		}
		def := lookupKind(k.Kind)
		cond, args := "region = ?", []any{k.Region}
		if def == genericKind {
			cond, args = "region = ? AND kind = ?", []any{k.Region, k.Kind}
		}
		var at int64
		err := s.db.QueryRowContext(ctx, "SELECT version_at FROM "+def.table+" WHERE "+cond+" AND version > ? ORDER BY version LIMIT 1",
			append(args, k.Cursor)...).Scan(&at)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			continue
		case err != nil:
			return nil, fmt.Errorf("store: oldest change of %s in %s above version %d: %w", k.Kind, k.Region, k.Cursor, err)
		}
		if at > 0 {
			out[k] = time.UnixMilli(at)
		}
	}
	return out, nil
}

// ClusterLiveness is what a region's cluster last said about itself, for
// deciding whether a deploy there can be served.
type ClusterLiveness struct {
	ID              string
	Region          string
	LastHeartbeatAt time.Time // zero: never
	// Host is nil when the cluster's heartbeats do not report controllers.
	Host *HostReport
}

// ClustersIn returns the clusters of regions that hold a valid token (a
// cluster without one cannot serve anything), by region and id.
func (s *Store) ClustersIn(ctx context.Context, regions []string) ([]ClusterLiveness, error) {
	if len(regions) == 0 {
		return nil, nil
	}
	args := []any{}
	for _, r := range regions {
		args = append(args, r)
	}
	args = append(args, nowMillis())
	rows, err := s.db.QueryContext(ctx, `SELECT c.id, c.region, c.last_heartbeat_at, c.controllers FROM clusters c
WHERE c.region IN (`+placeholders(len(regions))+`)
  AND EXISTS (SELECT 1 FROM api_tokens t WHERE t.cluster_id = c.id AND t.kind = 'cluster' AND t.revoked_at IS NULL
    AND (t.expires_at IS NULL OR t.expires_at > ?))
ORDER BY c.region, c.id`, args...)
	if err != nil {
		return nil, fmt.Errorf("store: read the clusters of %d regions: %w", len(regions), err)
	}
	defer rows.Close()
	var out []ClusterLiveness
	for rows.Next() {
		var c ClusterLiveness
		var hb int64
		var controllers []byte
		if err := rows.Scan(&c.ID, &c.Region, &hb, &controllers); err != nil {
			return nil, fmt.Errorf("store: read the clusters of %d regions: %w", len(regions), err)
		}
		if hb > 0 {
			c.LastHeartbeatAt = time.UnixMilli(hb)
		}
		if controllers != nil {
			h := &HostReport{}
			if json.Unmarshal(controllers, &h.Controllers) == nil {
				c.Host = h
			}
		}
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: read the clusters of %d regions: %w", len(regions), err)
	}
	return out, nil
}
