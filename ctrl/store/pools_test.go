package store_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"krane.dev/ctrl/store"
	"krane.dev/internal/testenv"
)

// TestIngestionCannotTakeTheOperatorsConnections: six report batches at
// once, each held inside its transaction, take the two connections of
// the ingestion pool and wait for more there; an operator's desired-state
// write (the one ScaleDeployment makes) still gets a connection of the
// main pool, although that pool has only three, and commits while they
// wait. Ingestion saturating is invisible to the operator's path.
func TestIngestionCannotTakeTheOperatorsConnections(t *testing.T) {
	s := openDSN(t, testenv.SharedMySQL(t).Database(t, t.Name()), store.PoolOptions{MaxOpenConns: 3, IngestConns: 2})
	ctx := context.Background()
	const kind, batches = "configmap.example.krane.dev", 6
	var ids []string
	for i := range batches {
		ids = append(ids, fmt.Sprintf("eu-%d", i))
	}
	liveClusters(t, s, "eu", ids...)
	if _, err := s.WriteTx(ctx, func(ctx context.Context, tx *store.Tx) error {
		return tx.PutResource(ctx, store.Resource{Kind: kind, Region: "eu", ID: "o", Spec: []byte(`{}`)})
	}); err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	defer unblock()
	s.SetTestHooks(store.TestHooks{BeforeReportCommit: func(context.Context, int) { <-release }})
	done := make(chan error, batches)
	for _, id := range ids {
		go func() {
			_, err := s.Ingest(ctx, []store.Report{{Kind: kind, Region: "eu", ClusterID: id, ID: "o",
				Obs: store.Observation{Version: 1, At: time.Now()}, Status: []byte(`{"ok":true}`)}})
			done <- err
		}()
	}
	deadline := time.Now().Add(time.Minute)
	for st := s.IngestStats(); st.InUse < 2 || st.WaitCount < batches-2; st = s.IngestStats() {
		if time.Now().After(deadline) {
			t.Fatalf("ingestion pool %+v: want its 2 connections in use and the other %d batches waiting", st, batches-2)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The deadline only bounds a failing test.
	octx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := s.WriteTx(octx, func(ctx context.Context, tx *store.Tx) error {
		return putDeployment(ctx, tx, "d1", "eu", "img:1", 3, "running")
	}); err != nil {
		t.Fatalf("an operator's write with ingestion saturated: %v", err)
	}
	if st := s.IngestStats(); st.OpenConnections > 2 {
		t.Fatalf("ingestion pool has %d connections open, more than its 2", st.OpenConnections)
	}
	unblock()
	for range batches {
		if err := <-done; err != nil {
			t.Fatalf("a held report batch: %v", err)
		}
	}
}
