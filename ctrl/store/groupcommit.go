package store

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Group commit. Every stamped write holds the version_seq lock from its
// stamp to its COMMIT, so only one write at a time can be between the two:
// alone, write throughput is one commit round trip (and, with a durable
// log, one log flush) per write. The committer below runs concurrent
// WriteTx calls in batches instead: one transaction runs each caller's fn
// in its own savepoint, sends the writes the survivors kept (deferred.go)
// in one statement per table, locks every row they touched, stamps them
// all with one pass over version_seq, and commits once. See doc.go for why
// the no-lost-change argument holds for batches unchanged.
//
// Per caller, what a caller can observe is kept: a caller's error rolls
// back to its savepoint, taken before its first write sent (its writes
// vanish, kept ones unsent, the others' stay), it gets its own versions
// and its own error, and its fn sees the callers before it in the batch as
// if they had committed just before it started. Which is why no caller is
// answered before its batch's fate is known, a failing one included: its
// error may rest on what the callers before it wrote ("already exists"),
// which is true only once the COMMIT succeeds. When the batch aborts
// before COMMIT, the failed callers run again with the others; when the
// COMMIT's outcome is unknown, they run again alone.
//
// What callers share is the fate of the COMMIT and of errors that abort
// the whole transaction. A caller's own lock wait or deadlock is not
// shared: the batch's statements wait for a row lock at most
// BatchLockWait, and a caller whose statement timed out (only that
// statement was rolled back) is rolled back to its savepoint and leaves
// the batch, which goes on without it; a caller that was chosen as a
// deadlock's victim (the server rolled the whole transaction back) leaves
// it too, and the others run again as a batch. A caller that leaves runs
// alone, on its own goroutine, with the server's lock wait and its own
// retries. The server's word decides, not the fn's: every statement's
// error is recorded by the Tx (noteErr), so a fn that wraps a deadlock
// without %w, or drops it, cannot make the batch go on in autocommit; a
// fn that failed after a read whose error it did not pass on is checked
// for a lost transaction (txAlive). When the batch keeps failing, or
// fails for another reason, every caller not yet answered runs alone,
// exactly as without group commit.
//
// Two batches never run their fns at the same time (fnMu): the next batch
// is taken, and runs its fns, while the previous one stamps and commits,
// which takes no row lock the next one could hold. So batches do not
// deadlock with each other, however their fns lock rows; a deadlock needs a
// transaction outside the group commit. A batch of one is a transaction of
// its own without a savepoint.

// groupCommitter batches WriteTx calls.
type groupCommitter struct {
	s *Store
	// maxBatch bounds the callers of one transaction; maxRunning bounds the
	// batches in flight.
	maxBatch, maxRunning int
	// lockWaitSeconds is the lock wait of a batch's statements (0: the
	// server's).
	lockWaitSeconds int

	mu      sync.Mutex
	queue   []*writeReq
	running int

	// fnMu is held by the batch whose fns are running (see above).
	fnMu sync.Mutex

	stats writeStats
}

// writeStats count what the committer did.
type writeStats struct {
	batches, batched, retries, fallbacks, solo, alone atomic.Int64
	largest                                           atomic.Int64
}

// WriteStats describes the group commit so far.
type WriteStats struct {
	// Batches is the number of transactions that carried two or more
	// WriteTx calls, Batched the calls they carried, Largest the most in
	// one.
	Batches, Batched, Largest int64
	// Solo is the number of calls that ran in a transaction of their own
	// (nothing to batch them with, or called from inside a batch).
	Solo int64
	// Retries is the number of batches run again after a deadlock;
	// Fallbacks the number whose calls then each ran alone.
	Retries, Fallbacks int64
	// Alone is the number of calls a batch sent to run in a transaction of
	// their own: after a lock wait or deadlock of their own, a fallback,
	// or a COMMIT whose outcome is unknown while their fn had failed.
	Alone int64
}

