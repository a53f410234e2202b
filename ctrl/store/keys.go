package store

import (
	"context"
	"crypto/rand"
	"fmt"
)

// RestateIngressKey names the key that signs ctrl's calls through
// Restate's ingress (see ctrl/workflows, CtrlIngress).
const RestateIngressKey = "restate-ingress"

// CtrlKey returns the secret stored under name (32 random bytes), creating
// it when there is none. Every ctrl on the database gets the same one:
// concurrent creators race on the primary key and all read the winner's.
func (s *Store) CtrlKey(ctx context.Context, name string) ([]byte, error) {
	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		return nil, fmt.Errorf("store: create key %s: %w", name, err)
	}
	if _, err := s.db.ExecContext(ctx, "INSERT IGNORE INTO ctrl_keys (name, secret, created_at) VALUES (?, ?, ?)", name, secret, nowMillis()); err != nil {
		return nil, fmt.Errorf("store: create key %s: %w (was `ctrl admin migrate` run?)", name, err)
	}
	var stored []byte
	if err := s.db.QueryRowContext(ctx, "SELECT secret FROM ctrl_keys WHERE name = ?", name).Scan(&stored); err != nil {
		return nil, fmt.Errorf("store: read key %s: %w", name, err)
	}
	return stored, nil
}
