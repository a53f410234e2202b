package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"krane.dev/shared/kinds"
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
	ClusterID  string   // cluster tokens
	Region     string   // cluster tokens
	Name       string   // operator tokens
	SecretHash [32]byte // only from LookupToken
	CreatedAt  time.Time
	ExpiresAt  time.Time // zero: never expires
	RevokedAt  time.Time // zero while valid
}

// Revoked reports whether the token was revoked.
func (t Token) Revoked() bool { return !t.RevokedAt.IsZero() }

// Expired reports whether the token has expired at now.
func (t Token) Expired(now time.Time) bool { return !t.ExpiresAt.IsZero() && !now.Before(t.ExpiresAt) }

// Valid reports whether the token is neither revoked nor expired at now.
func (t Token) Valid(now time.Time) bool { return !t.Revoked() && !t.Expired(now) }

// Cluster is a registered cluster.
type Cluster struct {
	ID              string
	Region          string
	CreatedAt       time.Time
	LastHeartbeatAt time.Time // zero before the first heartbeat
	AgentVersion    string
	Cursors         map[string]uint64
	ActiveTokens    int // neither revoked nor expired
	// Host is what the cluster's host last reported of its controllers
	// and parked objects; nil when its heartbeats do not report them (an
	// older host, or no heartbeat yet).
	Host *HostReport
}

// ErrClusterRegionConflict is returned when a cluster id is registered again
// in another region: a cluster's region never changes.
var ErrClusterRegionConflict = errors.New("the cluster is registered in another region")

