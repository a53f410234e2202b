package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// ConsoleSession is a signed-in browser of the web console, as every ctrl
// replica sees it. IDHash is the SHA-256 of the secret in the browser's
// cookie; the secret itself is never stored. SealedToken is the operator
// token the session calls the API with, sealed with a key derived from
// that secret (ctrl/console), so this row alone reveals no token.
type ConsoleSession struct {
	IDHash      []byte
	TokenID     string
	SealedToken []byte
	// A message the session's next page shows once.
	FlashKind, FlashText string
	CreatedAt, ExpiresAt time.Time
}

// MaxConsoleFlash bounds a flash message (the column's size).
const MaxConsoleFlash = 2048

// CreateConsoleSession stores a new session. Expired sessions are deleted
// first; past perToken sessions of its token, that token's oldest end, and
// past max sessions in all, the oldest of any. So one operator signing in
// over and over ends only its own sessions: it takes at most perToken of
// the max.
func (s *Store) CreateConsoleSession(ctx context.Context, cs ConsoleSession, max, perToken int) error {
	now := time.Now().UnixMilli()
	if _, err := s.db.ExecContext(ctx, "DELETE FROM console_sessions WHERE expires_at <= ? LIMIT 1000", now); err != nil {
		return fmt.Errorf("store: delete expired console sessions: %w", err)
	}
	var mine int
	if err := s.db.QueryRowContext(ctx, "SELECT COUNT(*) FROM console_sessions WHERE token_id = ?", cs.TokenID).Scan(&mine); err != nil {
		return fmt.Errorf("store: count the console sessions of token %s: %w", cs.TokenID, err)
	}
	if over := mine - perToken + 1; over > 0 {
		if _, err := s.db.ExecContext(ctx, "DELETE FROM console_sessions WHERE token_id = ? ORDER BY created_at LIMIT ?", cs.TokenID, over); err != nil {
			return fmt.Errorf("store: end the oldest console sessions of token %s: %w", cs.TokenID, err)
		}
	}
	var n int
	if err := s.db.QueryRowContext(ctx, "SELECT COUNT(*) FROM console_sessions").Scan(&n); err != nil {
		return fmt.Errorf("store: count console sessions: %w", err)
	}
	if over := n - max + 1; over > 0 {
		if _, err := s.db.ExecContext(ctx, "DELETE FROM console_sessions ORDER BY created_at LIMIT ?", over); err != nil {
			return fmt.Errorf("store: end the oldest console sessions: %w", err)
		}
	}
	_, err := s.db.ExecContext(ctx, `INSERT INTO console_sessions (id_hash, token_id, sealed_token, created_at, expires_at) VALUES (?, ?, ?, ?, ?)`,
		cs.IDHash, cs.TokenID, cs.SealedToken, cs.CreatedAt.UnixMilli(), cs.ExpiresAt.UnixMilli())
	if err != nil {
		return fmt.Errorf("store: create a console session of token %s: %w", cs.TokenID, err)
	}
	return nil
}

// GetConsoleSession returns the session whose cookie secret hashes to
// idHash; ErrNotFound when there is none or it expired.
func (s *Store) GetConsoleSession(ctx context.Context, idHash []byte) (ConsoleSession, error) {
	cs := ConsoleSession{IDHash: idHash}
	var created, expires int64
	err := s.db.QueryRowContext(ctx, `SELECT token_id, sealed_token, flash_kind, flash_text, created_at, expires_at
FROM console_sessions WHERE id_hash = ? AND expires_at > ?`, idHash, time.Now().UnixMilli()).
		Scan(&cs.TokenID, &cs.SealedToken, &cs.FlashKind, &cs.FlashText, &created, &expires)
	if errors.Is(err, sql.ErrNoRows) {
		return cs, ErrNotFound
	}
	if err != nil {
		return cs, fmt.Errorf("store: read a console session: %w", err)
	}
	cs.CreatedAt, cs.ExpiresAt = time.UnixMilli(created), time.UnixMilli(expires)
	return cs, nil
}

// EndConsoleSession deletes a session (signed out, or its token refused).
func (s *Store) EndConsoleSession(ctx context.Context, idHash []byte) error {
	if _, err := s.db.ExecContext(ctx, "DELETE FROM console_sessions WHERE id_hash = ?", idHash); err != nil {
		return fmt.Errorf("store: end a console session: %w", err)
	}
	return nil
}

// SetConsoleFlash sets the message the session's next page shows, cut to
// MaxConsoleFlash characters.
func (s *Store) SetConsoleFlash(ctx context.Context, idHash []byte, kind, text string) error {
	if _, err := s.db.ExecContext(ctx, "UPDATE console_sessions SET flash_kind = ?, flash_text = ? WHERE id_hash = ?",
		cut(kind, 8), cut(text, MaxConsoleFlash), idHash); err != nil {
		return fmt.Errorf("store: set a console session's message: %w", err)
	}
	return nil
}

// ClearConsoleFlash removes the session's message once a page showed it.
func (s *Store) ClearConsoleFlash(ctx context.Context, idHash []byte) error {
	if _, err := s.db.ExecContext(ctx, "UPDATE console_sessions SET flash_kind = '', flash_text = '' WHERE id_hash = ?", idHash); err != nil {
		return fmt.Errorf("store: clear a console session's message: %w", err)
	}
	return nil
}

// CountConsoleSessions is how many sessions have not expired.
func (s *Store) CountConsoleSessions(ctx context.Context) (int, error) {
	var n int
	if err := s.db.QueryRowContext(ctx, "SELECT COUNT(*) FROM console_sessions WHERE expires_at > ?", time.Now().UnixMilli()).Scan(&n); err != nil {
		return 0, fmt.Errorf("store: count console sessions: %w", err)
	}
	return n, nil
}
