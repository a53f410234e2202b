package clusterapi_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"krane.dev/ctrl/internal/ctrltest"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
	ctrlv1 "krane.dev/proto/krane/ctrl/v1"
	"krane.dev/shared/kinds"
)

// TestHeartbeatStoresTheHostReport: what a host says of its controllers
// and parked objects is stored with the heartbeat; counts of zero are
// dropped.
func TestHeartbeatStoresTheHostReport(t *testing.T) {
	env := ctrltest.Start(t, ctrltest.Options{})
	ctx := context.Background()
	cli := env.Cluster(t, env.ClusterToken(t, "eu", "eu-1"))
	req := &clusterv1.HeartbeatRequest{
		AgentVersion: "3.0.0", HostReport: true,
		Parked: map[string]int32{kinds.Deployment: 4, kinds.Sentinel: 0},
	}
	req.Controllers = append(req.Controllers, &clusterv1.ControllerStatus{
		Name: "deployment", PluginVersion: "3.0.0", Kinds: []string{kinds.Deployment}, Running: false, LastError: strings.Repeat("x", 1000),
	})
	for i := range 31 {
		req.Controllers = append(req.Controllers, &clusterv1.ControllerStatus{Name: fmt.Sprintf("extra-%03d", i), Running: true})
	}
	if _, err := cli.Heartbeat(ctx, req); err != nil {
		t.Fatal(err)
	}
	list, err := env.Store.ListClusters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	h := list[0].Host
	if h == nil || len(h.Controllers) != 32 || h.Controllers[0].Name != "deployment" || h.Controllers[0].Running || h.Controllers[0].LastError != strings.Repeat("x", 1000) {
		t.Fatalf("stored host report: %+v", h)
	}
	if len(h.Parked) != 1 || h.Parked[kinds.Deployment] != 4 {
		t.Fatalf("stored parked counts: %v, want deployment: 4 only", h.Parked)
	}
}

// TestHeartbeatPastItsBoundsIsRefused: a heartbeat that would make the
// cluster's row large (15 MB of cursors, under the 16 MiB receive limit)
// or that the database cannot store (a long agent version) is refused
// with INVALID_ARGUMENT naming the field, not stored, and not answered
// UNAVAILABLE (which the host would retry forever); the fleet listing
// every operator's sign-in makes goes on working.
func TestHeartbeatPastItsBoundsIsRefused(t *testing.T) {
	env := ctrltest.Start(t, ctrltest.Options{})
	ctx := context.Background()
	cli := env.Cluster(t, env.ClusterToken(t, "eu", "eu-1"))
	if _, err := cli.Heartbeat(ctx, &clusterv1.HeartbeatRequest{AgentVersion: "good"}); err != nil {
		t.Fatal(err)
	}
	big := &clusterv1.HeartbeatRequest{AgentVersion: "big", Cursors: map[string]uint64{}}
	for i := range 15_600_000 / 256 { // a key of 247 bytes and its entry's framing
		big.Cursors[fmt.Sprintf("%06d.%s", i, strings.Repeat("k", 240))] = uint64(i)
	}
	t.Logf("the large heartbeat is %d bytes", proto.Size(big))
	for field, req := range map[string]*clusterv1.HeartbeatRequest{
		"cursors":       big,
		"agent_version": {AgentVersion: strings.Repeat("v", 200)},
		"controllers":   {HostReport: true, Controllers: make([]*clusterv1.ControllerStatus, 33)},
	} {
		_, err := cli.Heartbeat(ctx, req)
		if st := status.Convert(err); st.Code() != codes.InvalidArgument || !strings.HasPrefix(st.Message(), field) {
			t.Errorf("a heartbeat past the bound of %s: %s %.200q, want INVALID_ARGUMENT naming the field", field, st.Code(), st.Message())
		}
	}
	list, err := env.Store.ListClusters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].AgentVersion != "good" || len(list[0].Cursors) != 0 {
		t.Fatalf("stored: %+v, want the first heartbeat's", list)
	}
	fleet := ctrlv1.NewFleetServiceClient(env.Dial(t, env.OperatorToken(t, "op")))
	if _, err := fleet.ListClusters(ctx, &ctrlv1.ListClustersRequest{}); err != nil {
		t.Fatalf("ListClusters after the refused heartbeats: %v", err)
	}
}
