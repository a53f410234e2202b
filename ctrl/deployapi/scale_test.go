package deployapi_test

//lint:file-ignore SA1019 legacy-workload: removed no earlier than v0.3.0 (docs/compatibility.md); this file builds or reads the deprecated top-level workload fields

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	clusterv1 "krane.dev/proto/krane/cluster/v1"
	ctrlv1 "krane.dev/proto/krane/ctrl/v1"

	"krane.dev/ctrl/internal/ctrltest"
	"krane.dev/internal/testenv"
)

// desiredReplicas is what the region's clusters are told to run.
func desiredReplicas(t *testing.T, c *ctrltest.FakeCluster, id string) (int32, uint64) {
	t.Helper()
	st, err := c.Client.GetDesiredDeploymentState(context.Background(), &clusterv1.GetDesiredDeploymentStateRequest{DeploymentId: id})
	if err != nil {
		t.Fatal(err)
	}
	return st.GetApply().GetReplicas(), st.GetVersion()
}

// TestScaleChangesReplicasInPlace: scaling a ready deployment gives every
// region the new count at a new version, records who did it, and changes
// nothing when the count is already right; bad requests name the field.
func TestScaleChangesReplicasInPlace(t *testing.T) {
	env := ctrltest.Start(t, ctrltest.Options{Restate: testenv.SharedRestate(t)})
	api := env.Deployments(t)
	eu := env.FakeCluster(t, "eu", "eu-1")
	ctx := context.Background()

	d := deploy(t, api, eu, req("env-s", "registry.test/app:1"))
	n, v0 := desiredReplicas(t, eu, d.GetId())
	if n != 1 {
		t.Fatalf("before scaling the cluster is told %d replicas, want 1", n)
	}

	resp, err := api.ScaleDeployment(ctx, &ctrlv1.ScaleDeploymentRequest{DeploymentId: d.GetId(), Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetPreviousReplicas() != 1 || resp.GetReplicas() != 3 {
		t.Fatalf("scale response %v, want 1 -> 3", resp)
	}
	n, v1 := desiredReplicas(t, eu, d.GetId())
	if n != 3 || v1 <= v0 {
		t.Fatalf("after scaling the cluster is told %d replicas at version %d, want 3 above version %d", n, v1, v0)
	}
	got, err := api.GetDeployment(ctx, &ctrlv1.GetDeploymentRequest{DeploymentId: d.GetId()})
	if err != nil {
		t.Fatal(err)
	}
	if got.GetReplicas() != 3 || got.GetRegions()[0].GetDesiredReplicas() != 3 || got.GetStatus() != ready || got.GetImage() != "registry.test/app:1" {
		t.Fatalf("after scaling: replicas %d, region desired %d, %s, image %s", got.GetReplicas(), got.GetRegions()[0].GetDesiredReplicas(), got.GetStatus(), got.GetImage())
	}
	events, err := env.Store.DeploymentEvents(ctx, d.GetId())
	if err != nil {
		t.Fatal(err)
	}
	if last := events[len(events)-1].Message; !strings.Contains(last, "scaled from 1 to 3 replicas per region by test operator") {
		t.Fatalf("last history entry %q, want the scale and who did it", last)
	}

	// The same count again: no new version, no history entry.
	if _, err := api.ScaleDeployment(ctx, &ctrlv1.ScaleDeploymentRequest{DeploymentId: d.GetId(), Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	if _, v2 := desiredReplicas(t, eu, d.GetId()); v2 != v1 {
		t.Fatalf("scaling to the current count moved the version %d -> %d", v1, v2)
	}
	if again, _ := env.Store.DeploymentEvents(ctx, d.GetId()); len(again) != len(events) {
		t.Fatalf("scaling to the current count added %d history entries", len(again)-len(events))
	}

	for _, bad := range []int32{0, -1, 1001} {
		_, err := api.ScaleDeployment(ctx, &ctrlv1.ScaleDeploymentRequest{DeploymentId: d.GetId(), Replicas: bad})
		if code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "replicas") {
			t.Errorf("scale to %d: %v, want InvalidArgument naming replicas", bad, err)
		}
	}
	if _, err := api.ScaleDeployment(ctx, &ctrlv1.ScaleDeploymentRequest{DeploymentId: "dep_missing", Replicas: 2}); code(err) != codes.NotFound {
		t.Errorf("scale of an unknown deployment: %v, want NotFound", err)
	}

	// A stopped deployment is not scaled back to life.
	if _, err := api.StopDeployment(ctx, &ctrlv1.StopDeploymentRequest{DeploymentId: d.GetId()}); err != nil {
		t.Fatal(err)
	}
	_, err = api.ScaleDeployment(ctx, &ctrlv1.ScaleDeploymentRequest{DeploymentId: d.GetId(), Replicas: 2})
	if code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "stopped") {
		t.Fatalf("scale of a stopped deployment: %v, want FailedPrecondition saying it is stopped", err)
	}
	if _, deleted := eu.Version(t, d.GetId()); !deleted {
		t.Fatal("a refused scale brought the stopped deployment back")
	}
}

// TestDeploymentInfoReplicasAreWhatTheClustersAreAskedFor: GetDeployment
// and ListDeployments show the replicas per region the clusters are told
// to run now: the scaled count after a scale, and none once the
// deployment is stopped (its regions' clusters are told to delete it).
// Before this, replicas kept the last count written to the deployment's
// row, so a stopped deployment still showed its replicas.
func TestDeploymentInfoReplicasAreWhatTheClustersAreAskedFor(t *testing.T) {
	env := ctrltest.Start(t, ctrltest.Options{Restate: testenv.SharedRestate(t)})
	api := env.Deployments(t)
	eu := env.FakeCluster(t, "eu", "eu-1")
	ctx := context.Background()

	d := deploy(t, api, eu, req("env-r", "registry.test/app:1"))
	check := func(when string, want int32) {
		t.Helper()
		if n, _ := desiredReplicas(t, eu, d.GetId()); n != want && want > 0 {
			t.Fatalf("%s: the cluster is told %d replicas, want %d", when, n, want)
		}
		got, err := api.GetDeployment(ctx, &ctrlv1.GetDeploymentRequest{DeploymentId: d.GetId()})
		if err != nil {
			t.Fatal(err)
		}
		list, err := api.ListDeployments(ctx, &ctrlv1.ListDeploymentsRequest{EnvironmentId: "env-r"})
		if err != nil {
			t.Fatal(err)
		}
		if got.GetReplicas() != want || len(list.GetDeployments()) != 1 || list.GetDeployments()[0].GetReplicas() != want {
			t.Fatalf("%s: GetDeployment says %d replicas, ListDeployments %v; the clusters are asked for %d", when, got.GetReplicas(), list.GetDeployments(), want)
		}
	}
	check("after the deploy", 1)
	if _, err := api.ScaleDeployment(ctx, &ctrlv1.ScaleDeploymentRequest{DeploymentId: d.GetId(), Replicas: 4}); err != nil {
		t.Fatal(err)
	}
	check("after a scale to 4", 4)
	if _, err := api.StopDeployment(ctx, &ctrlv1.StopDeploymentRequest{DeploymentId: d.GetId()}); err != nil {
		t.Fatal(err)
	}
	if _, deleted := eu.Version(t, d.GetId()); !deleted {
		t.Fatal("the stopped deployment is not deleted in its region")
	}
	check("after a stop", 0)
}
