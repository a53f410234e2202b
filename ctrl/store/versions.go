package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sort"
	"time"
)

// Stamped is a row and the version it was given.
type Stamped struct {
	Ref
	Version uint64
}

// Tx is a write transaction. Write content through its methods (or Exec),
// and call Touch for every desired-state row whose content changed; WriteTx
// stamps the touched rows with new versions as its last step.
type Tx struct {
	tx      *sql.Tx
	touched []Ref
	seen    map[Ref]bool
}

// Touch marks a desired-state row as changed in this transaction, so it gets
// a new version at commit. Touching a row twice gives it one version. The
// row must exist when the transaction stamps.
func (t *Tx) Touch(kind, region, id string) {
	r := Ref{Kind: kind, Region: region, ID: id}
	if t.seen[r] {
		return
	}
	if t.seen == nil {
		t.seen = map[Ref]bool{}
	}
	t.seen[r] = true
	t.touched = append(t.touched, r)
}

// Exec runs a statement in the transaction.
func (t *Tx) Exec(ctx context.Context, query string, args ...any) (sql.Result, error) {
	return t.tx.ExecContext(ctx, query, args...)
}

// QueryRow runs a query that returns at most one row in the transaction.
func (t *Tx) QueryRow(ctx context.Context, query string, args ...any) *sql.Row {
	return t.tx.QueryRowContext(ctx, query, args...)
}

// Query runs a query in the transaction.
func (t *Tx) Query(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	return t.tx.QueryContext(ctx, query, args...)
}

// TestHooks are switches for the tests of the versioning design. Production
// code never sets them.
type TestHooks struct {
	// AfterStamp runs after the versions are assigned and before COMMIT,
	// inside the transaction (to widen the window between the two).
	AfterStamp func(ctx context.Context, stamped []Stamped)
	// AfterCommit runs after a write transaction (WriteTx, StampCommitted)
	// committed. An error it returns is what the call returns, as
	// "store: commit: <err>": a commit whose answer was lost (the
	// connection broke after the server committed). Exists to prove the
	// callers survive an ambiguous commit.
	AfterCommit func(ctx context.Context) error
	// Now is the clock of the report guards (time.Now when nil).
	Now func() time.Time
	// UnsafeAllocator takes versions from a separate autocommit increment of
	// version_seq instead of holding its lock until commit: the reference
	// platform's bug, under which a lower version can commit after a higher
	// one has been streamed. Exists only to prove the tests catch that.
	UnsafeAllocator bool
}

// SetTestHooks installs test hooks (see TestHooks).
func (s *Store) SetTestHooks(h TestHooks) {
	s.hooksMu.Lock()
	defer s.hooksMu.Unlock()
	s.hooks = h
}

func (s *Store) testHooks() TestHooks {
	s.hooksMu.RLock()
	defer s.hooksMu.RUnlock()
	return s.hooks
}

// maxTxAttempts bounds retries of a transaction that hit a deadlock or a
// lock wait timeout.
const maxTxAttempts = 5

// WriteTx runs fn in a transaction, then stamps every row fn touched with a
// new version and commits. fn may run more than once (the transaction is
// retried after a deadlock), so it must only write through tx. It returns
// the versions given, in the order the rows were first touched.
func (s *Store) WriteTx(ctx context.Context, fn func(ctx context.Context, tx *Tx) error) ([]Stamped, error) {
	var lastErr error
	for attempt := 1; attempt <= maxTxAttempts; attempt++ {
		stamped, err := s.writeTxOnce(ctx, fn)
		if err == nil || !isRetryable(err) {
			return stamped, err
		}
		lastErr = err
		if err := sleepCtx(ctx, time.Duration(attempt*attempt)*5*time.Millisecond); err != nil {
			return nil, err
		}
	}
	return nil, fmt.Errorf("store: write transaction kept deadlocking (%d attempts): %w", maxTxAttempts, lastErr)
}

