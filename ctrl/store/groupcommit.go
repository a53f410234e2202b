package store

import (
	"context"
	"database/sql"
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
// vanish, kept ones unsent, the others' stay), it gets its
// own versions and its own error, and its fn sees the callers before it in
// the batch as if they had committed just before it started. What callers
// share is the fate of the COMMIT and of errors that abort the whole
// transaction (a deadlock): after such an error the batch runs again, and
// when it keeps failing, or failed for another reason, every caller not
// yet answered runs alone, exactly as without group commit.
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

	mu      sync.Mutex
	queue   []*writeReq
	running int

	// fnMu is held by the batch whose fns are running (see above).
	fnMu sync.Mutex

	stats writeStats
}

// writeStats count what the committer did.
type writeStats struct {
	batches, batched, retries, fallbacks, solo atomic.Int64
	largest                                    atomic.Int64
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
	// Fallbacks the number whose calls then ran one at a time.
	Retries, Fallbacks int64
}

// WriteStats returns the group-commit counters (zero when it is off).
func (s *Store) WriteStats() WriteStats {
	if s.writes == nil {
		return WriteStats{}
	}
	st := &s.writes.stats
	return WriteStats{Batches: st.batches.Load(), Batched: st.batched.Load(), Largest: st.largest.Load(),
		Solo: st.solo.Load(), Retries: st.retries.Load(), Fallbacks: st.fallbacks.Load()}
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
	// touched is what fn touched in the batch being built.
	touched []Ref
}

