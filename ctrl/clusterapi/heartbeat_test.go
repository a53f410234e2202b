package clusterapi_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"krane.dev/ctrl/internal/ctrltest"
	"krane.dev/internal/kinds"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
)

// TestHeartbeatStoresTheHostReportWithinLimits: what a host says of its
// controllers and parked objects is stored with the heartbeat, and a host
// cannot make its row arbitrarily large: controllers beyond 64 and text
// beyond 1 KiB are cut, counts of zero are dropped.
func TestHeartbeatStoresTheHostReportWithinLimits(t *testing.T) {
	env := ctrltest.Start(t, ctrltest.Options{})
	ctx := context.Background()
	cli := env.Cluster(t, env.ClusterToken(t, "eu", "eu-1"))
	req := &clusterv1.HeartbeatRequest{
		AgentVersion: "3.0.0", HostReport: true,
		Parked: map[string]int32{kinds.Deployment: 4, kinds.Sentinel: 0},
	}
	req.Controllers = append(req.Controllers, &clusterv1.ControllerStatus{
		Name: "deployment", PluginVersion: "3.0.0", Kinds: []string{kinds.Deployment}, Running: false, LastError: strings.Repeat("x", 5000),
	})
	for i := range 100 {
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
	if h == nil || len(h.Controllers) != 64 || h.Controllers[0].Name != "deployment" || h.Controllers[0].Running ||
		len(h.Controllers[0].LastError) > 1100 || !strings.HasPrefix(h.Controllers[0].LastError, "xxx") {
		t.Fatalf("stored host report: %+v", h)
	}
	if len(h.Parked) != 1 || h.Parked[kinds.Deployment] != 4 {
		t.Fatalf("stored parked counts: %v, want deployment: 4 only", h.Parked)
	}
}