// WriteStats returns the group-commit counters (zero when it is off).
func (s *Store) WriteStats() WriteStats {
	if s.writes == nil {
		return WriteStats{}
	}
	st := &s.writes.stats
	return WriteStats{Batches: st.batches.Load(), Batched: st.batched.Load(), Largest: st.largest.Load(),
		Solo: st.solo.Load(), Retries: st.retries.Load(), Fallbacks: st.fallbacks.Load(), Alone: st.alone.Load()}
}

const (
	reqQueued int32 = iota
	reqTaken
	reqWithdrawn
)

// writeReq is one WriteTx call waiting for, or in, a batch.
type writeReq struct {
	ctx   context.Context
	fn    func(ctx context.Context, tx *Tx) error
	state atomic.Int32
	done  chan struct{}

	// Set before done is closed.
	stamped  []Stamped
	err      error
	panicked any
	// alone: the caller runs fn in a transaction of its own instead.
	alone bool
	// touched is what fn touched in the batch being built; fnErr and
	// fnPanic what fn failed with there, told once the batch's fate is
	// known.
	touched []Ref
	fnErr   error
	fnPanic any
}

func (r *writeReq) answer(stamped []Stamped, err error) {
	r.stamped, r.err = stamped, err
	close(r.done)
}

// runAlone answers r with: run fn in a transaction of your own, on your
// own goroutine and with your own retries (not in the batch's runner,
// where one caller's lock wait would hold up the next batches).
func (r *writeReq) runAlone() {
	r.alone = true
	close(r.done)
}

// inBatchKey marks the context a batched fn runs with: a WriteTx called
// from inside it runs alone, since waiting for a batch from inside one
// could wait for itself.
type inBatchKey struct{}

func (c *groupCommitter) do(ctx context.Context, fn func(ctx context.Context, tx *Tx) error) ([]Stamped, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if ctx.Value(inBatchKey{}) != nil {
		c.stats.solo.Add(1)
		return c.s.writeTxSolo(ctx, fn)
	}
	r := &writeReq{ctx: ctx, fn: fn, done: make(chan struct{})}
	c.mu.Lock()
	c.queue = append(c.queue, r)
	start := c.running < c.maxRunning
	if start {
		c.running++
	}
	c.mu.Unlock()
	if start {
		go c.run()
	}
	select {
	case <-r.done:
	case <-ctx.Done():
		if r.state.CompareAndSwap(reqQueued, reqWithdrawn) {
			return nil, ctx.Err()
		}
		// Already in a transaction: its outcome is on the way.
		<-r.done
	}
	if r.alone {
		c.stats.alone.Add(1)
		return c.s.writeTxSolo(ctx, fn)
	}
	if r.panicked != nil {
		panic(r.panicked)
	}
	return r.stamped, r.err
}

// run takes batches off the queue until it is empty. A runner takes its
// batch only once it holds fnMu: while another batch runs its fns, the
// queue fills up, and the next batch takes all of it.
func (c *groupCommitter) run() {
	for {
		c.fnMu.Lock()
		batch := c.take()
		if len(batch) == 0 {
			c.fnMu.Unlock()
			return
		}
		c.commit(batch)
	}
}

// take removes a batch from the queue; when there is nothing to take, the
// runner stops (in the same critical section, so a caller queueing now
// starts another).
func (c *groupCommitter) take() []*writeReq {
	c.mu.Lock()
	defer c.mu.Unlock()
	var batch []*writeReq
	for len(c.queue) > 0 && len(batch) < c.maxBatch {
		r := c.queue[0]
		c.queue[0] = nil
		c.queue = c.queue[1:]
		if r.state.CompareAndSwap(reqQueued, reqTaken) {
			batch = append(batch, r)
		}
	}
	if len(batch) == 0 {
		c.queue = nil // drop the drained backing array
		c.running--
	}
	return batch
}

