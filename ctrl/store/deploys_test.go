package store_test

import (
	"context"
	"slices"
	"testing"

	"krane.dev/ctrl/deployspec"
	"krane.dev/ctrl/store"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
	"krane.dev/shared/kinds"
)

// deployTopology writes a deployment with a running topology row and an
// ingress policy in each region, stamped, as the deploy workflow does.
func deployTopology(t *testing.T, s *store.Store, id string, regions ...string) {
	t.Helper()
	ctx := context.Background()
	if _, _, err := s.CreateDeployment(ctx, store.Deployment{Spec: deployspec.Spec{ID: id, WorkspaceID: "ws", ProjectID: "p", EnvironmentID: "env", AppID: "app", K8sNamespace: "ns", K8sName: "d-" + id, Replicas: 1, Workload: &clusterv1.Workload{Image: "registry.test/app:1", CpuMillicores: 100, MemoryMib: 128}}}, ""); err != nil {
		t.Fatal(err)
	}
	var refs []store.Ref
	if _, err := s.WriteTx(ctx, func(ctx context.Context, tx *store.Tx) error {
		refs = nil
		for _, r := range regions {
			if err := tx.PutTopologyContent(ctx, store.Topology{DeploymentID: id, Region: r, DesiredReplicas: 1}); err != nil {
				return err
			}
			p := store.CiliumNetworkPolicy{ID: store.IngressPolicyID(id, r), Region: r, K8sNamespace: "ns", K8sName: "d-" + id + "-ingress", Policy: []byte(`{}`)}
			if err := tx.PutCiliumNetworkPolicyContent(ctx, p); err != nil {
				return err
			}
			refs = append(refs, store.Ref{Kind: kinds.Deployment, Region: r, ID: id}, store.Ref{Kind: kinds.CiliumNetworkPolicy, Region: r, ID: p.ID})
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.StampCommitted(ctx, refs, ""); err != nil {
		t.Fatal(err)
	}
}

// TestStopTopologyRunTwiceReturnsTheSameRefs: the deploy workflow's failure
// cleanup stops the topology in one step and stamps the refs it returns in
// the next. When the step runs twice, the second run must return the
// ingress policies too, although their delete committed in the first run;
// otherwise the delete is never versioned and never reaches a cluster.
func TestStopTopologyRunTwiceReturnsTheSameRefs(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	deployTopology(t, s, "dep_stop", "eu", "us")
	stop := func() []store.Ref {
		var refs []store.Ref
		if _, err := s.WriteTx(ctx, func(ctx context.Context, tx *store.Tx) error {
			var err error
			refs, err = tx.StopTopology(ctx, "dep_stop", false)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return refs
	}
	first, second := stop(), stop()
	want := []store.Ref{
		{Kind: kinds.Deployment, Region: "eu", ID: "dep_stop"}, {Kind: kinds.Deployment, Region: "us", ID: "dep_stop"},
		{Kind: kinds.CiliumNetworkPolicy, Region: "eu", ID: store.IngressPolicyID("dep_stop", "eu")},
		{Kind: kinds.CiliumNetworkPolicy, Region: "us", ID: store.IngressPolicyID("dep_stop", "us")},
	}
	if !slices.Equal(first, want) {
		t.Fatalf("first run: refs %v, want %v", first, want)
	}
	if !slices.Equal(second, first) {
		t.Fatalf("second run: refs %v, want the first run's %v", second, first)
	}
}
