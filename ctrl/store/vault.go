package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"
)

// SealedEnv returns what a decryption request is checked against: the
// sealed blob stored for a deployment (nil without secrets) and the
// regions where it is scheduled to run. ErrNotFound when there is no such
// deployment.
func (s *Store) SealedEnv(ctx context.Context, deploymentID string) ([]byte, []string, error) {
	var blob []byte
	err := s.db.QueryRowContext(ctx, "SELECT encrypted_env FROM deployments WHERE id = ?", deploymentID).Scan(&blob)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil, ErrNotFound
	}
	if err != nil {
		return nil, nil, fmt.Errorf("store: read the sealed environment of %s: %w", deploymentID, err)
	}
	rows, err := s.db.QueryContext(ctx, `SELECT region FROM deployment_topology
WHERE deployment_id = ? AND desired_status = 'running' AND desired_replicas > 0 ORDER BY region`, deploymentID)
	if err != nil {
		return nil, nil, fmt.Errorf("store: read the regions of %s: %w", deploymentID, err)
	}
	defer rows.Close()
	var regions []string
	for rows.Next() {
		var r string
		if err := rows.Scan(&r); err != nil {
			return nil, nil, err
		}
		regions = append(regions, r)
	}
	return blob, regions, rows.Err()
}

// Outcomes of a decryption request.
const (
	VaultAllowed = "allowed"
	VaultDenied  = "denied"
	VaultFailed  = "failed"
)

// VaultAuditEntry is one decryption request.
type VaultAuditEntry struct {
	ID           int64
	DeploymentID string
	ClusterID    string
	Region       string
	TokenID      string
	Outcome      string
	// Reason says why a request was denied or failed; it never holds
	// secret material.
	Reason string
	KeyID  string
	At     time.Time
}

// RecordVaultAudit appends an entry. Fields longer than their column are
// cut (a request's deployment id is the caller's input).
func (s *Store) RecordVaultAudit(ctx context.Context, e VaultAuditEntry) error {
	at := e.At
	if at.IsZero() {
		at = time.Now()
	}
	_, err := s.db.ExecContext(ctx, `INSERT INTO vault_audit (deployment_id, cluster_id, region, token_id, outcome, reason, key_id, created_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?)`,
		cut(e.DeploymentID, 64), cut(e.ClusterID, 64), cut(e.Region, 64), cut(e.TokenID, 32), cut(e.Outcome, 16),
		cut(e.Reason, 512), cut(e.KeyID, 64), at.UnixMilli())
	if err != nil {
		return fmt.Errorf("store: record the vault audit of %s: %w", e.DeploymentID, err)
	}
	return nil
}

// VaultAudit returns up to limit entries, newest first: of one deployment,
// or of all when deploymentID is empty.
func (s *Store) VaultAudit(ctx context.Context, deploymentID string, limit int) ([]VaultAuditEntry, error) {
	q := "SELECT id, deployment_id, cluster_id, region, token_id, outcome, reason, key_id, created_at FROM vault_audit"
	var args []any
	if deploymentID != "" {
		q += " WHERE deployment_id = ?"
		args = append(args, deploymentID)
	}
	q += " ORDER BY id DESC LIMIT ?"
	rows, err := s.db.QueryContext(ctx, q, append(args, limit)...)
	if err != nil {
		return nil, fmt.Errorf("store: read the vault audit: %w", err)
	}
	defer rows.Close()
	var out []VaultAuditEntry
	for rows.Next() {
		var (
			e  VaultAuditEntry
			ms int64
		)
		if err := rows.Scan(&e.ID, &e.DeploymentID, &e.ClusterID, &e.Region, &e.TokenID, &e.Outcome, &e.Reason, &e.KeyID, &ms); err != nil {
			return nil, err
		}
		e.At = time.UnixMilli(ms).UTC()
		out = append(out, e)
	}
	return out, rows.Err()
}

// cut shortens s to at most n bytes of valid UTF-8.
func cut(s string, n int) string {
	s = strings.ToValidUTF8(s, "?")
	if len(s) <= n {
		return s
	}
	s = s[:n]
	for !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s
}

// ExpireVaultAudit deletes the audit rows created before cutoff, in
// batches (no long lock on the table), and returns how many.
func (s *Store) ExpireVaultAudit(ctx context.Context, cutoff time.Time) (int64, error) {
	var total int64
	for {
		res, err := s.db.ExecContext(ctx, "DELETE FROM vault_audit WHERE created_at < ? LIMIT 1000", cutoff.UnixMilli())
		if err != nil {
			return total, fmt.Errorf("store: delete vault audit rows before %s: %w", cutoff.Format(time.RFC3339), err)
		}
		n, _ := res.RowsAffected()
		total += n
		if n < 1000 {
			return total, nil
		}
	}
}
