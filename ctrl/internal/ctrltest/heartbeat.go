package ctrltest

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	clusterv1 "krane.dev/proto/krane/cluster/v1"
	"krane.dev/shared/kinds"
)

// BuiltinControllers is what the heartbeats of a fake cluster say its host
// runs: the three built-in controllers, running.
func BuiltinControllers() []*clusterv1.ControllerStatus {
	return []*clusterv1.ControllerStatus{
		{Name: "cilium", PluginVersion: "test", Kinds: []string{kinds.CiliumNetworkPolicy}, Running: true},
		{Name: "deployment", PluginVersion: "test", Kinds: []string{kinds.Deployment}, Running: true},
		{Name: "sentinel", PluginVersion: "test", Kinds: []string{kinds.Sentinel}, Running: true},
	}
}

// heartbeatInterval is how often a fake cluster sends a heartbeat: well
// within deploy.live_cluster_within, as a real host's 30s are.
const heartbeatInterval = 20 * time.Second

// Heartbeater sends a fake cluster's heartbeats (KeepHeartbeating).
type Heartbeater struct {
	client clusterv1.ClusterServiceClient
	mu     sync.Mutex
	req    *clusterv1.HeartbeatRequest
}

// Serve adds a running controller of kinds (a plugin author's) to what
// the heartbeats say, and sends one now: by the aggregation rule of
// actual state a cluster counts only for the kinds its host serves.
func (h *Heartbeater) Serve(t testing.TB, kinds ...string) {
	t.Helper()
	h.mu.Lock()
	req := proto.Clone(h.req).(*clusterv1.HeartbeatRequest)
	req.Controllers = append(req.Controllers, &clusterv1.ControllerStatus{Name: "test-plugin-" + strings.Join(kinds, "-"), PluginVersion: "test", Kinds: kinds, Running: true})
	h.req = req
	h.mu.Unlock()
	if _, err := h.client.Heartbeat(context.Background(), req); err != nil {
		t.Fatalf("fake cluster heartbeat: %v", err)
	}
}

func (h *Heartbeater) request() *clusterv1.HeartbeatRequest {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.req
}

// KeepHeartbeating sends a heartbeat naming the built-in controllers now
// (failing the test if ctrl refuses it) and then every heartbeatInterval
// until the test ends, as a krane host does: deploys to the cluster's
// region pass ctrl's fail-fast check.
func KeepHeartbeating(t testing.TB, client clusterv1.ClusterServiceClient) *Heartbeater {
	t.Helper()
	h := &Heartbeater{client: client, req: &clusterv1.HeartbeatRequest{AgentVersion: "ctrltest", HostReport: true, Controllers: BuiltinControllers()}}
	if _, err := client.Heartbeat(context.Background(), h.request()); err != nil {
		t.Fatalf("fake cluster heartbeat: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(heartbeatInterval)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				// A refused one (ctrl restarting in the test) is retried at
				// the next tick, as a host would.
				_, _ = client.Heartbeat(ctx, h.request())
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return h
}
