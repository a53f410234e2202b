package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// TokenKind is who a token belongs to.
type TokenKind string

const (
	// ClusterToken is a krane agent's credential, bound to a region and
	// cluster; it may only call the ClusterService.
	ClusterToken TokenKind = "cluster"
	// OperatorToken may only call the operator APIs (krane.ctrl.v1).
	OperatorToken TokenKind = "operator"
)

// Token is an API token as stored: never the secret, only its SHA-256.
type Token struct {
	ID         string
	Kind       TokenKind
	ClusterID  string // cluster tokens
	Region     string // cluster tokens
	Name       string // operator tokens
	SecretHash [32]byte
	CreatedAt  time.Time
	RevokedAt  time.Time // zero while valid
}

// Revoked reports whether the token was revoked.
func (t Token) Revoked() bool { return !t.RevokedAt.IsZero() }

// Cluster is a registered cluster.
type Cluster struct {
	ID              string
	Region          string
	CreatedAt       time.Time
	LastHeartbeatAt time.Time // zero before the first heartbeat
	AgentVersion    string
	Cursors         map[string]uint64
	ActiveTokens    int
}

// ErrClusterRegionConflict is returned when a cluster id is registered again
// in another region: a cluster's region never changes.
var ErrClusterRegionConflict = errors.New("the cluster is registered in another region")

// RegisterCluster records cluster clusterID in region (if new) and stores a
// cluster token for it, in one transaction. Registering an existing cluster
// again in the same region adds a token (for rotation); in another region it
// fails with ErrClusterRegionConflict.
func (s *Store) RegisterCluster(ctx context.Context, clusterID, region string, tok Token) error {
	_, err := s.WriteTx(ctx, func(ctx context.Context, tx *Tx) error {
		var existing string
		err := tx.QueryRow(ctx, "SELECT region FROM clusters WHERE id = ? FOR UPDATE", clusterID).Scan(&existing)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			if _, err := tx.Exec(ctx, "INSERT INTO clusters (id, region, created_at) VALUES (?, ?, ?)", clusterID, region, nowMillis()); err != nil {
				return fmt.Errorf("store: register cluster %s: %w", clusterID, err)
			}
		case err != nil:
			return fmt.Errorf("store: read cluster %s: %w", clusterID, err)
		case existing != region:
			return fmt.Errorf("store: cluster %s is in region %s, not %s: %w", clusterID, existing, region, ErrClusterRegionConflict)
		}
		tok.Kind, tok.ClusterID, tok.Region = ClusterToken, clusterID, region
		return insertToken(ctx, tx, tok)
	})
	return err
}

// CreateOperatorToken stores an operator token.
func (s *Store) CreateOperatorToken(ctx context.Context, tok Token) error {
	tok.Kind = OperatorToken
	_, err := s.WriteTx(ctx, func(ctx context.Context, tx *Tx) error { return insertToken(ctx, tx, tok) })
	return err
}

func insertToken(ctx context.Context, tx *Tx, t Token) error {
	created := t.CreatedAt
	if created.IsZero() {
		created = time.Now()
	}
	_, err := tx.Exec(ctx, "INSERT INTO api_tokens (id, kind, cluster_id, region, name, secret_hash, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
		t.ID, string(t.Kind), nullString(t.ClusterID), nullString(t.Region), t.Name, t.SecretHash[:], created.UnixMilli())
	if err != nil {
		return fmt.Errorf("store: store token %s: %w", t.ID, err)
	}
	return nil
}

