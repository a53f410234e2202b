package store

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
)

// Stamped is a row and the version it was given.
type Stamped struct {
	Ref
	Version uint64
}

// Tx is a write transaction. Write content through its methods (or Exec),
// and call Touch for every desired-state row whose content changed; WriteTx
// stamps the touched rows with new versions as its last step.
//
// Some of its methods keep their writes to send later (deferred.go); the
// Tx sends them before any statement that could read them, so what the
// caller reads is as if they had been sent at once.
type Tx struct {
	tx      *sql.Tx
	touched []Ref
	seen    map[Ref]bool

	// own are this caller's kept writes; batch (group commit only) are the
	// kept writes of the callers before it in the batch.
	own   deferredWrites
	batch *deferredWrites
	// savepoint: a savepoint must be taken before this caller's first
	// write (a caller of a batch of several); saved: it was.
	savepoint, saved bool
	// sendErr is a failure to send kept writes or to take the savepoint:
	// every later statement fails with it, and it is the transaction's
	// error whatever the caller's function returns (in a batch, it aborts
	// the batch: the writes may be other callers').
	sendErr error
	// txErr is the first error a statement of this Tx got that the
	// caller's function may not decide about (see noteErr): whatever the
	// function returns, it is the call's error.
	txErr error
	// stmts counts the statements this Tx sent for the caller.
	stmts int
	// replicas are the replicas of the deployments this Tx locked
	// (LockDeployment), while no write it sent could have changed them.
	replicas map[string]int32
	// topology are the topology rows of the deployments this Tx locked
	// with LockDeploymentToScale, while no write it sent could have
	// changed them.
	topology map[string][]topologyRow
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
	if err := t.prepare(ctx, true, ""); err != nil {
		return nil, err
	}
	t.replicas, t.topology = nil, nil // the statement may change them
	t.stmts++
	res, err := t.tx.ExecContext(ctx, query, args...)
	return res, t.noteErr(err)
}

// noteErr records the errors after which the transaction cannot go on as
// the caller's function sees it, so that a function which wraps one
// without %w, or drops it, cannot make the transaction continue: a
// deadlock (1213: the server rolled the whole transaction back, and later
// statements would run in autocommit), a lock wait timeout (1205: the
// statement was rolled back, so the function's writes are incomplete) and
// a broken connection. It returns err unchanged.
func (t *Tx) noteErr(err error) error {
	if err != nil && t.txErr == nil && abortsTx(err) {
		t.txErr = err
	}
	return err
}

// abortsTx reports the errors noteErr records.
func abortsTx(err error) bool {
	return isRetryable(err) || errors.Is(err, mysql.ErrInvalidConn) || errors.Is(err, driver.ErrBadConn)
}

// QueryRow runs a query that returns at most one row in the transaction.
// A query must not write (writes go through Exec).
func (t *Tx) QueryRow(ctx context.Context, query string, args ...any) *Row {
	if err := t.prepare(ctx, false, ""); err != nil {
		return &Row{err: err}
	}
	t.stmts++
	return &Row{row: t.tx.QueryRowContext(ctx, query, args...), tx: t}
}

// Row is the result of Tx.QueryRow, as *sql.Row.
type Row struct {
	row *sql.Row
	err error
	tx  *Tx
}

// Scan is sql.Row.Scan.
func (r *Row) Scan(dest ...any) error {
	if r.err != nil {
		return r.err
	}
	return r.tx.noteErr(r.row.Scan(dest...))
}

// Query runs a query in the transaction. A query must not write.
func (t *Tx) Query(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	if err := t.prepare(ctx, false, ""); err != nil {
		return nil, err
	}
	t.stmts++
	rows, err := t.tx.QueryContext(ctx, query, args...)
	return rows, t.noteErr(err)
}

// prepare runs before a statement of the caller: it sends the kept writes
// the statement could read (all of them, or, for a read of one deployment
// named by deploymentID, all of them if that deployment has a scale kept),
// and takes the caller's savepoint before its first write.
func (t *Tx) prepare(ctx context.Context, write bool, deploymentID string) error {
	if t.sendErr != nil {
		return t.sendErr
	}
	own := !t.own.empty() && (deploymentID == "" || t.own.scaled[deploymentID])
	save := (write || own) && t.savepoint && !t.saved
	// The earlier callers' kept writes go before this caller's savepoint,
	// always: sent after it, a rollback of this caller would undo them,
	// though they are answered success.
	if b := t.batch; b != nil && !b.empty() && (save || deploymentID == "" || b.scaled[deploymentID]) {
		if err := b.send(ctx, t.tx); err != nil {
			t.sendErr = err
			return err
		}
	}
	if save {
		if _, err := t.tx.ExecContext(ctx, "SAVEPOINT member"); err != nil {
			t.sendErr = fmt.Errorf("store: savepoint: %w", err)
			return t.sendErr
		}
		t.saved = true
	}
	if own {
		if err := t.own.send(ctx, t.tx); err != nil {
			t.sendErr = err
			return err
		}
	}
	return nil
}

