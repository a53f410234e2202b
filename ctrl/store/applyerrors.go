package store

import (
	"context"
	"database/sql"
	"errors"
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
// cluster's apply error on one object of its region. An error for an older
// version than the stored one is ignored. ErrNotFound when the object does
// not exist in region: a cluster reports only on what its region runs. A
// *VersionAheadError when the error's version, or observed (the report's
// observed version), is above the object's: ctrl never issued it.
// ErrClusterNotRegistered when the cluster is not (or no longer)
// registered in region: its row is read in share mode, so a removal
// (RemoveCluster) and an apply error of the same cluster are ordered, and
// no apply error of a removed cluster is stored after its rows went.
func (s *Store) ReportApplyError(ctx context.Context, kind, region, clusterID, id string, ae *clusterv1.ApplyError, observed uint64) error {
	_, err := s.WriteTxAlone(ctx, func(ctx context.Context, tx *Tx) error {
		var registered string
		err := tx.QueryRow(ctx, "SELECT region FROM clusters WHERE id = ? LOCK IN SHARE MODE", clusterID).Scan(&registered)
		if errors.Is(err, sql.ErrNoRows) || err == nil && registered != region {
			return fmt.Errorf("store: cluster %s is not registered in region %s: %w", clusterID, region, ErrClusterNotRegistered)
		}
		if err != nil {
			return fmt.Errorf("store: read cluster %s: %w", clusterID, err)
		}
		ref := Ref{Kind: kind, Region: region, ID: id}
		cur, err := tx.objectVersion(ctx, ref)
		if err != nil {
			return err
		}
		if v := max(ae.GetVersion(), observed); v > cur {
			return &VersionAheadError{Ref: ref, Reported: v, Current: cur}
		}
		if ae.GetMessage() == "" {
			if _, err := tx.Exec(ctx, `DELETE FROM apply_errors WHERE kind = ? AND region = ? AND id = ? AND cluster_id = ? AND version <= ?`,
				kind, region, id, clusterID, ae.GetVersion()); err != nil {
				return fmt.Errorf("store: clear apply error of %s %s: %w", kind, id, err)
			}
			return nil
		}
		if _, err := tx.Exec(ctx, `INSERT INTO apply_errors (kind, region, id, cluster_id, version, message, field, permanent, updated_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
ON DUPLICATE KEY UPDATE
  message    = IF(VALUES(version) >= version, VALUES(message), message),
  field      = IF(VALUES(version) >= version, VALUES(field), field),
  permanent  = IF(VALUES(version) >= version, VALUES(permanent), permanent),
  updated_at = IF(VALUES(version) >= version, VALUES(updated_at), updated_at),
  version    = GREATEST(version, VALUES(version))`,
			kind, region, id, clusterID, ae.GetVersion(), ae.GetMessage(), ae.GetField(), ae.GetPermanent(), time.Now().UnixMilli()); err != nil {
			return fmt.Errorf("store: record apply error of %s %s: %w", kind, id, err)
		}
		return nil
	})
	return err
}

// VersionAheadError refuses a report whose version is above the object's
// current one: no cluster can have seen a version ctrl never issued, and
// storing it would make the object's real reports look stale for good.
type VersionAheadError struct {
	Ref
	Reported, Current uint64
}

func (e *VersionAheadError) Error() string {
	return fmt.Sprintf("store: a report on %s at version %d, above its current version %d", e.Ref, e.Reported, e.Current)
}

// objectVersion returns the current version of one desired-state row
// (without locking it); ErrNotFound when it does not exist.
func (t *Tx) objectVersion(ctx context.Context, r Ref) (uint64, error) {
	def := lookupKind(r.Kind)
	var v uint64
	err := t.QueryRow(ctx, def.rowVersionSQL(false), def.keyArgs(r)...).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, fmt.Errorf("store: no %s: %w", r, ErrNotFound)
	}
	if err != nil {
		return 0, fmt.Errorf("store: read %s: %w", r, err)
	}
	return v, nil
}

// ApplyErrors lists the clusters' apply errors on one object of region.
func (s *Store) ApplyErrors(ctx context.Context, kind, region, id string) ([]ApplyError, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT kind, region, id, cluster_id, version, message, field, permanent, updated_at
FROM apply_errors WHERE kind = ? AND region = ? AND id = ? ORDER BY cluster_id`, kind, region, id)
	if err != nil {
		return nil, fmt.Errorf("store: read apply errors of %s %s/%s: %w", kind, region, id, err)
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
