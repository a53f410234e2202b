package clusterapi_test

//lint:file-ignore SA1019 typed-rpcs: removed no earlier than v0.4.0 (docs/compatibility.md); this file calls a deprecated typed ClusterService RPC

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"krane.dev/ctrl/internal/ctrltest"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
	"krane.dev/shared/kinds"
)

// TestInstanceStartupIsTimedOnceFromReports: an instance's startup time,
// from its creation to the first report that shows it running, goes to
// krane_deployment_instance_startup_time_seconds once, through the batch
// and the typed report alike; a pending instance, one reported running
// again, and one without a creation time are not timed.
func TestInstanceStartupIsTimedOnceFromReports(t *testing.T) {
	env := ctrltest.Start(t, ctrltest.Options{Configure: fastConfig})
	ctx := context.Background()
	v := putDeployment(t, env.Store, "d1", "eu", "app:1", 3, "running")
	cli := env.Cluster(t, env.ClusterToken(t, "eu", "eu-1"))
	t0 := pastTime()
	inst := func(name string, status clusterv1.Instance_Status, created time.Time) *clusterv1.Instance {
		in := &clusterv1.Instance{K8SName: name, Status: status}
		if !created.IsZero() {
			in.CreatedAt = timestamppb.New(created)
		}
		return in
	}
	const running, pending = clusterv1.Instance_STATUS_RUNNING, clusterv1.Instance_STATUS_PENDING
	status := func(ins ...*clusterv1.Instance) *clusterv1.DeploymentStatus {
		return &clusterv1.DeploymentStatus{DeploymentId: "d1", DesiredReplicas: 3, Instances: ins}
	}
	batch := func(at time.Time, st *clusterv1.DeploymentStatus) {
		t.Helper()
		resp, err := cli.ReportStatuses(ctx, &clusterv1.ReportStatusesRequest{Reports: []*clusterv1.ReportStatusRequest{{
			Kind: kinds.Deployment, Id: "d1", ObservedVersion: v, ObservedAt: timestamppb.New(at), Status: mustAny(st),
		}}})
		if err != nil || !resp.GetResults()[0].GetAccepted() {
			t.Fatalf("report at %s: %v %v", at, resp, err)
		}
	}
	typed := func(at time.Time, st *clusterv1.DeploymentStatus) {
		t.Helper()
		resp, err := cli.ReportDeploymentStatus(ctx, &clusterv1.ReportDeploymentStatusRequest{Status: st, ObservedVersion: v, ObservedAt: timestamppb.New(at)})
		if err != nil || !resp.GetAccepted() {
			t.Fatalf("typed report at %s: %v %v", at, resp, err)
		}
	}
	startup := func() (count, sum string) {
		t.Helper()
		code, body := scrape(t, env)
		if code != 200 {
			t.Fatalf("/metrics: %d", code)
		}
		for _, l := range strings.Split(body, "\n") {
			if v, ok := strings.CutPrefix(l, "krane_deployment_instance_startup_time_seconds_count "); ok {
				count = v
			}
			if v, ok := strings.CutPrefix(l, "krane_deployment_instance_startup_time_seconds_sum "); ok {
				sum = v
			}
		}
		return count, sum
	}
	if c, s := startup(); c != "0" || s != "0" {
		t.Fatalf("before any report: count %q sum %q, want 0 0", c, s)
	}

	// a pending, b running 4s after its creation, c running without a
	// creation time.
	batch(t0, status(inst("a", pending, t0.Add(-10*time.Second)), inst("b", running, t0.Add(-4*time.Second)), inst("c", running, time.Time{})))
	if c, s := startup(); c != "1" || s != "4" {
		t.Fatalf("after b started: count %q sum %q, want 1 and 4", c, s)
	}
	// a running 11s after its creation (typed report); b is not new.
	typed(t0.Add(time.Second), status(inst("a", running, t0.Add(-10*time.Second)), inst("b", running, t0.Add(-4*time.Second)), inst("c", running, time.Time{})))
	if c, s := startup(); c != "2" || s != "15" {
		t.Fatalf("after a started: count %q sum %q, want 2 and 15", c, s)
	}
	// The same instances again, through either path: nothing new.
	batch(t0.Add(2*time.Second), status(inst("a", running, t0.Add(-10*time.Second)), inst("b", running, t0.Add(-4*time.Second))))
	typed(t0.Add(3*time.Second), status(inst("a", running, t0.Add(-10*time.Second)), inst("b", running, t0.Add(-4*time.Second))))
	if c, s := startup(); c != "2" || s != "15" {
		t.Fatalf("after repeated reports: count %q sum %q, want still 2 and 15", c, s)
	}
}
