package store_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"go.uber.org/goleak"

	"krane.dev/ctrl/store"
	"krane.dev/internal/testenv"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
	"krane.dev/shared/kinds"
)

const batchKind = "x.example"

// checkLeaks fails t if goroutines it started outlive it (after its
// cleanups, so the store is closed by then).
func checkLeaks(t *testing.T) {
	testenv.SharedMySQL(t)
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
}

// openBatchStore is a store with one group committer, so runBatch can make
// a batch of a known size.
func openBatchStore(t *testing.T) *store.Store {
	t.Helper()
	return openDSN(t, testenv.SharedMySQL(t).Database(t, t.Name()), store.PoolOptions{WriteCommitters: 1})
}

// holdCommitter makes a write that holds the only committer until release
// is called; release then waits for the write.
func holdCommitter(t *testing.T, s *store.Store) (release func()) {
	t.Helper()
	started, done := make(chan struct{}), make(chan error, 1)
	hold := make(chan struct{})
	var once sync.Once
	go func() {
		_, err := s.WriteTx(context.Background(), func(ctx context.Context, tx *store.Tx) error {
			once.Do(func() { close(started); <-hold })
			return nil
		})
		done <- err
	}()
	<-started
	return func() {
		close(hold)
		if err := <-done; err != nil {
			t.Errorf("the write holding the committer: %v", err)
		}
	}
}

type callResult struct {
	stamped  []store.Stamped
	err      error
	panicked any
}

type call struct {
	ctx context.Context // default: background
	fn  func(ctx context.Context, tx *store.Tx) error
}

// runBatch makes calls one group commit: a gate write holds the only
// committer until every call is queued, so the next transaction takes them
// all, in order. beforeRelease (optional) runs while they wait. It returns each
// call's outcome.
func runBatch(t *testing.T, s *store.Store, calls []call, beforeRelease func()) []callResult {
	t.Helper()
	ctx := context.Background()
	release := holdCommitter(t, s)
	out := make([]callResult, len(calls))
	var wg sync.WaitGroup
	for i, c := range calls {
		cctx := c.ctx
		if cctx == nil {
			cctx = ctx
		}
		wg.Go(func() {
			defer func() { out[i].panicked = recover() }()
			out[i].stamped, out[i].err = s.WriteTx(cctx, c.fn)
		})
		// One at a time, so the batch runs them in this order.
		waitFor(t, fmt.Sprintf("call %d queued", i), func() bool { return s.QueuedWrites() == i+1 })
	}
	if beforeRelease != nil {
		beforeRelease()
	}
	release()
	wg.Wait()
	return out
}

// waitFor polls cond (the calls are queued by other goroutines) with a
// generous bound.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within a minute", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func putResource(id, rev string) func(ctx context.Context, tx *store.Tx) error {
	return func(ctx context.Context, tx *store.Tx) error {
		return tx.PutResource(ctx, store.Resource{Kind: batchKind, Region: "eu", ID: id, Spec: fmt.Appendf(nil, `{"rev":%q}`, rev)})
	}
}

