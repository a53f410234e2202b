package fleetapi_test

import (
	"context"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"krane.dev/ctrl/internal/ctrltest"
	"krane.dev/ctrl/store"
	"krane.dev/internal/kinds"
	"krane.dev/internal/testenv"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
	ctrlv1 "krane.dev/proto/krane/ctrl/v1"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func putPolicy(t *testing.T, st *store.Store, id, region string) uint64 {
	t.Helper()
	stamped, err := st.WriteTx(context.Background(), func(ctx context.Context, tx *store.Tx) error {
		return tx.PutCiliumNetworkPolicy(ctx, store.CiliumNetworkPolicy{ID: id, Region: region, K8sNamespace: "ns", K8sName: id, Policy: []byte(`{}`)})
	})
	if err != nil {
		t.Fatal(err)
	}
	return stamped[len(stamped)-1].Version
}

// TestListClustersShowsHeartbeatsLagAndApplyErrors: per cluster, the last
// heartbeat and agent version; per kind the reported cursor against the
// newest version of the cluster's region, and the objects it could not
// apply. Heartbeat data the cluster does not send stays unreported.
func TestListClustersShowsHeartbeatsLagAndApplyErrors(t *testing.T) {
	env := ctrltest.Start(t, ctrltest.Options{})
	ctx := context.Background()
	euTok := env.ClusterToken(t, "eu", "eu-1")
	env.ClusterToken(t, "us", "us-1") // never sends a heartbeat
	v1 := putPolicy(t, env.Store, "pol-1", "eu")
	if _, err := env.Cluster(t, euTok).Heartbeat(ctx, &clusterv1.HeartbeatRequest{
		AgentVersion: "1.2.3", Cursors: map[string]uint64{kinds.CiliumNetworkPolicy: v1, kinds.Deployment: 0},
	}); err != nil {
		t.Fatal(err)
	}
	v2 := putPolicy(t, env.Store, "pol-2", "eu") // after the heartbeat: eu-1 is behind on it
	if err := env.Store.ReportApplyError(ctx, kinds.CiliumNetworkPolicy, "eu", "eu-1", "pol-2",
		&clusterv1.ApplyError{Version: v2, Message: "bad policy", Permanent: true}, v2); err != nil {
		t.Fatal(err)
	}

	api := ctrlv1.NewFleetServiceClient(env.Dial(t, env.OperatorToken(t, "fleet")))
	resp, err := api.ListClusters(ctx, &ctrlv1.ListClustersRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.GetClusters()) != 2 || resp.GetClusters()[0].GetId() != "eu-1" || resp.GetClusters()[1].GetId() != "us-1" {
		t.Fatalf("clusters: %v", resp.GetClusters())
	}
	eu, us := resp.GetClusters()[0], resp.GetClusters()[1]
	if eu.GetLastHeartbeatAt() == nil || eu.GetAgentVersion() != "1.2.3" || eu.GetActiveTokens() != 1 || eu.GetRegion() != "eu" {
		t.Fatalf("eu-1: %v", eu)
	}
	if eu.GetControllersReported() || len(eu.GetControllers()) != 0 {
		t.Fatalf("eu-1 reports controllers its heartbeat never sent: %v", eu)
	}
	byKind := map[string]*ctrlv1.KindProgress{}
	for _, k := range eu.GetKinds() {
		byKind[k.GetKind()] = k
		if k.Parked != nil {
			t.Errorf("kind %s: parked %d, but no heartbeat reports parked objects", k.GetKind(), k.GetParked())
		}
	}
	cnp := byKind[kinds.CiliumNetworkPolicy]
	if cnp == nil || cnp.Cursor == nil || cnp.GetCursor() != v1 || cnp.GetHeadVersion() != v2 || !cnp.GetBehind() || cnp.GetApplyErrors() != 1 {
		t.Fatalf("ciliumnetworkpolicy of eu-1: %v (want cursor %d, head %d, behind, 1 apply error)", cnp, v1, v2)
	}
	dep := byKind[kinds.Deployment]
	if dep == nil || dep.Cursor == nil || dep.GetCursor() != 0 || dep.GetHeadVersion() != 0 || dep.GetBehind() {
		t.Fatalf("deployment of eu-1 (nothing desired, cursor 0): %v", dep)
	}
	if us.GetLastHeartbeatAt() != nil || len(us.GetKinds()) != 0 {
		t.Fatalf("us-1 never sent a heartbeat and its region has nothing desired: %v", us)
	}

	// us gets a change: us-1, with no cursor reported, is behind.
	putPolicy(t, env.Store, "pol-us", "us")
	resp, err = api.ListClusters(ctx, &ctrlv1.ListClustersRequest{Region: "us"})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.GetClusters()) != 1 || len(resp.GetClusters()[0].GetKinds()) != 1 {
		t.Fatalf("region us: %v", resp.GetClusters())
	}
	if k := resp.GetClusters()[0].GetKinds()[0]; k.Cursor != nil || !k.GetBehind() {
		t.Fatalf("us-1 without a cursor: %v (want no cursor, behind)", k)
	}

	// Operators only.
	_, err = ctrlv1.NewFleetServiceClient(env.Dial(t, euTok)).ListClusters(ctx, &ctrlv1.ListClustersRequest{})
	if status.Code(err) != codes.PermissionDenied {
		t.Fatalf("ListClusters with a cluster token: %v, want PermissionDenied", err)
	}
	_, err = ctrlv1.NewFleetServiceClient(env.Dial(t, "")).ListClusters(ctx, &ctrlv1.ListClustersRequest{})
	if status.Code(err) != codes.Unauthenticated {
		t.Fatalf("ListClusters without a token: %v, want Unauthenticated", err)
	}
}
