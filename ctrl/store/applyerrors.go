package store

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	clusterv1 "krane.dev/proto/krane/cluster/v1"
)

// ApplyError is a change a cluster could not apply.
type ApplyError struct {
	Kind, Region, ID, ClusterID string
	Version                     uint64
	Message                     string
	Field                       string
	Permanent                   bool
	UpdatedAt                   time.Time
}

// ReportApplyError records (or, when its message is empty, clears) a
// cluster's apply error on one object. An error for an older version than
// the stored one is ignored.
func (s *Store) ReportApplyError(ctx context.Context, kind, region, clusterID, id string, ae *clusterv1.ApplyError) error {
	if ae.GetMessage() == "" {
		_, err := s.db.ExecContext(ctx, `DELETE FROM apply_errors WHERE kind = ? AND region = ? AND id = ? AND cluster_id = ? AND version <= ?`,
			kind, region, id, clusterID, ae.GetVersion())
		if err != nil {
			return fmt.Errorf("store: clear apply error of %s %s: %w", kind, id, err)
		}
		return nil
	}
	_, err := s.db.ExecContext(ctx, `INSERT INTO apply_errors (kind, region, id, cluster_id, version, message, field, permanent, updated_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
ON DUPLICATE KEY UPDATE
  message    = IF(VALUES(version) >= version, VALUES(message), message),
  field      = IF(VALUES(version) >= version, VALUES(field), field),
  permanent  = IF(VALUES(version) >= version, VALUES(permanent), permanent),
  updated_at = IF(VALUES(version) >= version, VALUES(updated_at), updated_at),
  version    = GREATEST(version, VALUES(version))`,
		kind, region, id, clusterID, ae.GetVersion(), ae.GetMessage(), ae.GetField(), ae.GetPermanent(), time.Now().UnixMilli())
	if err != nil {
		return fmt.Errorf("store: record apply error of %s %s: %w", kind, id, err)
	}
	return nil
}

// ApplyErrors lists the clusters' apply errors on one object, in every
// region.
func (s *Store) ApplyErrors(ctx context.Context, kind, id string) ([]ApplyError, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT kind, region, id, cluster_id, version, message, field, permanent, updated_at
FROM apply_errors WHERE kind = ? AND id = ? ORDER BY region, cluster_id`, kind, id)
	if err != nil {
		return nil, fmt.Errorf("store: read apply errors of %s %s: %w", kind, id, err)
	}
	return scanApplyErrors(rows)
}

// scanApplyErrors reads the rows of a query of apply_errors' columns, in
// table order, and closes them.
func scanApplyErrors(rows *sql.Rows) ([]ApplyError, error) {
	defer rows.Close()
	var out []ApplyError
	for rows.Next() {
		var e ApplyError
		var ms int64
		if err := rows.Scan(&e.Kind, &e.Region, &e.ID, &e.ClusterID, &e.Version, &e.Message, &e.Field, &e.Permanent, &ms); err != nil {
			return nil, err
		}
		e.UpdatedAt = time.UnixMilli(ms)
		out = append(out, e)
	}
	return out, rows.Err()
}