// checkVersions checks what every call that succeeded was told against the
// database: each version names its row (or was superseded by a later call
// in results), no version was given twice, and the sequence head is the
// number of versions given (a failed transaction gives none).
func checkVersions(t *testing.T, s *store.Store, results []callResult, extra int) {
	t.Helper()
	ctx := context.Background()
	latest := map[store.Ref]uint64{}
	seen := map[uint64]bool{}
	n := 0
	for _, r := range results {
		if r.err != nil || r.panicked != nil {
			continue
		}
		for _, st := range r.stamped {
			if seen[st.Version] {
				t.Errorf("version %d given twice", st.Version)
			}
			seen[st.Version] = true
			latest[st.Ref] = max(latest[st.Ref], st.Version)
			n++
		}
	}
	for ref, v := range latest {
		c, err := s.Desired(ctx, ref.Kind, ref.Region, ref.ID)
		if err != nil {
			t.Errorf("%s: %v", ref, err)
			continue
		}
		if c.Version != v {
			t.Errorf("%s has version %d in the database; its last writer was told %d", ref, c.Version, v)
		}
	}
	head, err := s.Head(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if head != uint64(n+extra) {
		t.Errorf("sequence head %d, want %d (versions given: %d, before: %d)", head, n+extra, n, extra)
	}
}

func TestGroupCommitAnswersEachCallerWithItsOwnVersions(t *testing.T) {
	checkLeaks(t)
	s := openBatchStore(t)
	var calls []call
	for i := range 20 {
		calls = append(calls, call{fn: putResource(fmt.Sprintf("r%02d", i), "a")})
	}
	calls = append(calls,
		call{fn: func(ctx context.Context, tx *store.Tx) error { // two rows
			if err := putResource("two-a", "a")(ctx, tx); err != nil {
				return err
			}
			return putResource("two-b", "a")(ctx, tx)
		}},
		call{fn: func(ctx context.Context, tx *store.Tx) error { return nil }}, // touches nothing
		call{fn: putResource("r00", "again")},                                  // r00 written twice in one batch
	)
	res := runBatch(t, s, calls, nil)
	for i, r := range res {
		if r.err != nil || r.panicked != nil {
			t.Fatalf("call %d: %v %v", i, r.err, r.panicked)
		}
	}
	if st := s.WriteStats(); st.Batches != 1 || st.Largest != int64(len(calls)) || st.Fallbacks != 0 {
		t.Fatalf("write stats %+v: want one batch of %d", st, len(calls))
	}
	// Each caller gets its rows, in its touch order.
	if got := res[20].stamped; len(got) != 2 || got[0].ID != "two-a" || got[1].ID != "two-b" || got[1].Version != got[0].Version+1 {
		t.Fatalf("two-row call got %v", got)
	}
	if len(res[21].stamped) != 0 {
		t.Fatalf("a call touching nothing got versions %v", res[21].stamped)
	}
	for i := range 20 {
		if got := res[i].stamped; len(got) != 1 || got[0].ID != fmt.Sprintf("r%02d", i) {
			t.Fatalf("call %d got %v", i, got)
		}
	}
	// The batch's versions are the next ones after the gate (which touched
	// nothing), contiguous.
	var all []uint64
	for _, r := range res {
		for _, st := range r.stamped {
			all = append(all, st.Version)
		}
	}
	sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
	for i, v := range all {
		if v != uint64(i+1) {
			t.Fatalf("versions %v are not 1..%d", all, len(all))
		}
	}
	checkVersions(t, s, res, 0)
	c, err := s.Desired(context.Background(), batchKind, "eu", "r00")
	if err != nil || c.Version != res[22].stamped[0].Version || c.Version <= res[0].stamped[0].Version {
		t.Fatalf("r00 = %+v, %v: want the second writer's version %d", c, err, res[22].stamped[0].Version)
	}
	heads, err := s.ChangeHeads(context.Background())
	if err != nil || heads[store.HeadKey{Region: "eu", Kind: batchKind}] != all[len(all)-1] {
		t.Fatalf("change heads %v, %v: want eu/%s at %d", heads, err, batchKind, all[len(all)-1])
	}
}

var errBoom = errors.New("boom")

// countRows counts the generic rows with id, stamped or not.
func countRows(t *testing.T, s *store.Store, id string) int {
	t.Helper()
	var n int
	if err := s.DB().QueryRow("SELECT COUNT(*) FROM resources WHERE id = ?", id).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestGroupCommitCallerErrorsStayTheirOwn(t *testing.T) {
	checkLeaks(t)
	s := openBatchStore(t)
	cancelled, cancel := context.WithCancel(context.Background())
	ranCancelled := false
	calls := []call{
		{fn: putResource("ok-1", "a")},
		{fn: func(ctx context.Context, tx *store.Tx) error { // writes, then fails
			if err := putResource("failed", "a")(ctx, tx); err != nil {
				return err
			}
			return errBoom
		}},
		{fn: putResource("ok-2", "a")},
		{fn: func(ctx context.Context, tx *store.Tx) error { // writes, then panics
			if err := putResource("panicked", "a")(ctx, tx); err != nil {
				return err
			}
			panic("boom-panic")
		}},
		{fn: putResource("ok-3", "a")},
		{ctx: cancelled, fn: func(ctx context.Context, tx *store.Tx) error { ranCancelled = true; return nil }},
		{fn: putResource("ok-4", "a")},
	}
	// The cancelled caller goes away while it waits in the queue.
	res := runBatch(t, s, calls, cancel)
	for _, i := range []int{0, 2, 4, 6} {
		if res[i].err != nil || len(res[i].stamped) != 1 {
			t.Errorf("call %d: %v, %v; want one version", i, res[i].stamped, res[i].err)
		}
	}
	if !errors.Is(res[1].err, errBoom) || len(res[1].stamped) != 0 {
		t.Errorf("failing call: %v, %v; want its own error and no versions", res[1].stamped, res[1].err)
	}
	if res[3].panicked != "boom-panic" {
		t.Errorf("panicking call: recovered %v, want its own panic", res[3].panicked)
	}
	if !errors.Is(res[5].err, context.Canceled) || ranCancelled {
		t.Errorf("cancelled call: err %v, ran %v; want context.Canceled without running", res[5].err, ranCancelled)
	}
	for _, id := range []string{"failed", "panicked"} {
		if n := countRows(t, s, id); n != 0 {
			t.Errorf("%s: %d rows; the writes of a failed call must roll back", id, n)
		}
	}
	checkVersions(t, s, res, 0)

	// A call touching a row that does not exist fails alone: the batch
	// runs again one call at a time.
	res = runBatch(t, s, []call{
		{fn: putResource("ok-5", "a")},
		{fn: func(ctx context.Context, tx *store.Tx) error {
			if err := putResource("with-missing", "a")(ctx, tx); err != nil {
				return err
			}
			tx.Touch(kinds.Sentinel, "eu", "nope")
			return nil
		}},
		{fn: putResource("ok-6", "a")},
	}, nil)
	if res[0].err != nil || res[2].err != nil || !errors.Is(res[1].err, store.ErrNotFound) {
		t.Fatalf("missing row: results %+v; want only the second to fail with ErrNotFound", res)
	}
	if n := countRows(t, s, "with-missing"); n != 0 {
		t.Errorf("with-missing: %d rows; want its writes rolled back", n)
	}
	if st := s.WriteStats(); st.Fallbacks != 1 {
		t.Errorf("write stats %+v: want one fallback", st)
	}
	checkVersions(t, s, res, 4)
}

// Every point where a batch can fail, with a plain error and with a
// deadlock (which must be retried): each caller returns, and what it is
// told matches the database.
func TestGroupCommitFaultPoints(t *testing.T) {
	const n = 4
	type fault struct {
		point string
		i     int // member index for "member"
	}
	var faults []fault
	for i := range n {
		faults = append(faults, fault{"member", i})
	}
	faults = append(faults, fault{"stamp", -1}, fault{"commit", -1})
	for _, f := range faults {
		for _, kind := range []string{"error", "deadlock"} {
			t.Run(fmt.Sprintf("%s-%d-%s", f.point, f.i, kind), func(t *testing.T) {
				checkLeaks(t)
				s := openBatchStore(t)
				var once sync.Once
				s.SetTestHooks(store.TestHooks{BatchFault: func(point string, i, size int) error {
					if size != n || point != f.point || (f.point == "member" && i != f.i) {
						return nil
					}
					var err error
					once.Do(func() {
						err = errBoom
						if kind == "deadlock" {
							err = &mysql.MySQLError{Number: 1213, Message: "injected deadlock"}
						}
					})
					return err
				}})
				var calls []call
				for i := range n {
					calls = append(calls, call{fn: putResource(fmt.Sprintf("r%d", i), "a")})
				}
				res := runBatch(t, s, calls, nil)
				for i, r := range res {
					wantErr := kind == "error" && f.point == "member" && i == f.i
					switch {
					case wantErr && !errors.Is(r.err, errBoom):
						t.Errorf("call %d: %v, want the injected error", i, r.err)
					case wantErr && countRows(t, s, fmt.Sprintf("r%d", i)) != 0:
						t.Errorf("call %d failed, but its row was written", i)
					case !wantErr && r.err != nil:
						t.Errorf("call %d: %v, want success (a batch failure is retried or run call by call)", i, r.err)
					}
				}
				checkVersions(t, s, res, 0)
				st := s.WriteStats()
				switch {
				case kind == "deadlock" && st.Retries != 1:
					t.Errorf("write stats %+v: want one retry of the batch", st)
				case kind == "error" && f.point != "member" && st.Fallbacks != 1:
					t.Errorf("write stats %+v: want one fallback to single calls", st)
				}
			})
		}
	}
}

// Status reports give no versions: they must not queue behind the group
// commit of desired-state writes (at a thousand clusters they are most of
// the writes, and would hold up deploys behind them).
func TestReportsDoNotWaitForTheGroupCommit(t *testing.T) {
	checkLeaks(t)
	s := openBatchStore(t)
	ctx := context.Background()
	if _, err := s.WriteTx(ctx, func(ctx context.Context, tx *store.Tx) error {
		return putDeployment(ctx, tx, "d1", "eu", "img:1", 1, "running")
	}); err != nil {
		t.Fatal(err)
	}
	liveClusters(t, s, "eu", "eu-1")
	// A desired-state write holds the only committer.
	defer holdCommitter(t, s)()
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	res, err := s.ReportDeployments(rctx, "eu", "eu-1", []store.DeploymentReport{{
		Obs:    store.Observation{Version: 1, At: time.Now()},
		Status: &clusterv1.DeploymentStatus{DeploymentId: "d1", K8SName: "d-d1", DesiredReplicas: 1, ReadyReplicas: 1},
	}})
	if err != nil || len(res) != 1 || !res[0].Accepted {
		t.Fatalf("a report while a group commit is held: %v, %v; want it stored at once", res, err)
	}
}

// lostAnswer marks the one caller whose commit answer the hook loses.
type lostAnswer struct{}

// TestGroupCommitAfterCommitHookPerCaller: the AfterCommit test hook (an
// answer lost after a successful COMMIT) runs for each caller of a group
// commit with the caller's own context, as it does for a transaction of its
// own, so the crash-point suite's ambiguous commits reach steps whose
// writes were batched. Only the caller the hook picks sees the error; its
// writes are committed all the same.
func TestGroupCommitAfterCommitHookPerCaller(t *testing.T) {
	checkLeaks(t)
	s := openBatchStore(t)
	var mu sync.Mutex
	hooked := 0
	s.SetTestHooks(store.TestHooks{AfterCommit: func(ctx context.Context) error {
		mu.Lock()
		defer mu.Unlock()
		hooked++
		if ctx.Value(lostAnswer{}) != nil {
			return errBoom
		}
		return nil
	}})
	lost := context.WithValue(context.Background(), lostAnswer{}, true)
	res := runBatch(t, s, []call{
		{fn: putResource("kept-1", "a")},
		{ctx: lost, fn: putResource("lost", "a")},
		{fn: putResource("kept-2", "a")},
	}, nil)
	if st := s.WriteStats(); st.Batched < 3 {
		t.Fatalf("write stats %+v: the three calls were not one group commit", st)
	}
	mu.Lock()
	// The gate write that held the committer ran the hook too.
	if hooked != 4 {
		t.Errorf("the hook ran %d times, want once per call (3) and once for the gate write", hooked)
	}
	mu.Unlock()
	if res[0].err != nil || res[2].err != nil {
		t.Errorf("the other callers: %v, %v; want no error", res[0].err, res[2].err)
	}
	if !errors.Is(res[1].err, errBoom) || len(res[1].stamped) != 0 {
		t.Errorf("the caller whose answer was lost: %v, %v; want the hook's error", res[1].stamped, res[1].err)
	}
	if n := countRows(t, s, "lost"); n != 1 {
		t.Errorf("lost: %d rows; a lost answer does not undo a commit", n)
	}
}