// RegisterCluster records cluster clusterID in region (if new) and stores a
// cluster token for it, in one transaction. Registering an existing cluster
// again in the same region adds a token (for rotation); in another region it
// fails with ErrClusterRegionConflict.
func (s *Store) RegisterCluster(ctx context.Context, clusterID, region string, tok Token) error {
	_, err := s.WriteTxAlone(ctx, func(ctx context.Context, tx *Tx) error {
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

// ClusterRegistration is one cluster of a bulk registration and the token
// it gets.
type ClusterRegistration struct {
	ClusterID, Region string
	Token             Token
}

// RegisterClusters is RegisterCluster for many clusters at once: one
// transaction, a few statements per 500 clusters. It registers all of them
// or none: a cluster registered in another region fails the whole call
// with ErrClusterRegionConflict (naming every such cluster), and so does a
// cluster listed twice.
func (s *Store) RegisterClusters(ctx context.Context, regs []ClusterRegistration) error {
	seen := make(map[string]bool, len(regs))
	for _, r := range regs {
		if seen[r.ClusterID] {
			return fmt.Errorf("store: cluster %s is listed twice; register each cluster once (registering it again later adds a token)", r.ClusterID)
		}
		seen[r.ClusterID] = true
	}
	const chunk = 500
	_, err := s.WriteTxAlone(ctx, func(ctx context.Context, tx *Tx) error {
		var conflicts []string
		now := nowMillis()
		for start := 0; start < len(regs); start += chunk {
			part := regs[start:min(start+chunk, len(regs))]
			args := make([]any, len(part))
			for i, r := range part {
				args[i] = r.ClusterID
			}
			rows, err := tx.Query(ctx, "SELECT id, region FROM clusters WHERE id IN ("+placeholders(len(part))+") FOR UPDATE", args...)
			if err != nil {
				return fmt.Errorf("store: read %d clusters (first %s): %w", len(part), part[0].ClusterID, err)
			}
			existing := map[string]string{}
			for rows.Next() {
				var id, region string
				if err := rows.Scan(&id, &region); err != nil {
					rows.Close()
					return err
				}
				existing[id] = region
			}
			rows.Close()
			if err := rows.Err(); err != nil {
				return err
			}
			var clusterArgs, tokenArgs []any
			nTokens := 0
			for _, r := range part {
				region, ok := existing[r.ClusterID]
				switch {
				case !ok:
					clusterArgs = append(clusterArgs, r.ClusterID, r.Region, now)
				case region != r.Region:
					conflicts = append(conflicts, fmt.Sprintf("%s (in %s, not %s)", r.ClusterID, region, r.Region))
					continue
				}
				t := r.Token
				t.Kind, t.ClusterID, t.Region = ClusterToken, r.ClusterID, r.Region
				tokenArgs = append(tokenArgs, tokenRow(t)...)
				nTokens++
			}
			if len(conflicts) > 0 {
				continue // fail below, naming them all
			}
			if n := len(clusterArgs) / 3; n > 0 {
				if _, err := tx.Exec(ctx, "INSERT INTO clusters (id, region, created_at) VALUES "+rowGroups(n, 3), clusterArgs...); err != nil {
					return fmt.Errorf("store: register %d clusters (first %s): %w", n, part[0].ClusterID, err)
				}
			}
			if nTokens > 0 {
				if _, err := tx.Exec(ctx, "INSERT INTO api_tokens ("+tokenInsertColumns+") VALUES "+rowGroups(nTokens, tokenInsertArity), tokenArgs...); err != nil {
					return fmt.Errorf("store: store %d cluster tokens (first cluster %s): %w", nTokens, part[0].ClusterID, err)
				}
			}
		}
		if n := len(conflicts); n > 0 {
			if n > 20 {
				conflicts = append(conflicts[:20], fmt.Sprintf("and %d more", n-20))
			}
			return fmt.Errorf("store: %d clusters are registered in another region, nothing was registered: %s: %w",
				n, strings.Join(conflicts, ", "), ErrClusterRegionConflict)
		}
		return nil
	})
	return err
}

// rowGroups is "(?, ?), (?, ?)" for n rows of arity columns.
func rowGroups(n, arity int) string {
	group := "(" + placeholders(arity) + ")"
	return group + strings.Repeat(", "+group, n-1)
}

// CreateOperatorToken stores an operator token.
func (s *Store) CreateOperatorToken(ctx context.Context, tok Token) error {
	tok.Kind = OperatorToken
	_, err := s.WriteTxAlone(ctx, func(ctx context.Context, tx *Tx) error { return insertToken(ctx, tx, tok) })
	return err
}

// tokenInsertColumns are the columns tokenRow gives values for.
const (
	tokenInsertColumns = "id, kind, cluster_id, region, name, secret_hash, created_at, expires_at"
	tokenInsertArity   = 8
)

// tokenRow is a token's values for tokenInsertColumns.
func tokenRow(t Token) []any {
	created := t.CreatedAt
	if created.IsZero() {
		created = time.Now()
	}
	var expires sql.NullInt64
	if !t.ExpiresAt.IsZero() {
		expires = sql.NullInt64{Int64: t.ExpiresAt.UnixMilli(), Valid: true}
	}
	return []any{t.ID, string(t.Kind), nullString(t.ClusterID), nullString(t.Region), t.Name, t.SecretHash[:], created.UnixMilli(), expires}
}

func insertToken(ctx context.Context, tx *Tx, t Token) error {
	_, err := tx.Exec(ctx, "INSERT INTO api_tokens ("+tokenInsertColumns+") VALUES ("+placeholders(tokenInsertArity)+")", tokenRow(t)...)
	if err != nil {
		return fmt.Errorf("store: store token %s: %w", t.ID, err)
	}
	return nil
}

// tokenColumns are the columns scanToken reads; tokenColumnsWithHash adds
// secret_hash.
const (
	tokenColumns         = "id, kind, cluster_id, region, name, created_at, expires_at, revoked_at"
	tokenColumnsWithHash = tokenColumns + ", secret_hash"
)

// scanToken reads one row of tokenColumns, or of tokenColumnsWithHash when
// withHash is set.
func scanToken(row interface{ Scan(...any) error }, withHash bool) (Token, error) {
	var (
		t                Token
		kind             string
		cluster, region  sql.NullString
		hash             []byte
		created          int64
		expires, revoked sql.NullInt64
	)
	dest := []any{&t.ID, &kind, &cluster, &region, &t.Name, &created, &expires, &revoked}
	if withHash {
		dest = append(dest, &hash)
	}
	if err := row.Scan(dest...); err != nil {
		return Token{}, err
	}
	if withHash {
		if len(hash) != len(t.SecretHash) {
			return Token{}, fmt.Errorf("store: token %s has a malformed hash (%d bytes)", t.ID, len(hash))
		}
		copy(t.SecretHash[:], hash)
	}
	t.Kind, t.ClusterID, t.Region = TokenKind(kind), cluster.String, region.String
	t.CreatedAt = time.UnixMilli(created)
	if expires.Valid {
		t.ExpiresAt = time.UnixMilli(expires.Int64)
	}
	if revoked.Valid {
		t.RevokedAt = time.UnixMilli(revoked.Int64)
	}
	return t, nil
}

// LookupToken returns the token with id, revoked or not; ErrNotFound if
// there is none.
func (s *Store) LookupToken(ctx context.Context, id string) (Token, error) {
	t, err := scanToken(s.db.QueryRowContext(ctx, "SELECT "+tokenColumnsWithHash+" FROM api_tokens WHERE id = ?", id), true)
	if errors.Is(err, sql.ErrNoRows) {
		return Token{}, ErrNotFound
	}
	if err != nil {
		return Token{}, fmt.Errorf("store: read token %s: %w", id, err)
	}
	return t, nil
}

// LookupTokens returns the tokens among ids that exist, revoked or not, in
// no particular order. An id with no token is simply missing from the
// result.
func (s *Store) LookupTokens(ctx context.Context, ids []string) ([]Token, error) {
	const chunk = 500
	var out []Token
	for len(ids) > 0 {
		n := min(len(ids), chunk)
		args := make([]any, n)
		for i, id := range ids[:n] {
			args[i] = id
		}
		ids = ids[n:]
		toks, err := s.queryTokens(ctx, false, "SELECT "+tokenColumns+" FROM api_tokens WHERE id IN ("+placeholders(n)+")", args...)
		if err != nil {
			return nil, err
		}
		out = append(out, toks...)
	}
	return out, nil
}

// ListTokens returns every token, valid, expired or revoked, oldest first.
// It never returns secret hashes.
func (s *Store) ListTokens(ctx context.Context) ([]Token, error) {
	return s.queryTokens(ctx, false, "SELECT "+tokenColumns+" FROM api_tokens ORDER BY created_at, id")
}

// RevokedTokensSince returns the tokens revoked at or after since (by the
// revoked_at the revoker stamped), oldest revocation first, without
// secret hashes.
func (s *Store) RevokedTokensSince(ctx context.Context, since time.Time) ([]Token, error) {
	return s.queryTokens(ctx, false, "SELECT "+tokenColumns+" FROM api_tokens WHERE revoked_at >= ? ORDER BY revoked_at, id", since.UnixMilli())
}

func (s *Store) queryTokens(ctx context.Context, withHash bool, query string, args ...any) ([]Token, error) {
	rows, err := s.db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("store: read tokens: %w", err)
	}
	defer rows.Close()
	var out []Token
	for rows.Next() {
		t, err := scanToken(rows, withHash)
		if err != nil {
			return nil, fmt.Errorf("store: read tokens: %w", err)
		}
		out = append(out, t)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: read tokens: %w", err)
	}
	return out, nil
}

// RevokeToken revokes the token with id and returns it as stored
// afterwards. revokedNow is false when it was revoked already (its
// RevokedAt is then the first revocation's). ErrNotFound if there is no
// such token.
func (s *Store) RevokeToken(ctx context.Context, id string) (tok Token, revokedNow bool, err error) {
	_, err = s.WriteTxAlone(ctx, func(ctx context.Context, tx *Tx) error {
		t, err := scanToken(tx.QueryRow(ctx, "SELECT "+tokenColumns+" FROM api_tokens WHERE id = ? FOR UPDATE", id), false)
		if errors.Is(err, sql.ErrNoRows) {
			return ErrNotFound
		}
		if err != nil {
			return fmt.Errorf("store: read token %s: %w", id, err)
		}
		if t.Revoked() {
			tok, revokedNow = t, false
			return nil
		}
		now := nowMillis()
		if _, err := tx.Exec(ctx, "UPDATE api_tokens SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL", now, id); err != nil {
			return fmt.Errorf("store: revoke token %s: %w", id, err)
		}
		t.RevokedAt = time.UnixMilli(now)
		tok, revokedNow = t, true
		return nil
	})
	if err != nil {
		return Token{}, false, err
	}
	return tok, revokedNow, nil
}

// RevokeClusterTokens revokes every valid token of a cluster and returns how
// many it revoked; ErrNotFound if the cluster is not registered.
func (s *Store) RevokeClusterTokens(ctx context.Context, clusterID string) (int, error) {
	var n int64
	_, err := s.WriteTxAlone(ctx, func(ctx context.Context, tx *Tx) error {
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
	rows, err := s.db.QueryContext(ctx, `SELECT c.id, c.region, c.created_at, c.last_heartbeat_at, c.agent_version, c.cursors, c.controllers, c.parked,
  (SELECT COUNT(*) FROM api_tokens t WHERE t.cluster_id = c.id AND t.kind = 'cluster' AND t.revoked_at IS NULL
     AND (t.expires_at IS NULL OR t.expires_at > ?))
FROM clusters c ORDER BY c.region, c.id`, nowMillis())
	if err != nil {
		return nil, fmt.Errorf("store: list clusters: %w", err)
	}
	defer rows.Close()
	var out []Cluster
	for rows.Next() {
		var c Cluster
		var created, heartbeat int64
		var cursors, controllers, parked []byte
		if err := rows.Scan(&c.ID, &c.Region, &created, &heartbeat, &c.AgentVersion, &cursors, &controllers, &parked, &c.ActiveTokens); err != nil {
			return nil, fmt.Errorf("store: list clusters: %w", err)
		}
		c.CreatedAt = time.UnixMilli(created)
		if heartbeat > 0 {
			c.LastHeartbeatAt = time.UnixMilli(heartbeat)
		}
		// The JSON columns are written only by Heartbeat from typed
		// values; a row that does not parse is shown as not reported
		// rather than failing the whole list.
		if len(cursors) > 0 {
			_ = json.Unmarshal(cursors, &c.Cursors)
		}
		if controllers != nil {
			h := &HostReport{}
			if json.Unmarshal(controllers, &h.Controllers) == nil && (parked == nil || json.Unmarshal(parked, &h.Parked) == nil) {
				c.Host = h
			}
		}
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: list clusters: %w", err)
	}
	return out, nil
}

// HeartbeatData is what one heartbeat of a cluster says.
type HeartbeatData struct {
	AgentVersion string
	Cursors      map[string]uint64
	// Host is nil for a host that does not report its controllers.
	Host *HostReport
}

// HostReport is what a host says of itself in its heartbeats.
type HostReport struct {
	Controllers []ControllerStatus `json:"controllers"`
	// Parked objects by kind.
	Parked map[string]int `json:"parked,omitempty"`
}

// ControllerStatus is one controller a host runs (or fails to run).
type ControllerStatus struct {
	Name          string   `json:"name"`
	PluginVersion string   `json:"plugin_version,omitempty"`
	Kinds         []string `json:"kinds,omitempty"`
	Running       bool     `json:"running"`
	LastError     string   `json:"last_error,omitempty"`
}

// Serves reports whether a controller the host has enabled reconciles
// kind, and whether one that does runs now. A controller serves the kinds
// it last described, or, while it has never started (a pin refused, a
// first start failed), the kind of its built-in name. This is the one rule
// of who serves a kind: the aggregation rule counts a live cluster that
// serves the kind, running or not (one whose controller is down has not
// applied what it should: its region waits, RuleCluster), and a deploy is
// refused at once where no live cluster runs one (fleetapi.CheckServed).
func (h *HostReport) Serves(kind string) (serves, running bool) {
	if h == nil {
		return false, false
	}
	for _, c := range h.Controllers {
		if slices.Contains(c.Kinds, kind) || len(c.Kinds) == 0 && kinds.OfBuiltInController(c.Name) == kind {
			serves = true
			running = running || c.Running
		}
	}
	return serves, running
}

// Owns reports whether a running controller of the host reconciles kind.
func (h *HostReport) Owns(kind string) bool {
	_, running := h.Serves(kind)
	return running
}

// Heartbeat records that a cluster is alive, its agent version, cursors
// and, when hb.Host is set, its controllers and parked objects
// (Heartbeats of one cluster).
func (s *Store) Heartbeat(ctx context.Context, clusterID, region string, hb HeartbeatData) error {
	errs, err := s.Heartbeats(ctx, []ClusterHeartbeat{{ClusterID: clusterID, Region: region, Data: hb}})
	if err != nil {
		return err
	}
	return errs[0]
}

// ClusterHeartbeat is one cluster's heartbeat.
type ClusterHeartbeat struct {
	ClusterID, Region string
	Data              HeartbeatData
}

// heartbeatsPerStatement bounds one UPDATE (a CASE branch per heartbeat
// and column, evaluated per row: the cost grows with its square);
// statementBytes bounds what it carries.
const heartbeatsPerStatement = 500

// Heartbeats records the heartbeats of many clusters with one UPDATE of
// their rows per 500 clusters (or per 4 MiB of what they carry). It answers each
// heartbeat with nil or ErrNotFound (the cluster is not registered in its
// region); the error is the batch's own. A cluster named twice keeps its
// later heartbeat.
func (s *Store) Heartbeats(ctx context.Context, hbs []ClusterHeartbeat) ([]error, error) {
	return heartbeats(ctx, s.ingest, hbs)
}

// ErrClusterBusy answers a heartbeat that HeartbeatsUnlessBusy did not
// write because another transaction holds its cluster's row: a report
// batch of that cluster (Ingest locks the reporting clusters' rows in
// share mode until it commits). Write it again later.
var ErrClusterBusy = errors.New("the cluster's row is held by another transaction (a batch of its reports)")

// HeartbeatsUnlessBusy is Heartbeats for the rows nobody holds: in one
// transaction it locks the heartbeats' cluster rows that are free
// (FOR UPDATE SKIP LOCKED) and updates those, and answers the others
// with ErrClusterBusy (or ErrNotFound, for a cluster not registered in
// its region), never waiting for a lock. A heartbeat batch of every
// cluster must not wait behind the report batch of any one of them, nor
// make the next report batch wait behind it.
func (s *Store) HeartbeatsUnlessBusy(ctx context.Context, hbs []ClusterHeartbeat) ([]error, error) {
	results := make([]error, len(hbs))
	if len(hbs) == 0 {
		return results, nil
	}
	ids := distinct(hbs, func(h ClusterHeartbeat) string { return h.ClusterID })
	tx, err := s.ingest.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("store: begin a heartbeat transaction: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	free, err := clusterRegions(ctx, tx, ids, " FOR UPDATE SKIP LOCKED")
	if err != nil {
		return nil, fmt.Errorf("store: lock the rows of %d clusters that sent heartbeats: %w", len(ids), err)
	}
	var held []any
	for _, id := range ids {
		if _, ok := free[id.(string)]; !ok {
			held = append(held, id)
		}
	}
	// A row SKIP LOCKED did not return is held or absent: a consistent
	// (non-locking) read tells which.
	busy, err := clusterRegions(ctx, tx, held, "")
	if err != nil {
		return nil, fmt.Errorf("store: read the rows of %d clusters that sent heartbeats: %w", len(held), err)
	}
	var write []ClusterHeartbeat
	var at []int
	for i, hb := range hbs {
		if _, ok := free[hb.ClusterID]; ok {
			write, at = append(write, hb), append(at, i)
		} else if region, ok := busy[hb.ClusterID]; ok && region == hb.Region {
			results[i] = fmt.Errorf("store: heartbeat of cluster %s in %s: %w", hb.ClusterID, hb.Region, ErrClusterBusy)
		} else {
			results[i] = fmt.Errorf("store: heartbeat of cluster %s in %s: %w", hb.ClusterID, hb.Region, ErrNotFound)
		}
	}
	written, err := heartbeats(ctx, tx, write)
	if err != nil {
		return nil, err
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("store: commit the heartbeats of %d clusters: %w", len(write), err)
	}
	for j, i := range at {
		results[i] = written[j]
	}
	return results, nil
}

// clusterRegions reads the region of each of ids that has a row, with
// lock appended to the query.
func clusterRegions(ctx context.Context, q queryer, ids []any, lock string) (map[string]string, error) {
	out := make(map[string]string, len(ids))
	for len(ids) > 0 {
		part := ids[:min(len(ids), heartbeatsPerStatement)]
		ids = ids[len(part):]
		rows, err := q.QueryContext(ctx, "SELECT id, region FROM clusters WHERE id IN ("+placeholders(len(part))+")"+lock, part...)
		if err != nil {
			return nil, err
		}
		for rows.Next() {
			var id, region string
			if err := rows.Scan(&id, &region); err != nil {
				rows.Close()
				return nil, err
			}
			out[id] = region
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// queryer is a *sql.DB or a *sql.Tx.
type queryer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

func heartbeats(ctx context.Context, db queryer, hbs []ClusterHeartbeat) ([]error, error) {
	results := make([]error, len(hbs))
	last := map[string]int{}
	for i, hb := range hbs {
		last[hb.ClusterID] = i
	}
	now := nowMillis()
	var idx []int
	for i, hb := range hbs {
		if last[hb.ClusterID] == i {
			idx = append(idx, i)
		}
	}
	type encoded struct {
		cursors             string
		controllers, parked sql.NullString
	}
	enc := make(map[int]encoded, len(idx))
	for _, i := range idx {
		cursors, controllers, parked, err := heartbeatColumns(hbs[i].Data)
		if err != nil {
			return nil, fmt.Errorf("store: heartbeat of cluster %s: %w", hbs[i].ClusterID, err)
		}
		enc[i] = encoded{cursors, controllers, parked}
	}
	size := func(i int) int {
		e := enc[i]
		return len(e.cursors) + len(e.controllers.String) + len(e.parked.String) + 256
	}
	for _, part := range chunks(idx, heartbeatsPerStatement, size) {
		// One CASE per column keyed by id: no derived table, so the
		// server needs no temporary table for the batch's values.
		cases := func(value func(int) any) (string, []any) {
			var b strings.Builder
			var args []any
			b.WriteString("CASE id")
			for _, i := range part {
				b.WriteString(" WHEN ? THEN ?")
				args = append(args, hbs[i].ClusterID, value(i))
			}
			b.WriteString(" END")
			return b.String(), args
		}
		var sets []string
		args := []any{now}
		for _, col := range []struct {
			name  string
			value func(int) any
		}{
			{"agent_version", func(i int) any { return hbs[i].Data.AgentVersion }},
			{"cursors", func(i int) any { return enc[i].cursors }},
			{"controllers", func(i int) any { return enc[i].controllers }},
			{"parked", func(i int) any { return enc[i].parked }},
		} {
			c, a := cases(col.value)
			sets, args = append(sets, col.name+" = "+c), append(args, a...)
		}
		for _, i := range part {
			args = append(args, hbs[i].ClusterID)
		}
		region, regionArgs := cases(func(i int) any { return hbs[i].Region })
		args = append(args, regionArgs...)
		res, err := db.ExecContext(ctx, "UPDATE clusters SET last_heartbeat_at = ?, "+strings.Join(sets, ", ")+
			" WHERE id IN ("+placeholders(len(part))+") AND region = "+region, args...)
		if err != nil {
			return nil, fmt.Errorf("store: record the heartbeats of %d clusters (first %s): %w", len(part), hbs[part[0]].ClusterID, err)
		}
		if n, _ := res.RowsAffected(); int(n) == len(part) {
			continue
		}
		// Some are not registered (in their region): find which.
		ids := make([]any, len(part))
		for n, i := range part {
			ids[n] = hbs[i].ClusterID
		}
		rows, err := db.QueryContext(ctx, "SELECT id, region FROM clusters WHERE id IN ("+placeholders(len(ids))+")", ids...)
		if err != nil {
			return nil, fmt.Errorf("store: read %d clusters that sent heartbeats: %w", len(ids), err)
		}
		known := map[string]string{}
		for rows.Next() {
			var id, region string
			if err := rows.Scan(&id, &region); err != nil {
				rows.Close()
				return nil, err
			}
			known[id] = region
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, err
		}
		for _, i := range part {
			if region, ok := known[hbs[i].ClusterID]; !ok || region != hbs[i].Region {
				results[i] = fmt.Errorf("store: heartbeat of cluster %s in %s: %w", hbs[i].ClusterID, hbs[i].Region, ErrNotFound)
			}
		}
	}
	for i, hb := range hbs {
		if j := last[hb.ClusterID]; j != i {
			results[i] = results[j]
		}
	}
	return results, nil
}

// heartbeatColumns encodes what a heartbeat stores in the cluster's JSON
// columns; controllers and parked are NULL when it does not report them.
func heartbeatColumns(hb HeartbeatData) (string, sql.NullString, sql.NullString, error) {
	cursors := hb.Cursors
	if cursors == nil {
		cursors = map[string]uint64{}
	}
	raw, err := json.Marshal(cursors)
	if err != nil {
		return "", sql.NullString{}, sql.NullString{}, fmt.Errorf("encode cursors: %w", err)
	}
	var controllers, parked sql.NullString
	if h := hb.Host; h != nil {
		list := h.Controllers
		if list == nil {
			list = []ControllerStatus{}
		}
		b, err := json.Marshal(list)
		if err != nil {
			return "", sql.NullString{}, sql.NullString{}, fmt.Errorf("encode controllers: %w", err)
		}
		controllers = sql.NullString{String: string(b), Valid: true}
		p := h.Parked
		if p == nil {
			p = map[string]int{}
		}
		if b, err = json.Marshal(p); err != nil {
			return "", sql.NullString{}, sql.NullString{}, fmt.Errorf("encode parked counts: %w", err)
		}
		parked = sql.NullString{String: string(b), Valid: true}
	}
	return string(raw), controllers, parked, nil
}

// RecordAgentVersion stores the version a cluster's host runs without
// counting it as a heartbeat: ctrl refuses hosts outside its skew window
// (docs/compatibility.md), and the fleet views still show what they run.
func (s *Store) RecordAgentVersion(ctx context.Context, clusterID, region, version string) error {
	if _, err := s.db.ExecContext(ctx, "UPDATE clusters SET agent_version = ? WHERE id = ? AND region = ?", version, clusterID, region); err != nil {
		return fmt.Errorf("store: record the agent version of cluster %s: %w", clusterID, err)
	}
	return nil
}
