package store_test

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"krane.dev/ctrl/deployspec"
	"krane.dev/ctrl/store"
	"krane.dev/internal/testenv"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
)

// The group commit under the faults a production database has: a caller
// refused on the strength of writes that never commit, an outside lock
// that stalls unrelated callers, a deadlock a function does not pass on.

// idemDeployment is a deployment created with an idempotency key.
func idemDeployment(id, key string) store.Deployment {
	return store.Deployment{Spec: deployspec.Spec{ID: id, WorkspaceID: "ws", ProjectID: "p", EnvironmentID: "env", AppID: "app", K8sNamespace: "ns", K8sName: "d-" + id, Replicas: 1, Workload: &clusterv1.Workload{Image: "registry.test/app:1", CpuMillicores: 100, MemoryMib: 128}}, IdempotencyKey: key}
}

// TestGroupCommitIdempotencyKeyRaceInOneBatch: two CreateDeployment calls
// with one idempotency key land in one batch. The second's insert fails
// with a duplicate key against the first's uncommitted row; it must not
// be answered before the batch commits, or its look-up of the winner
// finds nothing and it returns the raw 1062. The window before COMMIT is
// held open until the second caller has returned, or for a bound after
// which only a caller that waits for the batch's fate can still be
// waiting.
func TestGroupCommitIdempotencyKeyRaceInOneBatch(t *testing.T) {
	checkLeaks(t)
	s := openBatchStore(t)
	ctx := context.Background()
	secondDone := make(chan struct{})
	var held atomic.Bool
	s.SetTestHooks(store.TestHooks{BatchFault: func(point string, kept, size int) error {
		if point == "commit" && size == 2 {
			held.Store(true)
			select {
			case <-secondDone: // answered before the COMMIT: the bug
			case <-time.After(2 * time.Second):
			}
		}
		return nil
	}})
	type result struct {
		id      string
		existed bool
		err     error
	}
	var res [2]result
	release := holdCommitter(t, s)
	var wg sync.WaitGroup
	for i, id := range []string{"dep_first", "dep_second"} {
		wg.Go(func() {
			if i == 1 {
				defer close(secondDone)
			}
			res[i].id, res[i].existed, res[i].err = s.CreateDeployment(ctx, idemDeployment(id, "key-1"), "")
		})
		waitFor(t, fmt.Sprintf("create %d queued", i), func() bool { return s.QueuedWrites() == i+1 })
	}
	release()
	wg.Wait()
	if !held.Load() {
		t.Fatalf("the two creates were not one batch (write stats %+v)", s.WriteStats())
	}
	if res[0].err != nil || res[0].id != "dep_first" || res[0].existed {
		t.Errorf("first create: %+v; want dep_first, created", res[0])
	}
	if res[1].err != nil || res[1].id != "dep_first" || !res[1].existed {
		t.Errorf("second create with the same key: %+v; want dep_first with existed = true", res[1])
	}
}

