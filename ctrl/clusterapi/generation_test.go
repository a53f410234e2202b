package clusterapi_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"krane.dev/ctrl/internal/ctrltest"
	"krane.dev/ctrl/store"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
	"krane.dev/shared/kinds"
)

// Every stream states the database generation of its versions, and a
// stream resuming from a cursor of another history (ahead of the head, or
// of another generation) is refused with OUT_OF_RANGE, the code on which
// krane bootstraps the kind again; a bootstrap is never refused.
func TestWatchRefusesACursorFromAnotherHistory(t *testing.T) {
	env := ctrltest.Start(t, ctrltest.Options{Configure: fastConfig})
	v1 := putDeployment(t, env.Store, "d1", "eu", "app:1", 2, "running")
	cli := env.Cluster(t, env.ClusterToken(t, "eu", "eu-1"))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	g0, err := env.Store.Generation(ctx)
	if err != nil {
		t.Fatal(err)
	}
	boot, err := cli.Watch(ctx, &clusterv1.WatchRequest{Kind: kinds.Deployment})
	if err != nil {
		t.Fatal(err)
	}
	recv(t, boot.Recv) // d1
	if bc := recv(t, boot.Recv).GetBootstrapComplete(); bc.GetMaxVersion() != v1 || bc.GetGeneration() != g0 {
		t.Fatalf("BootstrapComplete %v; want max %d, generation %s", bc, v1, g0)
	}
	resumed, err := cli.Watch(ctx, &clusterv1.WatchRequest{Kind: kinds.Deployment, AfterVersion: v1, Generation: g0})
	if err != nil {
		t.Fatal(err)
	}
	if ka := recv(t, resumed.Recv).GetKeepAlive(); ka.GetGeneration() != g0 {
		t.Fatalf("first event of a resumed stream %v; want a KeepAlive stating generation %s", ka, g0)
	}

	refused := func(what string, req *clusterv1.WatchRequest) {
		t.Helper()
		st, err := cli.Watch(ctx, req)
		if err == nil {
			_, err = st.Recv()
		}
		if status.Code(err) != codes.OutOfRange {
			t.Fatalf("%s: %v; want OUT_OF_RANGE", what, err)
		}
	}
	// One cluster says the database went back (its cursor is ahead of the
	// head): refused, but its word alone does not move the fleet: another
	// host's cursor of the same generation is still served.
	if _, err := env.Store.DB().ExecContext(ctx, "UPDATE db_generation SET updated_at = updated_at - ?", (store.ClaimWindow + time.Minute).Milliseconds()); err != nil {
		t.Fatal(err)
	}
	refused("a cursor ahead of the head", &clusterv1.WatchRequest{Kind: kinds.Deployment, AfterVersion: v1 + 10, Generation: g0})
	other := env.Cluster(t, env.ClusterToken(t, "eu", "eu-2"))
	still, err := other.Watch(ctx, &clusterv1.WatchRequest{Kind: kinds.Deployment, AfterVersion: v1, Generation: g0})
	if err != nil {
		t.Fatal(err)
	}
	if ka := recv(t, still.Recv).GetKeepAlive(); ka.GetGeneration() != g0 {
		t.Fatalf("another host's stream after one cluster's claim: %v; want it served in generation %s", ka, g0)
	}
	// A second cluster agrees: the database takes a new generation, and a
	// cursor of the old one, though at or below the head, is refused too.
	st2, err := other.Watch(ctx, &clusterv1.WatchRequest{Kind: kinds.Deployment, AfterVersion: v1 + 7, Generation: g0})
	if err == nil {
		_, err = st2.Recv()
	}
	if status.Code(err) != codes.OutOfRange {
		t.Fatalf("the second cluster's claim: %v; want OUT_OF_RANGE", err)
	}
	refused("a cursor of the old generation", &clusterv1.WatchRequest{Kind: kinds.Deployment, AfterVersion: v1, Generation: g0})
	if got := metricValue(t, env, `krane_ctrl_cursor_refused_total{region="eu",why="ahead-of-head"}`); got != 2 {
		t.Errorf("cursors refused ahead of the head: %v; want 2 counted", got)
	}
	// The typed watches carry no generation: a cursor ahead is refused.
	tw, err := cli.WatchDeployments(ctx, &clusterv1.WatchDeploymentsRequest{VersionLastSeen: v1 + 10})
	if err == nil {
		_, err = tw.Recv()
	}
	if status.Code(err) != codes.OutOfRange {
		t.Fatalf("a typed watch ahead of the head: %v; want OUT_OF_RANGE", err)
	}
	// The bootstrap that follows states the new generation.
	g1, err := env.Store.Generation(ctx)
	if err != nil || g1 == g0 {
		t.Fatalf("generation %q, %v; want a new one", g1, err)
	}
	again, err := cli.Watch(ctx, &clusterv1.WatchRequest{Kind: kinds.Deployment})
	if err != nil {
		t.Fatal(err)
	}
	recv(t, again.Recv) // d1
	if bc := recv(t, again.Recv).GetBootstrapComplete(); bc.GetGeneration() != g1 {
		t.Fatalf("BootstrapComplete %v; want generation %s", bc, g1)
	}
}
