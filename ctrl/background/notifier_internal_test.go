package background

import (
	"context"
	"fmt"
	"testing"
	"time"

	"krane.dev/ctrl/deployspec"
	"krane.dev/ctrl/store"
	"krane.dev/internal/testenv"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
)

func openTestStore(t *testing.T, dsn string, pool store.PoolOptions) *store.Store {
	t.Helper()
	ctx := context.Background()
	st, err := store.Open(ctx, dsn, pool)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if _, err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return st
}

// createInStatus writes n deployments in status, last changed at
// updated, and returns their ids.
func createInStatus(t *testing.T, st *store.Store, prefix, status string, updated time.Time, n int) []string {
	t.Helper()
	ctx := context.Background()
	var ids []string
	for i := range n {
		id := fmt.Sprintf("%s%03d", prefix, i)
		if _, _, err := st.CreateDeployment(ctx, store.Deployment{Spec: deployspec.Spec{ID: id, WorkspaceID: "ws", ProjectID: "p", EnvironmentID: "env-" + id, AppID: "a", K8sNamespace: "ws-ws", K8sName: id, Replicas: 1, Workload: &clusterv1.Workload{Image: "registry.test/app:1", CpuMillicores: 100, MemoryMib: 64}}}, ""); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if _, err := st.DB().ExecContext(ctx, "UPDATE deployments SET status = ?, updated_at = ? WHERE id LIKE ?", status, updated.UnixMilli(), prefix+"%"); err != nil {
		t.Fatal(err)
	}
	return ids
}

// TestResyncReachesEveryRowPastStuckOnes: deployments stuck in network
// (their clusters never report) are the oldest rows and never change. A
// resync pass that took only the oldest batch would look at them forever
// and never at the deployment behind them.
func TestResyncReachesEveryRowPastStuckOnes(t *testing.T) {
	st := openTestStore(t, testenv.SharedMySQL(t).Database(t, t.Name()), store.PoolOptions{})
	stuck := createInStatus(t, st, "dep-stuck-", store.StatusNetwork, time.Now().Add(-time.Hour), 7)
	fresh := createInStatus(t, st, "dep-fresh-", store.StatusNetwork, time.Now().Add(-time.Minute), 2)
	n := NewNotifier(NotifierOptions{Store: st, ResyncBatch: 3, QueueSize: 100})
	n.resync(context.Background())
	n.deploys.mu.Lock()
	defer n.deploys.mu.Unlock()
	for _, id := range append(stuck, fresh...) {
		if !n.deploys.pending[id] {
			t.Errorf("deployment %s in network was not queued by the resync pass (queued: %v)", id, n.deploys.pending)
		}
	}
}

// TestResyncDatabaseCallsHaveDeadlines: with the database unreachable
// (connections open, no byte flowing: a network partition), a resync pass
// ends within its per-call deadlines instead of hanging the Notifier.
func TestResyncDatabaseCallsHaveDeadlines(t *testing.T) {
	dsn, proxy := testenv.SharedMySQL(t).DatabaseBehindProxy(t, t.Name())
	st := openTestStore(t, dsn, store.PoolOptions{})
	createInStatus(t, st, "dep-net-", store.StatusNetwork, time.Now().Add(-time.Hour), 2)
	n := NewNotifier(NotifierOptions{Store: st, DBTimeout: 500 * time.Millisecond})
	proxy.Stall()
	defer proxy.Restore()
	done := make(chan struct{})
	go func() { n.resync(context.Background()); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("a resync pass hung for 30s on a stalled database: its calls need deadlines")
	}
}

// TestResyncRotatesWhenTheQueueIsFull: when more deployments need a look
// than the queue holds, a pass stops at the full queue and the next pass
// goes on from there, so the same oldest rows do not fill it every time.
func TestResyncRotatesWhenTheQueueIsFull(t *testing.T) {
	st := openTestStore(t, testenv.SharedMySQL(t).Database(t, t.Name()), store.PoolOptions{})
	ids := createInStatus(t, st, "dep-rot-", store.StatusNetwork, time.Now().Add(-time.Hour), 10)
	n := NewNotifier(NotifierOptions{Store: st, ResyncBatch: 3, QueueSize: 4})
	seen := map[string]int{}
	for range 3 {
		n.resync(context.Background())
		for len(n.deploys.ch) > 0 { // what the workers would take
			id := <-n.deploys.ch
			n.deploys.taken(id)
			seen[id]++
		}
	}
	for _, id := range ids {
		if seen[id] == 0 {
			t.Errorf("deployment %s was never queued in 3 passes of a queue of 4 (queued: %v)", id, seen)
		}
	}
}

// TestReportsOfFinishedDeploysAreNotRead: once the Notifier read a
// deployment at ready (or failed, or stopped), its clusters' reports no
// longer queue it: no deploy of it waits, and at a thousand clusters every
// change's reports would each cost a read. A deployment still in progress
// (or pending) keeps being queued.
func TestReportsOfFinishedDeploysAreNotRead(t *testing.T) {
	st := openTestStore(t, testenv.SharedMySQL(t).Database(t, t.Name()), store.PoolOptions{})
	ready := createInStatus(t, st, "dep-ready-", store.StatusReady, time.Now(), 1)[0]
	pending := createInStatus(t, st, "dep-pend-", store.StatusPending, time.Now(), 1)[0]
	n := NewNotifier(NotifierOptions{Store: st})
	ctx := context.Background()
	take := func() []string {
		var out []string
		for len(n.deploys.ch) > 0 {
			id := <-n.deploys.ch
			n.deploys.taken(id)
			out = append(out, id)
		}
		return out
	}
	for _, id := range []string{ready, pending} {
		n.DeploymentReported(ctx, id, "eu")
		n.evaluate(ctx, id)
	}
	take()
	n.DeploymentReported(ctx, ready, "eu")
	n.DeploymentReported(ctx, pending, "eu")
	if got := take(); fmt.Sprint(got) != fmt.Sprint([]string{pending}) {
		t.Fatalf("queued after one evaluation each: %v, want only the pending deployment", got)
	}
}

func TestMain(m *testing.M) { testenv.Main(m) }