// LookupToken returns the token with id, revoked or not; ErrNotFound if
// there is none.
func (s *Store) LookupToken(ctx context.Context, id string) (Token, error) {
	var (
		t               Token
		kind            string
		cluster, region sql.NullString
		hash            []byte
		created         int64
		revoked         sql.NullInt64
	)
	err := s.db.QueryRowContext(ctx, "SELECT id, kind, cluster_id, region, name, secret_hash, created_at, revoked_at FROM api_tokens WHERE id = ?", id).
		Scan(&t.ID, &kind, &cluster, &region, &t.Name, &hash, &created, &revoked)
	if errors.Is(err, sql.ErrNoRows) {
		return Token{}, ErrNotFound
	}
	if err != nil {
		return Token{}, fmt.Errorf("store: read token %s: %w", id, err)
	}
	if len(hash) != len(t.SecretHash) {
		return Token{}, fmt.Errorf("store: token %s has a malformed hash (%d bytes)", id, len(hash))
	}
	copy(t.SecretHash[:], hash)
	t.Kind, t.ClusterID, t.Region = TokenKind(kind), cluster.String, region.String
	t.CreatedAt = time.UnixMilli(created)
	if revoked.Valid {
		t.RevokedAt = time.UnixMilli(revoked.Int64)
	}
	return t, nil
}

// RevokeClusterTokens revokes every valid token of a cluster and returns how
// many it revoked; ErrNotFound if the cluster is not registered.
func (s *Store) RevokeClusterTokens(ctx context.Context, clusterID string) (int, error) {
	var n int64
	_, err := s.WriteTx(ctx, func(ctx context.Context, tx *Tx) error {
		var one int
		if err := tx.QueryRow(ctx, "SELECT 1 FROM clusters WHERE id = ?", clusterID).Scan(&one); errors.Is(err, sql.ErrNoRows) {
			return ErrNotFound
		} else if err != nil {
			return fmt.Errorf("store: read cluster %s: %w", clusterID, err)
		}
		res, err := tx.Exec(ctx, "UPDATE api_tokens SET revoked_at = ? WHERE cluster_id = ? AND kind = 'cluster' AND revoked_at IS NULL", nowMillis(), clusterID)
		if err != nil {
			return fmt.Errorf("store: revoke tokens of cluster %s: %w", clusterID, err)
		}
		n, _ = res.RowsAffected()
		return nil
	})
	return int(n), err
}

// ListClusters returns every registered cluster, by region and id.
func (s *Store) ListClusters(ctx context.Context) ([]Cluster, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT c.id, c.region, c.created_at, c.last_heartbeat_at, c.agent_version, c.cursors,
  (SELECT COUNT(*) FROM api_tokens t WHERE t.cluster_id = c.id AND t.kind = 'cluster' AND t.revoked_at IS NULL)
FROM clusters c ORDER BY c.region, c.id`)
	if err != nil {
		return nil, fmt.Errorf("store: list clusters: %w", err)
	}
	defer rows.Close()
	var out []Cluster
	for rows.Next() {
		var c Cluster
		var created, heartbeat int64
		var cursors []byte
		if err := rows.Scan(&c.ID, &c.Region, &created, &heartbeat, &c.AgentVersion, &cursors, &c.ActiveTokens); err != nil {
			return nil, err
		}
		c.CreatedAt = time.UnixMilli(created)
		if heartbeat > 0 {
			c.LastHeartbeatAt = time.UnixMilli(heartbeat)
		}
		if len(cursors) > 0 {
			_ = json.Unmarshal(cursors, &c.Cursors) // informational only
		}
		out = append(out, c)
	}
	return out, rows.Err()
}

// Heartbeat records that a cluster is alive, its agent version and cursors.
func (s *Store) Heartbeat(ctx context.Context, clusterID, region, agentVersion string, cursors map[string]uint64) error {
	if cursors == nil {
		cursors = map[string]uint64{}
	}
	raw, _ := json.Marshal(cursors)
	res, err := s.db.ExecContext(ctx, "UPDATE clusters SET last_heartbeat_at = ?, agent_version = ?, cursors = ? WHERE id = ? AND region = ?",
		nowMillis(), agentVersion, string(raw), clusterID, region)
	if err != nil {
		return fmt.Errorf("store: record heartbeat of cluster %s: %w", clusterID, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("store: heartbeat of cluster %s in %s: %w", clusterID, region, ErrNotFound)
	}
	return nil
}
