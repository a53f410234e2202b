package cli_test

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"krane.dev/ctrl/internal/ctrltest"
	"krane.dev/ctrl/rules"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
)

// TestClusterRemoveEndsItsStreamDeletesItsRowsAndStopsHoldingDeploysBack:
// region eu has two live clusters; a deploy there waits for both. `ctrl
// cluster remove eu-2` ends eu-2's open stream, deletes what it reported,
// drops it from `ctrl cluster list`, records who removed it, and the
// deploy, which waited for eu-2, becomes ready on eu-1 alone.
func TestClusterRemoveEndsItsStreamDeletesItsRowsAndStopsHoldingDeploysBack(t *testing.T) {
	env, clusters := deployEnv(t)
	ctx := context.Background()
	eu2 := env.FakeCluster(t, "eu", "eu-2")
	stream, err := eu2.Client.Watch(ctx, &clusterv1.WatchRequest{Kind: "deployment"})
	if err != nil {
		t.Fatal(err)
	}
	for {
		ev, err := stream.Recv()
		if err != nil {
			t.Fatalf("eu-2's stream before the removal: %v", err)
		}
		if ev.GetBootstrapComplete() != nil {
			break
		}
	}

	ch := runAsync(t, append(create, "--environment", "prod", "--image", "registry.test/app:1", "--region", "eu", "--wait")...)
	id := newDeployment(t, env, "prod")
	clusters["eu"].ReportRunning(t, id, 1)
	eu2.Report(t, id, ctrltest.Pending("app-eu2-0", "ContainerCreating"))
	states, err := env.Store.RegionStates(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if o := rules.Evaluate(states[id]); o.Decided() || !strings.Contains(o.Message, "cluster eu-2: 0/1 running") {
		t.Fatalf("the deploy with eu-2 live: %+v, want it waiting for eu-2", o)
	}

	code, out, errOut := run(t, "cluster", "remove", "eu-2", "--db-dsn", env.DSN)
	if code != 0 || !strings.Contains(out, "removed cluster eu-2 of region eu: 1 token(s) revoked") {
		t.Fatalf("cluster remove: %d\n%s%s", code, out, errOut)
	}
	for {
		_, err := stream.Recv()
		if err == nil {
			continue
		}
		if status.Code(err) != codes.Unauthenticated {
			t.Fatalf("eu-2's stream ended with %v, want UNAUTHENTICATED (its token was revoked)", err)
		}
		break
	}
	for _, table := range []string{"object_reports", "instances", "apply_errors", "clusters"} {
		col := "cluster_id"
		if table == "clusters" {
			col = "id"
		}
		var n int
		if err := env.Store.DB().QueryRow("SELECT COUNT(*) FROM " + table + " WHERE " + col + " = 'eu-2'").Scan(&n); err != nil || n != 0 {
			t.Errorf("%d rows of eu-2 left in %s (%v)", n, table, err)
		}
	}
	if r := await(t, ch); r.code != 0 {
		t.Fatalf("the deploy after eu-2 was removed: exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.out, r.errOut)
	}
	if code, out, _ := run(t, "cluster", "list", "--db-dsn", env.DSN); code != 0 || strings.Contains(out, "eu-2") || !strings.Contains(out, "eu-1") {
		t.Fatalf("cluster list after the removal:\n%s", out)
	}
	if code, out, _ := run(t, "cluster", "audit", "--db-dsn", env.DSN); code != 0 || !strings.Contains(out, " eu-2 ") || !strings.Contains(out, "ctrl cluster remove (database)") || !strings.Contains(out, "1 tokens revoked") {
		t.Fatalf("cluster audit:\n%s", out)
	}
	if code, _, errOut := run(t, "cluster", "remove", "eu-2", "--db-dsn", env.DSN); code == 0 || !strings.Contains(errOut, `no cluster "eu-2" is registered`) {
		t.Fatalf("removing it again: %d %s", code, errOut)
	}
}
