package clusterapi_test

//lint:file-ignore SA1019 typed-rpcs: removed no earlier than v0.4.0 (docs/compatibility.md); this file calls a deprecated typed ClusterService RPC

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"krane.dev/ctrl/internal/ctrltest"
	"krane.dev/ctrl/store"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
	"krane.dev/shared/kinds"
)

// fakeClock is a settable clock for the store's report guards.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// TestReportGuardsArePerCluster: two clusters serve one region, and the
// second one's clock is behind. A report orders after an earlier one only
// of the same cluster, so neither cluster's reports are dropped as stale
// because of the other's. Within one cluster, an older report at the same
// version is still dropped when it arrives right after a newer one (a
// delayed copy), but not once the stored one is older than the reorder
// window by ctrl's clock: that is a new leader whose clock is behind.
func TestReportGuardsArePerCluster(t *testing.T) {
	env := ctrltest.Start(t, ctrltest.Options{Configure: fastConfig})
	ctx := context.Background()
	clock := &fakeClock{t: time.Now()}
	env.Store.SetTestHooks(store.TestHooks{Now: clock.Now})
	id := env.CreateSentinels(t, "eu", "sen-two", "registry.test/sentinel:1", 1)[0]
	row, err := env.Store.GetSentinel(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	eu1 := env.Cluster(t, env.ClusterToken(t, "eu", "eu-1"))
	eu2 := env.Cluster(t, env.ClusterToken(t, "eu", "eu-2"))
	t0 := pastTime()
	report := func(cli clusterv1.ClusterServiceClient, at time.Time, available int32) bool {
		t.Helper()
		resp, err := cli.ReportSentinelStatus(ctx, &clusterv1.ReportSentinelStatusRequest{ObservedVersion: row.Version, ObservedAt: timestamppb.New(at),
			Status: &clusterv1.SentinelStatus{SentinelId: id, RunningImage: row.Image, AvailableReplicas: available, Health: clusterv1.Health_HEALTH_HEALTHY}})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetAccepted()
	}
	available := func(cluster string) string {
		t.Helper()
		got := clusterReport(t, env.Store, kinds.Sentinel, "eu", id, cluster)
		if _, after, ok := strings.Cut(got, `"available_replicas":`); ok {
			n, _, _ := strings.Cut(after, ",")
			return n
		}
		return got
	}
	if !report(eu1, t0.Add(10*time.Second), 2) {
		t.Fatal("eu-1's first report was refused")
	}
	if !report(eu2, t0, 1) || available("eu-2") != "1" || available("eu-1") != "2" {
		t.Fatalf("eu-2's report, observed by a clock behind eu-1's, was dropped as older than eu-1's, or touched it (eu-1 %s, eu-2 %s)", available("eu-1"), available("eu-2"))
	}
	if report(eu1, t0.Add(5*time.Second), 0) || available("eu-1") != "2" {
		t.Fatalf("eu-1's delayed older report was accepted (available %s)", available("eu-1"))
	}
	clock.Advance(store.ReportReorderWindow + time.Second)
	if !report(eu1, t0.Add(5*time.Second), 3) || available("eu-1") != "3" {
		t.Fatalf("a report from eu-1's new leader (clock behind) was dropped after the reorder window (available %s)", available("eu-1"))
	}
}
