package clusterapi_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"krane.dev/ctrl/internal/ctrltest"
	"krane.dev/ctrl/serve"
	"krane.dev/ctrl/store"
)

// TestStreamsAgedOutResumeWithoutBootstrap: ctrl sends a connection away
// once it is grpc.max_connection_age old (and closes it after the grace),
// so agents' streams spread over the replicas again after a roll. A
// watcher that reconnects from its cursor, as krane's does, is closed
// UNAVAILABLE twice, resumes each time without a second bootstrap, and
// still receives what is written afterwards.
func TestStreamsAgedOutResumeWithoutBootstrap(t *testing.T) {
	env := ctrltest.Start(t, ctrltest.Options{Configure: func(c *serve.Config) {
		fastConfig(c)
		c.GRPC.MaxConnectionAge, c.GRPC.MaxConnectionAgeGrace = time.Second, 200*time.Millisecond
	}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	put := func(id string) {
		t.Helper()
		if _, err := env.Store.WriteTx(ctx, func(ctx context.Context, tx *store.Tx) error {
			return tx.PutResource(ctx, store.Resource{Kind: genericKind, Region: "eu", ID: id, Spec: []byte(`{}`)})
		}); err != nil {
			t.Fatal(err)
		}
	}
	put("before")
	w := &reconnectingWatcher{objs: map[string]uint64{}, deleted: map[string]bool{}}
	cli := env.Cluster(t, env.ClusterToken(t, "eu", "eu-1"))
	done := make(chan struct{})
	go func() { defer close(done); w.run(ctx, cli, genericKind) }()
	defer func() { cancel(); <-done }()
	waitFor(t, "two streams closed by the connection's age", func() bool { _, n, _ := w.state(); return n >= 2 })
	put("after")
	head, err := env.Store.Head(ctx)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the watcher at the head", func() bool { c, _, _ := w.state(); return c >= head })
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, err := range w.errs {
		if status.Code(err) != codes.Unavailable {
			t.Fatalf("a stream ended with %v, want UNAVAILABLE (the connection aged out)", err)
		}
	}
	if w.boots != 1 || w.objs["after"] == 0 {
		t.Fatalf("%d bootstraps over %d streams, %q at version %d; want one bootstrap, the rest resumed from the cursor, and the later write received",
			w.boots, w.connected, "after", w.objs["after"])
	}
}