// commit runs one batch and answers every caller in it. It is called with
// fnMu held, and releases it once the batch's fns have run.
func (c *groupCommitter) commit(batch []*writeReq) {
	if len(batch) == 1 {
		c.stats.solo.Add(1)
	} else {
		c.stats.batches.Add(1)
		c.stats.batched.Add(int64(len(batch)))
		for n := int64(len(batch)); ; {
			l := c.stats.largest.Load()
			if n <= l || c.stats.largest.CompareAndSwap(l, n) {
				break
			}
		}
	}
	pending := batch
	for attempt := 1; ; attempt++ {
		var err error
		if pending, err = c.commitBatch(pending); err == nil || len(pending) == 0 {
			// Answered, or every caller left to run alone (a batch of one
			// whose caller was a deadlock's victim): nothing to run again.
			return
		}
		if !isRetryable(err) || attempt == maxTxAttempts {
			break
		}
		// A deadlock with a transaction outside the group commit: the
		// batch runs again, as a transaction of its own would.
		c.stats.retries.Add(1)
		time.Sleep(time.Duration(attempt*attempt) * 5 * time.Millisecond)
		c.fnMu.Lock()
	}
	// The transaction failed as a whole before its COMMIT was sent: the
	// callers not answered yet run alone, each on its own goroutine with
	// the usual retries (a deadlock among them is retried like any other).
	c.stats.fallbacks.Add(1)
	for _, r := range pending {
		r.runAlone()
	}
}

// errBatchAborted marks a failure of the whole batch transaction.
type errBatchAborted struct{ err error }

func (e errBatchAborted) Error() string { return "store: group commit aborted: " + e.err.Error() }
func (e errBatchAborted) Unwrap() error { return e.err }

// commitBatch runs batch in one transaction and answers every caller whose
// fate it decided: when the COMMIT is answered, the callers kept get their
// versions and the callers whose fn failed their errors (given only now:
// an error may rest on what the callers before it wrote, which is true
// only once that commits). A caller whose fn hit a lock wait or a
// deadlock, or whose answer the batch cannot give truthfully, is told to
// run alone. When the transaction fails before COMMIT, commitBatch returns
// the callers not answered yet, to run again, and an error. It is called
// with fnMu held and releases it once the fns have run.
func (c *groupCommitter) commitBatch(batch []*writeReq) ([]*writeReq, error) {
	// Statements run on the batch's context, not on any caller's: one
	// caller going away must not break the others' transaction.
	ctx := context.Background()
	conn, err := c.s.db.Conn(ctx)
	if err != nil {
		c.fnMu.Unlock()
		return batch, errBatchAborted{fmt.Errorf("store: connect for a write transaction: %w", err)}
	}
	defer c.releaseConn(conn)
	if c.lockWaitSeconds > 0 {
		if _, err := conn.ExecContext(ctx, "SET SESSION innodb_lock_wait_timeout = ?", c.lockWaitSeconds); err != nil {
			c.fnMu.Unlock()
			return batch, errBatchAborted{fmt.Errorf("store: bound the lock wait of a write transaction: %w", err)}
		}
	}
	sqlTx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		c.fnMu.Unlock()
		return batch, errBatchAborted{fmt.Errorf("store: begin write transaction: %w", err)}
	}
	committed := false
	defer func() {
		if !committed {
			_ = sqlTx.Rollback()
		}
	}()
	run, err := c.runMembers(ctx, sqlTx, batch)
	c.fnMu.Unlock()
	if err != nil {
		return run.rerun, err
	}
	members, failed := run.members, run.failed
	// all are the callers this transaction answers, kept or failed.
	all := append(append([]*writeReq(nil), members...), failed...)
	if len(members) == 0 {
		// Nothing is kept: every write is rolled back to its savepoint, so
		// each failure was seen against committed state only.
		answerFailed(failed)
		return nil, nil
	}
	hooks := c.s.testHooks()
	if hooks.BatchFault != nil {
		if err := hooks.BatchFault("stamp", len(members), len(batch)); err != nil {
			return all, errBatchAborted{err}
		}
	}
	var refs []Ref
	for _, r := range members {
		refs = append(refs, r.touched...)
	}
	var stamped []Stamped
	if len(refs) > 0 {
		if stamped, err = c.s.assign(ctx, sqlTx, refs, run.current); err != nil {
			return all, errBatchAborted{err}
		}
		if hooks.AfterStamp != nil {
			hooks.AfterStamp(ctx, stamped)
		}
	}
	if hooks.BatchFault != nil {
		if err := hooks.BatchFault("commit", len(members), len(batch)); err != nil {
			return all, errBatchAborted{err}
		}
	}
	err = sqlTx.Commit()
	committed = true
	if err != nil {
		// The outcome is unknown here: every caller kept is told, as a
		// transaction of its own would have been. A failed caller's error
		// may rest on writes that did not commit: it runs again alone.
		err = fmt.Errorf("store: commit: %w", err)
		for _, r := range members {
			r.answer(nil, err)
		}
		for _, r := range failed {
			r.runAlone()
		}
		return nil, nil
	}
	for _, r := range members {
		n := len(r.touched)
		mine := stamped[:n:n]
		stamped = stamped[n:]
		// As for a transaction of its own: the test hook may turn this
		// caller's answer into a lost one after the COMMIT succeeded.
		if hooks.AfterCommit != nil {
			if err := hooks.AfterCommit(r.ctx); err != nil {
				r.answer(nil, fmt.Errorf("store: commit: %w", err))
				continue
			}
		}
		r.answer(mine, nil)
	}
	answerFailed(failed)
	return nil, nil
}

