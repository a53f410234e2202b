package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"
)

// RemovedCluster is what removing a cluster did.
type RemovedCluster struct {
	ID, Region    string
	TokensRevoked int64
	// Rows of the cluster's actual state that went with it.
	Reports, Instances, ApplyErrors int64
}

// RemoveCluster removes a cluster, in one transaction: its valid tokens
// are revoked (every ctrl closes their open streams within its revocation
// poll, and refuses them from then on), its reports, instances and apply
// errors are deleted, its row goes (so no listing shows it and no rule
// counts it), and the removal is recorded in cluster_audit with actor.
// ErrNotFound when no such cluster is registered. Registering the id
// again later makes a new cluster.
func (s *Store) RemoveCluster(ctx context.Context, clusterID, actor string) (RemovedCluster, error) {
	var out RemovedCluster
	err := s.reportTx(ctx, s.db, func(ctx context.Context, tx *sql.Tx) error {
		out = RemovedCluster{ID: clusterID}
		err := tx.QueryRowContext(ctx, "SELECT region FROM clusters WHERE id = ? FOR UPDATE", clusterID).Scan(&out.Region)
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("store: remove cluster %s: %w", clusterID, ErrNotFound)
		}
		if err != nil {
			return fmt.Errorf("store: remove cluster %s: %w", clusterID, err)
		}
		now := nowMillis()
		for _, step := range []struct {
			n     *int64
			query string
			args  []any
		}{
			{&out.TokensRevoked, "UPDATE api_tokens SET revoked_at = ? WHERE cluster_id = ? AND kind = 'cluster' AND revoked_at IS NULL", []any{now, clusterID}},
			{&out.Reports, "DELETE FROM object_reports WHERE cluster_id = ?", []any{clusterID}},
			{&out.Instances, "DELETE FROM instances WHERE region = ? AND cluster_id = ?", []any{out.Region, clusterID}},
			{&out.ApplyErrors, "DELETE FROM apply_errors WHERE cluster_id = ?", []any{clusterID}},
			{nil, "DELETE FROM clusters WHERE id = ?", []any{clusterID}},
		} {
			res, err := tx.ExecContext(ctx, step.query, step.args...)
			if err != nil {
				return fmt.Errorf("store: remove cluster %s: %w", clusterID, err)
			}
			if step.n != nil {
				*step.n, _ = res.RowsAffected()
			}
		}
		detail := fmt.Sprintf("%d tokens revoked; %d reports, %d instances, %d apply errors deleted", out.TokensRevoked, out.Reports, out.Instances, out.ApplyErrors)
		if _, err := tx.ExecContext(ctx, "INSERT INTO cluster_audit (cluster_id, region, action, actor, detail, created_at) VALUES (?, ?, 'remove', ?, ?, ?)",
			clusterID, out.Region, truncate(actor, 255), detail, now); err != nil {
			return fmt.Errorf("store: record the removal of cluster %s: %w", clusterID, err)
		}
		return nil
	})
	return out, err
}

// ClusterAuditEntry is one recorded action on a cluster.
type ClusterAuditEntry struct {
	ClusterID, Region, Action, Actor, Detail string
	At                                       time.Time
}

// ClusterAudit returns up to limit entries, newest first (of one cluster
// when clusterID is set).
func (s *Store) ClusterAudit(ctx context.Context, clusterID string, limit int) ([]ClusterAuditEntry, error) {
	q, args := "SELECT cluster_id, region, action, actor, detail, created_at FROM cluster_audit", []any{}
	if clusterID != "" {
		q, args = q+" WHERE cluster_id = ?", append(args, clusterID)
	}
	rows, err := s.db.QueryContext(ctx, q+" ORDER BY id DESC LIMIT ?", append(args, limit)...)
	if err != nil {
		return nil, fmt.Errorf("store: read the cluster audit: %w", err)
	}
	defer rows.Close()
	var out []ClusterAuditEntry
	for rows.Next() {
		var e ClusterAuditEntry
		var at int64
		if err := rows.Scan(&e.ClusterID, &e.Region, &e.Action, &e.Actor, &e.Detail, &at); err != nil {
			return nil, fmt.Errorf("store: read the cluster audit: %w", err)
		}
		e.At = time.UnixMilli(at)
		out = append(out, e)
	}
	return out, rows.Err()
}

// truncate cuts s to at most n bytes, on a character boundary.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "")
}