// sendKept sends this caller's kept writes (at the end of its function).
func (t *Tx) sendKept(ctx context.Context) error {
	if t.own.empty() {
		return nil
	}
	return t.prepare(ctx, true, "")
}

// TestHooks are switches for the tests of the versioning design. Production
// code never sets them.
type TestHooks struct {
	// AfterStamp runs after the versions are assigned and before COMMIT,
	// inside the transaction (to widen the window between the two).
	AfterStamp func(ctx context.Context, stamped []Stamped)
	// AfterCommit runs after a write transaction (WriteTx, StampCommitted,
	// UseCallNonce's autocommit INSERT) committed, once per call with that
	// call's context (also for each caller of a group commit). An error it returns is what the call
	// returns, as
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
	// BatchFault, when it returns an error, injects a failure into a group
	// commit of size callers at a point: "member" after caller i's fn
	// succeeded (i is its position in the batch), "stamp" before the batch
	// is stamped and "commit" before COMMIT (i is the number of callers
	// kept).
	BatchFault func(point string, i, size int) error
	// BeforeReportCommit runs inside a report batch's transaction (Ingest)
	// after its writes, before COMMIT, with the batch's size: a test holds
	// the batch open there.
	BeforeReportCommit func(ctx context.Context, reports int)
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
//
// Concurrent calls are group-committed (groupcommit.go): one transaction
// runs several callers' fn, each inside its own savepoint, stamps them all
// and commits once. Each caller still gets only its own versions, and its
// own error: a failing fn is rolled back to its savepoint and leaves the
// others alone. fn sees the writes of the callers batched before it, as if
// the calls had run one after another.
func (s *Store) WriteTx(ctx context.Context, fn func(ctx context.Context, tx *Tx) error) ([]Stamped, error) {
	if s.writes != nil {
		return s.writes.do(ctx, fn)
	}
	return s.writeTxSolo(ctx, fn)
}

// WriteTxAlone is WriteTx in a transaction of its own, never
// group-committed: for writes that give no versions (status reports,
// tokens, registrations). They gain nothing from group commit, which
// serialises the writes it batches, and in its queue they would wait
// behind desired-state writes, and make those wait.
func (s *Store) WriteTxAlone(ctx context.Context, fn func(ctx context.Context, tx *Tx) error) ([]Stamped, error) {
	return s.writeTxSolo(ctx, fn)
}

// writeTxSolo runs fn in a transaction of its own, retried after deadlocks.
func (s *Store) writeTxSolo(ctx context.Context, fn func(ctx context.Context, tx *Tx) error) ([]Stamped, error) {
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
	fnErr := fn(ctx, tx)
	switch {
	case tx.sendErr != nil:
		return nil, tx.sendErr
	case tx.txErr != nil:
		// Whatever fn made of it (a deadlock wrapped without %w, or
		// dropped): the transaction is gone or incomplete, and is retried.
		return nil, tx.txErr
	case fnErr != nil:
		return nil, fnErr
	}
	if err := tx.sendKept(ctx); err != nil {
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

// execer is what stamping needs of a transaction.
type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// stamp gives refs new versions; see the package documentation for the
// protocol and why it keeps commit order equal to version order. With
// lockRows and assign it is the only code that assigns versions.
func (s *Store) stamp(ctx context.Context, tx execer, refs []Ref) ([]Stamped, error) {
	if len(refs) == 0 {
		return nil, nil
	}
	current, err := lockRows(ctx, tx, refs)
	if err != nil {
		return nil, err
	}
	return s.assign(ctx, tx, refs, current)
}

// rowsPerStatement bounds the rows one locking or stamping statement names.
const rowsPerStatement = 500

// tableRefs groups refs by the table that holds them, each group in key
// order, tables in a fixed order.
func tableRefs(refs []Ref) [][]Ref {
	byTable := map[string][]Ref{}
	seen := map[Ref]bool{}
	for _, r := range refs {
		if !seen[r] {
			seen[r] = true
			t := lookupKind(r.Kind).table
			byTable[t] = append(byTable[t], r)
		}
	}
	tables := make([]string, 0, len(byTable))
	for t := range byTable {
		tables = append(tables, t)
	}
	sort.Strings(tables)
	out := make([][]Ref, 0, len(tables))
	for _, t := range tables {
		rs := byTable[t]
		sort.Slice(rs, func(i, j int) bool {
			a, b := rs[i], rs[j]
			if a.Kind != b.Kind {
				return a.Kind < b.Kind
			}
			if a.Region != b.Region {
				return a.Region < b.Region
			}
			return a.ID < b.ID
		})
		for len(rs) > 0 {
			n := min(len(rs), rowsPerStatement)
			out = append(out, rs[:n])
			rs = rs[n:]
		}
	}
	return out
}

// rowsCond is "(k1 = ? AND k2 = ?) OR (...)" for refs of one table, and its
// args. Statements using it name FORCE INDEX (PRIMARY): without it, an
// optimizer that finds most of a small table asked for scans the table,
// and a locking scan locks every row it passes, not just these.
func rowsCond(def *kindDef, refs []Ref) (string, []any) {
	match := keyMatch(def)
	var sb strings.Builder
	args := make([]any, 0, len(refs)*len(def.keyCols))
	for i, r := range refs {
		if i > 0 {
			sb.WriteString(" OR ")
		}
		sb.WriteString("(" + match + ")")
		args = append(args, def.keyArgs(r)...)
	}
	return sb.String(), args
}

// keyMatch is "k1 = ? AND k2 = ?" for the table's key columns.
func keyMatch(def *kindDef) string {
	return strings.Join(def.keyCols, " = ? AND ") + " = ?"
}

// versionCase is "CASE WHEN <key> THEN ? ... ELSE <otherwise> END": each
// row's new version, for refs of one table.
func versionCase(def *kindDef, refs []Ref, versions map[Ref]uint64, otherwise string) (string, []any) {
	match := keyMatch(def)
	var sb strings.Builder
	args := make([]any, 0, len(refs)*(len(def.keyCols)+1))
	sb.WriteString("CASE")
	for _, r := range refs {
		sb.WriteString(" WHEN " + match + " THEN ?")
		args = append(append(args, def.keyArgs(r)...), versions[r])
	}
	sb.WriteString(" ELSE " + otherwise + " END")
	return sb.String(), args
}

// lockRows is step 0: lock the rows first (one statement per table, key
// order), so version_seq is always the last lock taken. It returns each
// row's current version; a missing row fails with ErrNotFound.
func lockRows(ctx context.Context, tx execer, refs []Ref) (map[Ref]uint64, error) {
	current := make(map[Ref]uint64, len(refs))
	for _, group := range tableRefs(refs) {
		def := lookupKind(group[0].Kind)
		cond, args := rowsCond(def, group)
		cols := strings.Join(def.keyCols, ", ")
		rows, err := tx.QueryContext(ctx, "SELECT "+cols+", version FROM "+def.table+" WHERE "+cond+" ORDER BY "+cols+" FOR UPDATE", args...)
		if err != nil {
			return nil, fmt.Errorf("store: lock %d %s rows for versioning (first %s): %w", len(group), def.table, group[0], err)
		}
		found := map[string]uint64{}
		for rows.Next() {
			keys := make([]string, len(def.keyCols))
			dest := make([]any, 0, len(keys)+1)
			for i := range keys {
				dest = append(dest, &keys[i])
			}
			var v uint64
			if err := rows.Scan(append(dest, &v)...); err != nil {
				rows.Close()
				return nil, fmt.Errorf("store: lock %s rows for versioning: %w", def.table, err)
			}
			found[strings.Join(keys, "\x00")] = v
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("store: lock %s rows for versioning: %w", def.table, err)
		}
		for _, r := range group {
			v, ok := found[rowKey(def, r)]
			if !ok {
				return nil, fmt.Errorf("store: cannot version %s: no such row (write its content before stamping it): %w", r, ErrNotFound)
			}
			current[r] = v
		}
	}
	return current, nil
}

// rowKey is a row's key columns joined, as lockRows reads them back.
func rowKey(def *kindDef, r Ref) string {
	args := def.keyArgs(r)
	keys := make([]string, len(args))
	for i, a := range args {
		keys[i] = a.(string)
	}
	return strings.Join(keys, "\x00")
}

// assign is steps 1 to 4 for rows lockRows has locked (current holds their
// versions): take the sequence, give refs head+1 .. head+n in order, raise
// the change heads and advance the sequence. A ref listed twice gets two
// versions; the row keeps the later one (no reader can see the earlier: it
// is superseded inside the transaction that gave it).
func (s *Store) assign(ctx context.Context, tx execer, refs []Ref, current map[Ref]uint64) ([]Stamped, error) {
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
		return nil, fmt.Errorf("store: read version sequence: %w (was `ctrl admin migrate` run?)", err)
	}

	// 2. Versions in touch order, with the monotonic guard: every locked
	// row's version must be below the one it gets. Versions come only
	// from the sequence, so a row at or above head+1 is a writer's bug.
	type pair struct{ region, kind string }
	heads := map[pair]uint64{}
	out := make([]Stamped, len(refs))
	last := make(map[Ref]uint64, len(refs))
	for i, r := range refs {
		v := head + uint64(i) + 1
		if cur := current[r]; cur >= v {
			return nil, fmt.Errorf("store: stamp %s with version %d: the row already has version %d (versions must only grow; this is a bug in the writer)", r, v, cur)
		}
		out[i] = Stamped{Ref: r, Version: v}
		last[r] = v
		p := pair{r.Region, r.Kind}
		if v > heads[p] {
			heads[p] = v
		}
	}
	for _, group := range tableRefs(refs) {
		if err := stampRows(ctx, tx, group, last); err != nil {
			return nil, err
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
	headExec := tx
	if unsafe {
		// The broken allocator publishes its heads at once too (as an
		// outbox would): a lock held to commit on change_heads would
		// serialise the writers of a (region, kind) and hide the bug.
		headExec = s.db
	}
	var sb strings.Builder
	args := make([]any, 0, 3*len(pairs))
	sb.WriteString("INSERT INTO change_heads (region, kind, head) VALUES ")
	for i, p := range pairs {
		if i > 0 {
			sb.WriteString(", ")
		}
		sb.WriteString("(?, ?, ?)")
		args = append(args, p.region, p.kind, heads[p])
	}
	sb.WriteString(" ON DUPLICATE KEY UPDATE head = GREATEST(head, VALUES(head))")
	if _, err := headExec.ExecContext(ctx, sb.String(), args...); err != nil {
		return nil, fmt.Errorf("store: raise the change heads of %d (region, kind) pairs (first %s/%s): %w", len(pairs), pairs[0].region, pairs[0].kind, err)
	}

	// 4. Advance the sequence (already done by the unsafe allocator).
	if !unsafe {
		if _, err := tx.ExecContext(ctx, "UPDATE version_seq SET head = ? WHERE id = 1", head+n); err != nil {
			return nil, fmt.Errorf("store: advance version sequence: %w", err)
		}
	}
	return out, nil
}

// stampRows writes the versions of rows of one table in one statement,
// with the monotonic guard in SQL too, and checks every row matched.
func stampRows(ctx context.Context, tx execer, group []Ref, versions map[Ref]uint64) error {
	def := lookupKind(group[0].Kind)
	set, setArgs := versionCase(def, group, versions, "version")
	cond, condArgs := rowsCond(def, group)
	// The guard: a row only ever moves up (a row that already has the
	// version it would get, or a higher one, does not match, and the count
	// below fails).
	guard, guardArgs := versionCase(def, group, versions, "0")
	// version_at: when the row got this version (lag in seconds, fleet
	// view); the stamp runs just before COMMIT.
	query := "UPDATE " + def.table + " FORCE INDEX (PRIMARY) SET version = " + set + ", version_at = ? WHERE (" + cond + ") AND version < " + guard
	args := append(append(append(setArgs, nowMillis()), condArgs...), guardArgs...)
	res, err := tx.ExecContext(ctx, query, args...)
	if err != nil {
		return fmt.Errorf("store: stamp %d %s rows (first %s): %w", len(group), def.table, group[0], err)
	}
	if n, err := res.RowsAffected(); err != nil || n != int64(len(group)) {
		return fmt.Errorf("store: stamp %d %s rows (first %s): %d matched; a row already had a version at least as high (versions must only grow; this is a bug in the writer)", len(group), def.table, group[0], n)
	}
	return nil
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
	// Solo: it stamps inside fn, and in a group commit the writes batched
	// after it would then lock rows while holding version_seq.
	_, err := s.writeTxSolo(ctx, func(ctx context.Context, tx *Tx) error {
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