// answerFailed gives the callers whose fn failed their own error (or
// panic).
func answerFailed(failed []*writeReq) {
	for _, r := range failed {
		r.panicked = r.fnPanic
		r.answer(nil, r.fnErr)
	}
}

// releaseConn gives the batch's connection back to the pool with the
// server's lock wait again; a connection whose setting cannot be restored
// is closed instead of reused.
func (c *groupCommitter) releaseConn(conn *sql.Conn) {
	if c.lockWaitSeconds > 0 {
		if _, err := conn.ExecContext(context.Background(), "SET SESSION innodb_lock_wait_timeout = DEFAULT"); err != nil {
			_ = conn.Raw(func(any) error { return driver.ErrBadConn })
		}
	}
	_ = conn.Close()
}

// memberRun is what running a batch's fns gave.
type memberRun struct {
	// members are the callers whose fn succeeded, failed those whose fn
	// failed (rolled back to their savepoints, answered with the batch's
	// fate); current are the locked rows' versions.
	members, failed []*writeReq
	current         map[Ref]uint64
	// rerun are the callers not answered when the batch aborts.
	rerun []*writeReq
}

// runMembers runs each caller's fn in its own savepoint and locks the rows
// the kept callers touched (step 0 of stamping, for the whole batch). A
// caller whose fn hit a lock wait timeout or a deadlock leaves the batch
// and runs alone; on an error that aborts the batch, it returns the
// callers to run again.
func (c *groupCommitter) runMembers(ctx context.Context, sqlTx *sql.Tx, batch []*writeReq) (run memberRun, err error) {
	hooks := c.s.testHooks()
	// The writes the kept callers' fns left to send (deferred.go).
	var kept deferredWrites
	// A caller alone needs no savepoint: its failure rolls back the whole
	// transaction.
	savepoints := len(batch) > 1
	abort := func(rest []*writeReq, err error) (memberRun, error) {
		run.rerun = append(append(append([]*writeReq(nil), run.members...), run.failed...), rest...)
		return run, errBatchAborted{err}
	}
	for i, r := range batch {
		if err := r.ctx.Err(); err != nil {
			r.answer(nil, err)
			continue
		}
		tx := &Tx{tx: sqlTx, batch: &kept, savepoint: savepoints}
		panicked, fnErr := runMember(r, tx)
		if tx.sendErr != nil {
			// Sending the batch's kept writes or taking the savepoint
			// failed: they may be other callers', so the batch aborts
			// (and a deadlock is retried as a whole).
			return abort(batch[i:], tx.sendErr)
		}
		if tx.txErr != nil {
			// The server's word, whatever fn made of it: a deadlock
			// wrapped without %w must not let the batch go on.
			panicked, fnErr = nil, tx.txErr
		}
		if fnErr == nil && hooks.BatchFault != nil {
			fnErr = hooks.BatchFault("member", i, len(batch))
		}
		if fnErr == nil {
			run.members = append(run.members, r)
			kept.take(&tx.own)
			continue
		}
		// The caller's kept writes are dropped unsent.
		retry := panicked == nil && isRetryable(fnErr)
		// lost: the transaction is gone (a deadlock rolled it back, the
		// connection broke), and the writes of the callers before with it.
		lost := panicked == nil && abortsTx(fnErr) && mysqlErrNumber(fnErr) != 1205
		if !lost && savepoints {
			// A caller that sent no write took no savepoint, and has
			// nothing to roll back (rolling back to the savepoint there is
			// would undo the caller before it); it is checked for a
			// transaction lost under an error its fn did not pass on.
			if tx.saved {
				_, err := sqlTx.ExecContext(ctx, "ROLLBACK TO SAVEPOINT member")
				lost = err != nil
			} else if tx.stmts > 0 {
				lost = !txAlive(ctx, sqlTx)
			}
		}
		if lost {
			// This caller runs alone, with its own retries; the others
			// run again in a batch (a deadlock) or alone (anything else).
			r.runAlone()
			return abort(batch[i+1:], fnErr)
		}
		if retry {
			// A lock wait timeout rolled back the statement only: this
			// caller's writes are rolled back to its savepoint, it waits
			// alone, and the batch goes on without it.
			r.runAlone()
			continue
		}
		if !savepoints {
			// A batch of one: the rollback is its fate, known now.
			r.panicked = panicked
			r.answer(nil, fnErr)
			return run, nil
		}
		r.fnErr, r.fnPanic = fnErr, panicked
		run.failed = append(run.failed, r)
	}
	// One statement per table for the kept writes of every caller: an
	// error here cannot be told apart per caller, so, like a missing row
	// below, the batch runs again one call at a time, where it fails
	// alone.
	if err := kept.send(ctx, sqlTx); err != nil {
		return abort(nil, err)
	}
	var refs []Ref
	for _, r := range run.members {
		refs = append(refs, r.touched...)
	}
	if len(refs) == 0 {
		return run, nil
	}
	// A missing row is one caller's mistake, but its writes are in the
	// transaction by now: the batch runs again one call at a time, where
	// it fails alone.
	if run.current, err = lockRows(ctx, sqlTx, refs); err != nil {
		return abort(nil, err)
	}
	return run, nil
}

// txAlive reports whether sqlTx is still a transaction on the server: a
// savepoint outside a transaction is forgotten at once, so rolling back to
// it fails.
func txAlive(ctx context.Context, sqlTx *sql.Tx) bool {
	if _, err := sqlTx.ExecContext(ctx, "SAVEPOINT alive"); err != nil {
		return false
	}
	_, err := sqlTx.ExecContext(ctx, "ROLLBACK TO SAVEPOINT alive")
	return err == nil
}

// runMember runs one caller's fn inside the batch, on tx.
func runMember(r *writeReq, tx *Tx) (panicked any, err error) {
	defer func() {
		if p := recover(); p != nil {
			panicked = p
			err = fmt.Errorf("store: write panicked: %v", p)
		}
	}()
	// The caller's values (loggers, identities), the batch's lifetime.
	ctx := context.WithValue(context.WithoutCancel(r.ctx), inBatchKey{}, true)
	if err := r.fn(ctx, tx); err != nil {
		return nil, err
	}
	r.touched = tx.touched
	return nil, nil
}
