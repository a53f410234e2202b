package clusterapi_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"krane.dev/ctrl/internal/ctrltest"
	"krane.dev/ctrl/store"
	"krane.dev/internal/testenv"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
)

// reconnectingWatcher is an agent's watch loop: on any error it reconnects
// from its cursor (from 0 until a bootstrap completed).
type reconnectingWatcher struct {
	mu        sync.Mutex
	cursor    uint64
	booted    bool
	objs      map[string]uint64 // id -> version
	deleted   map[string]bool
	errs      []error
	order     []string // violations
	connected int
	boots     int // bootstraps completed
}

func (w *reconnectingWatcher) run(ctx context.Context, cli clusterv1.ClusterServiceClient, kind string) {
	for ctx.Err() == nil {
		w.mu.Lock()
		from := w.cursor
		if !w.booted {
			from = 0
		}
		w.connected++
		w.mu.Unlock()
		stream, err := cli.Watch(ctx, &clusterv1.WatchRequest{Kind: kind, AfterVersion: from})
		for err == nil {
			var ev *clusterv1.WatchEvent
			if ev, err = stream.Recv(); err != nil {
				break
			}
			w.mu.Lock()
			if bc := ev.GetBootstrapComplete(); bc != nil {
				w.booted, w.cursor = true, bc.GetMaxVersion()
				w.boots++
			}
			if c := ev.GetChange(); c != nil {
				if prev, ok := w.objs[c.GetId()]; ok && c.GetVersion() <= prev {
					w.order = append(w.order, fmt.Sprintf("%s@%d after @%d", c.GetId(), c.GetVersion(), prev))
				}
				w.objs[c.GetId()], w.deleted[c.GetId()] = c.GetVersion(), c.GetDeleted()
				if w.booted {
					w.cursor = c.GetVersion()
				}
			}
			w.mu.Unlock()
		}
		if ctx.Err() != nil {
			return
		}
		w.mu.Lock()
		w.errs = append(w.errs, err)
		w.mu.Unlock()
		select { // jittered backoff, honouring ctx
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (w *reconnectingWatcher) state() (uint64, int, int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.cursor, len(w.errs), w.connected
}

func TestStreamSurvivesMySQLRestart(t *testing.T) {
	m := testenv.SharedMySQL(t)
	if !m.Private() {
		t.Skip("the MySQL server is external (" + testenv.EnvMySQLDSN + "); only a private server can be killed and restarted")
	}
	env := ctrltest.Start(t, ctrltest.Options{Configure: fastConfig})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const kind = "widget.example.krane.dev"
	write := func(i int) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			_, err := env.Store.WriteTx(ctx, func(ctx context.Context, tx *store.Tx) error {
				return tx.PutResource(ctx, store.Resource{Kind: kind, Region: "eu", ID: fmt.Sprintf("w%d", i%7), Spec: fmt.Appendf(nil, `{"i":%d}`, i), Deleted: i%5 == 4})
			})
			if err == nil {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("write %d: %v", i, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	waitCursor := func(w *reconnectingWatcher, what string) {
		t.Helper()
		head, err := env.Store.Head(ctx)
		if err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(30 * time.Second)
		for {
			if c, _, _ := w.state(); c >= head {
				return
			}
			if time.Now().After(deadline) {
				c, _, _ := w.state()
				t.Fatalf("%s: watcher cursor %d did not reach head %d", what, c, head)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	for i := range 20 {
		write(i)
	}
	w := &reconnectingWatcher{objs: map[string]uint64{}, deleted: map[string]bool{}}
	cli := env.Cluster(t, env.ClusterToken(t, "eu", "eu-1"))
	done := make(chan struct{})
	go func() { defer close(done); w.run(ctx, cli, kind) }()
	waitCursor(w, "before the restart")

	m.Kill()
	killed := time.Now()
	for {
		if _, n, _ := w.state(); n > 0 {
			break
		}
		if time.Since(killed) > 20*time.Second {
			t.Fatal("the stream did not notice the database was gone within 20s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("stream ended %s after the database was killed", time.Since(killed).Round(time.Millisecond))
	time.Sleep(time.Second) // let reconnect attempts fail against the dead database
	if err := m.Start(); err != nil {
		t.Fatal(err)
	}
	for i := 20; i < 40; i++ {
		write(i)
	}
	waitCursor(w, "after the restart")
	cancel()
	<-done

	w.mu.Lock()
	defer w.mu.Unlock()
	for _, err := range w.errs {
		if status.Code(err) != codes.Unavailable {
			t.Errorf("stream error %v: want UNAVAILABLE (a clean, retryable error)", err)
		}
	}
	if len(w.order) > 0 {
		t.Errorf("per-object order violated: %v", w.order)
	}
	for i := range 7 {
		id := fmt.Sprintf("w%d", i)
		c, err := env.Store.Desired(context.Background(), kind, "eu", id)
		if err != nil {
			t.Fatal(err)
		}
		if w.objs[id] != c.Version || w.deleted[id] != c.Deleted {
			t.Errorf("%s: watcher has version %d deleted=%v, database has %d deleted=%v", id, w.objs[id], w.deleted[id], c.Version, c.Deleted)
		}
	}
	t.Logf("%d stream errors while the database was down (all UNAVAILABLE), %d connections in all; nothing lost", len(w.errs), w.connected)
}