// lockRow opens a transaction outside the store's pool that holds the row
// lock of the generic row id; unlock rolls it back.
func lockRow(t *testing.T, db *sql.DB, id string) (tx *sql.Tx, unlock func()) {
	t.Helper()
	tx, err := db.BeginTx(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var got string
	if err := tx.QueryRow("SELECT id FROM resources WHERE kind = ? AND region = 'eu' AND id = ? FOR UPDATE", batchKind, id).Scan(&got); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	unlock = func() { once.Do(func() { _ = tx.Rollback() }) }
	t.Cleanup(unlock)
	return tx, unlock
}

// outsideDB is a connection pool of the test's own, to the store's
// database: the outside session of a fault.
func outsideDB(t *testing.T, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// TestGroupCommitLockWaitStallsOnlyItsCaller: an outside session holds a
// row lock. A write to that row and a write to another row land in one
// batch, the blocked one first. The other write must commit while the
// lock is still held: the blocked caller leaves the batch after the
// batch's bounded lock wait and waits alone. Today the whole batch waits
// for the lock (50 s per attempt, five attempts).
func TestGroupCommitLockWaitStallsOnlyItsCaller(t *testing.T) {
	checkLeaks(t)
	dsn := testenv.SharedMySQL(t).Database(t, t.Name())
	s := openDSN(t, dsn, store.PoolOptions{WriteCommitters: 1, BatchLockWait: time.Second})
	ctx := context.Background()
	for _, id := range []string{"held", "free"} {
		if _, err := s.WriteTx(ctx, putResource(id, "0")); err != nil {
			t.Fatal(err)
		}
	}
	_, unlock := lockRow(t, outsideDB(t, dsn), "held")

	release := holdCommitter(t, s)
	var blocked, free callResult
	blockedDone, freeDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(blockedDone)
		blocked.stamped, blocked.err = s.WriteTx(ctx, putResource("held", "1"))
	}()
	waitFor(t, "the blocked write queued", func() bool { return s.QueuedWrites() == 1 })
	go func() {
		defer close(freeDone)
		free.stamped, free.err = s.WriteTx(ctx, putResource("free", "1"))
	}()
	waitFor(t, "the free write queued", func() bool { return s.QueuedWrites() == 2 })
	release()

	// The lock is held until the free write returns (or, on failure, for
	// a bound well past the batch's lock wait).
	freeWhileHeld := false
	select {
	case <-freeDone:
		freeWhileHeld = true
	case <-time.After(30 * time.Second):
	}
	unlock()
	<-freeDone
	<-blockedDone
	if !freeWhileHeld {
		t.Errorf("the write to an unrelated row did not commit while the outside lock was held (write stats %+v)", s.WriteStats())
	}
	if free.err != nil || len(free.stamped) != 1 {
		t.Errorf("the free write: %v, %v; want one version", free.stamped, free.err)
	}
	if blocked.err != nil || len(blocked.stamped) != 1 {
		t.Errorf("the blocked write, once the lock is gone: %v, %v; want it committed on its own", blocked.stamped, blocked.err)
	}
	checkVersions(t, s, []callResult{free, blocked}, 2)
}

// waitLockWait waits until the connection with thread id is waiting for a
// row lock (it runs beside the test, so it reports instead of failing).
func waitLockWait(db *sql.DB, thread int64) error {
	deadline := time.Now().Add(time.Minute)
	for {
		var n int
		err := db.QueryRow("SELECT COUNT(*) FROM information_schema.innodb_trx WHERE trx_mysql_thread_id = ? AND trx_state = 'LOCK WAIT'", thread).Scan(&n)
		switch {
		case err != nil:
			return err
		case n > 0:
			return nil
		case time.Now().After(deadline):
			return fmt.Errorf("the outside session did not wait for the lock within a minute")
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// TestGroupCommitMaskedDeadlockAbortsTheBatch: a batch member's function
// runs into a real deadlock with an outside session (the batch is the
// victim: InnoDB rolls its whole transaction back) and returns the error
// wrapped without %w. The batch must not go on in autocommit: the callers
// before it were rolled back with it and must be run again, not told they
// committed; the masking caller runs again alone.
func TestGroupCommitMaskedDeadlockAbortsTheBatch(t *testing.T) {
	checkLeaks(t)
	dsn := testenv.SharedMySQL(t).Database(t, t.Name())
	s := openDSN(t, dsn, store.PoolOptions{WriteCommitters: 1})
	ctx := context.Background()
	// m0 and m2 exist: the batch's writes update them, so a write lost
	// with the transaction leaves a row to stamp in autocommit.
	for _, id := range []string{"lock-a", "lock-b", "m0", "m2"} {
		if _, err := s.WriteTx(ctx, putResource(id, "0")); err != nil {
			t.Fatal(err)
		}
	}
	outside := outsideDB(t, dsn)
	conn, err := outside.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var thread int64
	if err := conn.QueryRowContext(ctx, "SELECT CONNECTION_ID()").Scan(&thread); err != nil {
		t.Fatal(err)
	}
	otx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer otx.Rollback()
	// The outside transaction is the heavier one, so InnoDB picks the
	// batch as the deadlock's victim.
	for i := range 200 {
		if _, err := otx.Exec("INSERT INTO resources (kind, region, id, spec, deleted, created_at, updated_at) VALUES (?, 'eu', ?, '{}', 0, 0, 0)",
			batchKind, fmt.Sprintf("heavy-%03d", i)); err != nil {
			t.Fatal(err)
		}
	}
	var got string
	if err := otx.QueryRow("SELECT id FROM resources WHERE kind = ? AND region = 'eu' AND id = 'lock-b' FOR UPDATE", batchKind).Scan(&got); err != nil {
		t.Fatal(err)
	}

	aLocked, proceed := make(chan struct{}), make(chan struct{})
	outsideErr := make(chan error, 1)
	go func() {
		<-aLocked
		var got string
		outsideErr <- otx.QueryRow("SELECT id FROM resources WHERE kind = ? AND region = 'eu' AND id = 'lock-a' FOR UPDATE", batchKind).Scan(&got)
	}()
	go func() {
		<-aLocked
		if err := waitLockWait(outside, thread); err != nil {
			t.Error(err)
		}
		close(proceed)
	}()

	var maskerRuns atomic.Int32
	var maskedErr error
	masker := func(ctx context.Context, tx *store.Tx) error {
		if maskerRuns.Add(1) > 1 {
			return putResource("m1", "a")(ctx, tx)
		}
		var got string
		if err := tx.QueryRow(ctx, "SELECT id FROM resources WHERE kind = ? AND region = 'eu' AND id = 'lock-a' FOR UPDATE", batchKind).Scan(&got); err != nil {
			return err
		}
		close(aLocked)
		<-proceed
		err := tx.QueryRow(ctx, "SELECT id FROM resources WHERE kind = ? AND region = 'eu' AND id = 'lock-b' FOR UPDATE", batchKind).Scan(&got)
		maskedErr = err
		if err != nil {
			return fmt.Errorf("read lock-b: %v", err) // masked: no %w
		}
		return nil
	}
	res := runBatch(t, s, []call{
		{fn: putResource("m0", "a")},
		{fn: masker},
		{fn: putResource("m2", "a")},
	}, nil)
	if err := <-outsideErr; err != nil {
		t.Fatalf("the outside session was the deadlock's victim (%v); the test needs the batch to be", err)
	}
	if maskedErr == nil {
		t.Fatal("the masking member ran into no deadlock")
	}
	t.Logf("the masked error: %v", maskedErr)
	if err := otx.Rollback(); err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if r.err != nil || r.panicked != nil || len(r.stamped) != 1 {
			t.Errorf("call %d: %v, %v, %v; want one version (a deadlock is run again)", i, r.stamped, r.err, r.panicked)
		}
	}
	if n := maskerRuns.Load(); n < 2 {
		t.Errorf("the masking function ran %d times; want it run again after the deadlock", n)
	}
	// Each caller told it committed has its row at its version, with the
	// content it wrote.
	checkVersions(t, s, res, 4)
	for _, id := range []string{"m0", "m1", "m2"} {
		var spec string
		if err := s.DB().QueryRow("SELECT spec FROM resources WHERE kind = ? AND region = 'eu' AND id = ?", batchKind, id).Scan(&spec); err != nil {
			t.Errorf("%s: %v", id, err)
		} else if spec != `{"rev":"a"}` && spec != `{"rev": "a"}` {
			t.Errorf("%s has spec %s; its writer was told it committed {\"rev\":\"a\"}", id, spec)
		}
	}
}
