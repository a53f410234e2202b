package clusterapi_test

import (
	"context"
	"testing"

	"krane.dev/ctrl/deploytrace"
	"krane.dev/ctrl/internal/ctrltest"
	"krane.dev/ctrl/store"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
	"krane.dev/shared/kinds"
)

// TestDeploymentChangesCarryTheDeploysTraceWhileItRuns: a deployment's
// change carries its deploy's trace context (the events.emit span) while
// the deploy is in progress, and none before or after, so a later apply of
// the same object (a resync, a scale) does not join a finished trace.
func TestDeploymentChangesCarryTheDeploysTraceWhileItRuns(t *testing.T) {
	env := ctrltest.Start(t, ctrltest.Options{Configure: fastConfig})
	ctx := context.Background()
	putDeployment(t, env.Store, "d1", "eu", "app:1", 1, "running")
	cli := env.Cluster(t, env.ClusterToken(t, "eu", "eu-1"))
	traceparent := func() string {
		t.Helper()
		rc, err := cli.GetDesiredState(ctx, &clusterv1.GetDesiredStateRequest{Kind: kinds.Deployment, Id: "d1"})
		if err != nil {
			t.Fatal(err)
		}
		return rc.GetTraceparent()
	}
	move := func(from, to string) {
		t.Helper()
		if ok, cur, err := env.Store.TransitionDeployment(ctx, "d1", []string{from}, to, ""); err != nil || !ok {
			t.Fatalf("%s -> %s: %v %s %v", from, to, ok, cur, err)
		}
	}
	if tp := traceparent(); tp != "" {
		t.Fatalf("pending deployment's change carries %q, want no trace context", tp)
	}
	want := deploytrace.TraceParent("d1")
	move(store.StatusPending, store.StatusDeploying)
	if tp := traceparent(); tp != want {
		t.Fatalf("deploying: traceparent %q, want %q", tp, want)
	}
	move(store.StatusDeploying, store.StatusNetwork)
	if tp := traceparent(); tp != want {
		t.Fatalf("network: traceparent %q, want %q", tp, want)
	}
	move(store.StatusNetwork, store.StatusReady)
	if tp := traceparent(); tp != "" {
		t.Fatalf("ready deployment's change carries %q, want none", tp)
	}
	if sc := deploytrace.SpanContext("d1", deploytrace.EventsEmit); want != "00-"+sc.TraceID().String()+"-"+sc.SpanID().String()+"-01" || !sc.IsValid() {
		t.Fatalf("traceparent %q does not name the events.emit span %v", want, sc)
	}
}