func (s *Store) writeTxOnce(ctx context.Context, fn func(ctx context.Context, tx *Tx) error) (_ []Stamped, err error) {
	sqlTx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("store: begin write transaction: %w", err)
	}
	defer func() {
		if err != nil {
			_ = sqlTx.Rollback()
		}
	}()
	tx := &Tx{tx: sqlTx}
	if err := fn(ctx, tx); err != nil {
		return nil, err
	}
	stamped, err := s.stamp(ctx, sqlTx, tx.touched)
	if err != nil {
		return nil, err
	}
	if h := s.testHooks(); h.AfterStamp != nil && len(stamped) > 0 {
		h.AfterStamp(ctx, stamped)
	}
	if err := sqlTx.Commit(); err != nil {
		return nil, fmt.Errorf("store: commit: %w", err)
	}
	if h := s.testHooks(); h.AfterCommit != nil {
		if err := h.AfterCommit(ctx); err != nil {
			return nil, fmt.Errorf("store: commit: %w", err)
		}
	}
	return stamped, nil
}

// stamp gives refs new versions; see the package documentation for the
// protocol and why it keeps commit order equal to version order. It is the
// only code that assigns versions.
func (s *Store) stamp(ctx context.Context, tx *sql.Tx, refs []Ref) ([]Stamped, error) {
	if len(refs) == 0 {
		return nil, nil
	}
	// 0. Lock the rows first, in key order (fewer deadlocks between writers
	// touching overlapping sets), so version_seq is always the last lock.
	sorted := append([]Ref(nil), refs...)
	sort.Slice(sorted, func(i, j int) bool {
		a, b := sorted[i], sorted[j]
		if a.Kind != b.Kind {
			return a.Kind < b.Kind
		}
		if a.Region != b.Region {
			return a.Region < b.Region
		}
		return a.ID < b.ID
	})
	for _, r := range sorted {
		var v uint64
		err := tx.QueryRowContext(ctx, lookupKind(r.Kind).lockSQL, lookupKind(r.Kind).keyArgs(r)...).Scan(&v)
		if errors.Is(err, sql.ErrNoRows) {
			return nil, fmt.Errorf("store: cannot version %s: no such row (write its content before stamping it): %w", r, ErrNotFound)
		}
		if err != nil {
			return nil, fmt.Errorf("store: lock %s for versioning: %w", r, err)
		}
	}

	// 1. Take the sequence (held until COMMIT).
	n := uint64(len(refs))
	unsafe := s.testHooks().UnsafeAllocator
	var head uint64
	if unsafe {
		var err error
		if head, err = s.allocateUnsafe(ctx, n); err != nil {
			return nil, err
		}
	} else if err := tx.QueryRowContext(ctx, "SELECT head FROM version_seq WHERE id = 1 FOR UPDATE").Scan(&head); err != nil {
		return nil, fmt.Errorf("store: read version sequence: %w (was `ctrl migrate` run?)", err)
	}

	// 2. Versions in touch order, with the monotonic guard.
	type pair struct{ region, kind string }
	heads := map[pair]uint64{}
	out := make([]Stamped, len(refs))
	for i, r := range refs {
		v := head + uint64(i) + 1
		def := lookupKind(r.Kind)
		args := append([]any{v}, def.keyArgs(r)...)
		args = append(args, v)
		res, err := tx.ExecContext(ctx, def.stampSQL, args...)
		if err != nil {
			return nil, fmt.Errorf("store: stamp %s with version %d: %w", r, v, err)
		}
		if n, err := res.RowsAffected(); err != nil || n != 1 {
			return nil, fmt.Errorf("store: stamp %s with version %d: the row already has a version >= %d (versions must only grow; this is a bug in the writer)", r, v, v)
		}
		out[i] = Stamped{Ref: r, Version: v}
		p := pair{r.Region, r.Kind}
		if v > heads[p] {
			heads[p] = v
		}
	}

	// 3. Raise the per-(region, kind) heads, in key order.
	pairs := make([]pair, 0, len(heads))
	for p := range heads {
		pairs = append(pairs, p)
	}
	sort.Slice(pairs, func(i, j int) bool {
		if pairs[i].region != pairs[j].region {
			return pairs[i].region < pairs[j].region
		}
		return pairs[i].kind < pairs[j].kind
	})
	var execer interface {
		ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	} = tx
	if unsafe {
		// The broken allocator publishes its heads at once too (as an
		// outbox would): a lock held to commit on change_heads would
		// serialise the writers of a (region, kind) and hide the bug.
		execer = s.db
	}
	for _, p := range pairs {
		if _, err := execer.ExecContext(ctx,
			"INSERT INTO change_heads (region, kind, head) VALUES (?, ?, ?) ON DUPLICATE KEY UPDATE head = GREATEST(head, VALUES(head))",
			p.region, p.kind, heads[p]); err != nil {
			return nil, fmt.Errorf("store: raise change head of %s/%s: %w", p.region, p.kind, err)
		}
	}

	// 4. Advance the sequence (already done by the unsafe allocator).
	if !unsafe {
		if _, err := tx.ExecContext(ctx, "UPDATE version_seq SET head = ? WHERE id = 1", head+n); err != nil {
			return nil, fmt.Errorf("store: advance version sequence: %w", err)
		}
	}
	return out, nil
}