func (r *writeReq) answer(stamped []Stamped, err error) {
	r.stamped, r.err = stamped, err
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
		if pending, err = c.commitBatch(pending); err == nil {
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
	// callers not answered yet run alone, one after another (all at once
	// they could deadlock among themselves), with the usual retries.
	c.stats.fallbacks.Add(1)
	for _, r := range pending {
		c.s.runSolo(r)
	}
}

// runSolo answers r from a transaction of its own.
func (s *Store) runSolo(r *writeReq) {
	defer func() {
		if p := recover(); p != nil {
			r.panicked = p
			r.answer(nil, fmt.Errorf("store: write panicked: %v", p))
		}
	}()
	r.answer(s.writeTxSolo(r.ctx, r.fn))
}

// errBatchAborted marks a failure of the whole batch transaction.
type errBatchAborted struct{ err error }

func (e errBatchAborted) Error() string { return "store: group commit aborted: " + e.err.Error() }
func (e errBatchAborted) Unwrap() error { return e.err }

// commitBatch runs batch in one transaction. Callers whose own fn failed
// are answered at once; the others when the COMMIT is answered. When the
// transaction fails before COMMIT, it returns the callers not answered
// yet, and an error. It is called with fnMu held and releases it once the
// fns have run.
func (c *groupCommitter) commitBatch(batch []*writeReq) ([]*writeReq, error) {
	// Statements run on the batch's context, not on any caller's: one
	// caller going away must not break the others' transaction.
	ctx := context.Background()
	sqlTx, err := c.s.db.BeginTx(ctx, nil)
	if err != nil {
		c.fnMu.Unlock()
		return batch, fmt.Errorf("store: begin write transaction: %w", err)
	}
	committed := false
	defer func() {
		if !committed {
			_ = sqlTx.Rollback()
		}
	}()
	members, current, pending, err := c.runMembers(ctx, sqlTx, batch)
	c.fnMu.Unlock()
	if err != nil {
		return pending, err
	}
	if len(members) == 0 {
		return nil, nil
	}
	hooks := c.s.testHooks()
	if hooks.BatchFault != nil {
		if err := hooks.BatchFault("stamp", len(members), len(batch)); err != nil {
			return members, errBatchAborted{err}
		}
	}
	var refs []Ref
	for _, r := range members {
		refs = append(refs, r.touched...)
	}
	var stamped []Stamped
	if len(refs) > 0 {
		if stamped, err = c.s.assign(ctx, sqlTx, refs, current); err != nil {
			return members, errBatchAborted{err}
		}
		if hooks.AfterStamp != nil {
			hooks.AfterStamp(ctx, stamped)
		}
	}
	if hooks.BatchFault != nil {
		if err := hooks.BatchFault("commit", len(members), len(batch)); err != nil {
			return members, errBatchAborted{err}
		}
	}
	err = sqlTx.Commit()
	committed = true
	if err != nil {
		// The outcome is unknown here: every caller is told, as a
		// transaction of its own would have been.
		err = fmt.Errorf("store: commit: %w", err)
		for _, r := range members {
			r.answer(nil, err)
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
	return nil, nil
}

// runMembers runs each caller's fn in its own savepoint, answers the
// callers that failed, and locks the rows the others touched (step 0 of
// stamping, for the whole batch). It returns the callers kept and the
// locked rows' versions, or the callers not answered and an error that
// aborts the batch.
func (c *groupCommitter) runMembers(ctx context.Context, sqlTx *sql.Tx, batch []*writeReq) (members []*writeReq, current map[Ref]uint64, pending []*writeReq, err error) {
	hooks := c.s.testHooks()
	// The writes the kept callers' fns left to send (deferred.go).
	var kept deferredWrites
	// A caller alone needs no savepoint: its failure rolls back the whole
	// transaction.
	savepoints := len(batch) > 1
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
			return nil, nil, unanswered(members, batch[i:]), errBatchAborted{tx.sendErr}
		}
		if fnErr == nil && hooks.BatchFault != nil {
			fnErr = hooks.BatchFault("member", i, len(batch))
		}
		if panicked == nil && isRetryable(fnErr) {
			// A deadlock rolled the whole transaction back (and a lock
			// wait timeout is retried as a whole too).
			return nil, nil, unanswered(members, batch[i:]), errBatchAborted{fnErr}
		}
		if fnErr == nil {
			members = append(members, r)
			kept.take(&tx.own)
			continue
		}
		// The caller's kept writes are dropped unsent.
		if !savepoints {
			r.panicked = panicked
			r.answer(nil, fnErr)
			return nil, nil, nil, nil // the deferred rollback undoes it
		}
		// A caller that sent no write took no savepoint, and has nothing
		// to roll back (rolling back to the savepoint there is would undo
		// the caller before it).
		if tx.saved {
			if _, err := sqlTx.ExecContext(ctx, "ROLLBACK TO SAVEPOINT member"); err != nil {
				rest := unanswered(members, batch[i+1:])
				if panicked == nil {
					rest = append(rest, r) // its error may come from the broken transaction
				} else {
					r.panicked = panicked
					r.answer(nil, fnErr)
				}
				return nil, nil, rest, errBatchAborted{fmt.Errorf("roll back to savepoint: %w", err)}
			}
		}
		r.panicked = panicked
		r.answer(nil, fnErr)
	}
	// One statement per table for the kept writes of every caller: an
	// error here cannot be told apart per caller, so, like a missing row
	// below, the batch runs again one call at a time, where it fails
	// alone.
	if err := kept.send(ctx, sqlTx); err != nil {
		return nil, nil, members, errBatchAborted{err}
	}
	var refs []Ref
	for _, r := range members {
		refs = append(refs, r.touched...)
	}
	if len(refs) == 0 {
		return members, nil, nil, nil
	}
	// A missing row is one caller's mistake, but its writes are in the
	// transaction by now: the batch runs again one call at a time, where
	// it fails alone.
	if current, err = lockRows(ctx, sqlTx, refs); err != nil {
		return nil, nil, members, errBatchAborted{err}
	}
	return members, current, nil, nil
}

// unanswered is the callers kept so far plus the callers not reached.
func unanswered(members, rest []*writeReq) []*writeReq {
	return append(append([]*writeReq(nil), members...), rest...)
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
