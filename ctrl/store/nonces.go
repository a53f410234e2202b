package store

import (
	"context"
	"fmt"
	"time"
)

// UseCallNonce records that invocation invocationID used nonce, until
// expires. It reports false when another invocation used it already (the
// call is a replay); the same invocation using it again (Restate retrying
// it) is true. Expired nonces are deleted now and then, a few at a time.
func (s *Store) UseCallNonce(ctx context.Context, nonce, invocationID string, expires time.Time) (bool, error) {
	res, err := s.db.ExecContext(ctx, "INSERT IGNORE INTO restate_call_nonces (nonce, invocation_id, expires_at) VALUES (?, ?, ?)",
		nonce, invocationID, expires.UnixMilli())
	if err != nil {
		return false, fmt.Errorf("store: record the call nonce of invocation %s: %w", invocationID, err)
	}
	if h := s.testHooks(); h.AfterCommit != nil {
		// The INSERT is its own (autocommit) transaction: its answer can
		// be lost after it committed like any COMMIT's. The call's retry
		// finds the nonce used by its own invocation.
		if err := h.AfterCommit(ctx); err != nil {
			return false, fmt.Errorf("store: record the call nonce of invocation %s: commit: %w", invocationID, err)
		}
	}
	if n, err := res.RowsAffected(); err == nil && n == 1 {
		// About one call in sixteen sweeps expired nonces; the table holds
		// one window of calls.
		if nonce[len(nonce)-1] == '0' {
			if _, err := s.db.ExecContext(ctx, "DELETE FROM restate_call_nonces WHERE expires_at < ? LIMIT 1000", time.Now().UnixMilli()); err != nil {
				return false, fmt.Errorf("store: delete expired call nonces: %w", err)
			}
		}
		return true, nil
	}
	var by string
	if err := s.db.QueryRowContext(ctx, "SELECT invocation_id FROM restate_call_nonces WHERE nonce = ?", nonce).Scan(&by); err != nil {
		return false, fmt.Errorf("store: read the call nonce of invocation %s: %w", invocationID, err)
	}
	return by == invocationID, nil
}