// allocateUnsafe is the broken allocator kept for the loss test: the
// increment commits at once, so the versions are visible as "taken" long
// before the rows carrying them commit.
func (s *Store) allocateUnsafe(ctx context.Context, n uint64) (uint64, error) {
	res, err := s.db.ExecContext(ctx, "UPDATE version_seq SET head = LAST_INSERT_ID(head + ?) WHERE id = 1", n)
	if err != nil {
		return 0, fmt.Errorf("store: allocate versions (unsafe): %w", err)
	}
	end, err := res.LastInsertId()
	if err != nil {
		return 0, err
	}
	return uint64(end) - n, nil
}

// Grant is a contiguous range of versions given out by StampCommitted.
type Grant struct {
	First, Last uint64
	// Reused is true when the grant key had been used before and the stored
	// grant was returned without stamping again.
	Reused bool
}

// StampCommitted stamps rows whose content is already committed (for
// example by an earlier Restate step), in one transaction of its own.
// grantKey (for example a Restate invocation id) makes it exactly-once: the
// grant is recorded in the same transaction, and a repeated call with the
// same key returns the recorded versions without stamping again (so a key
// must always be used with the same refs). An empty grantKey stamps every
// time.
func (s *Store) StampCommitted(ctx context.Context, refs []Ref, grantKey string) (Grant, error) {
	return s.StampCommittedThen(ctx, refs, grantKey, nil)
}

// StampCommittedThen is StampCommitted that also runs then in the same
// transaction when it records a new grant (not when the key was granted
// before): what must happen exactly once with the stamp.
func (s *Store) StampCommittedThen(ctx context.Context, refs []Ref, grantKey string, then func(ctx context.Context, tx *Tx, g Grant) error) (Grant, error) {
	var grant Grant
	_, err := s.WriteTx(ctx, func(ctx context.Context, tx *Tx) error {
		grant = Grant{}
		if len(refs) == 0 {
			return nil
		}
		for _, r := range refs {
			tx.Touch(r.Kind, r.Region, r.ID)
		}
		stamped, err := s.stamp(ctx, tx.tx, tx.touched)
		if err != nil {
			return err
		}
		// stamp holds the version_seq lock now, so grant lookups of
		// concurrent callers are serialised too.
		if grantKey != "" {
			err := tx.tx.QueryRowContext(ctx, "SELECT first_version, last_version FROM version_grants WHERE invocation_id = ?", grantKey).
				Scan(&grant.First, &grant.Last)
			if err == nil {
				grant.Reused = true
				return errGrantReused
			}
			if !errors.Is(err, sql.ErrNoRows) {
				return fmt.Errorf("store: read version grant %q: %w", grantKey, err)
			}
		}
		grant.First, grant.Last = stamped[0].Version, stamped[len(stamped)-1].Version
		if grantKey != "" {
			if _, err := tx.Exec(ctx, "INSERT INTO version_grants (invocation_id, first_version, last_version, created_at) VALUES (?, ?, ?, ?)",
				grantKey, grant.First, grant.Last, nowMillis()); err != nil {
				return fmt.Errorf("store: record version grant %q: %w", grantKey, err)
			}
		}
		tx.touched = nil // already stamped
		if then != nil {
			return then(ctx, tx, grant)
		}
		return nil
	})
	if errors.Is(err, errGrantReused) {
		return grant, nil
	}
	if err != nil {
		return Grant{}, err
	}
	return grant, nil
}

// errGrantReused rolls back a StampCommitted whose key was already granted.
var errGrantReused = errors.New("version grant already recorded")
