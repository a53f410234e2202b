package clusterapi_test

import (
	"context"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"krane.dev/ctrl/internal/ctrltest"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
	"krane.dev/shared/kinds"
)

// TestApplyErrorRecordedAndCleared: an agent's report of a parked change
// is stored with its reason and cleared by a later success; a stale error
// (older version) does not overwrite a newer one.
func TestApplyErrorRecordedAndCleared(t *testing.T) {
	env := ctrltest.Start(t, ctrltest.Options{Configure: fastConfig})
	ctx := context.Background()
	v := putDeployment(t, env.Store, "dep-ae", "eu", "registry.example/app:1", 2, "running")
	cl := env.Cluster(t, env.ClusterToken(t, "eu", "eu-1"))

	report := func(ae *clusterv1.ApplyError) {
		t.Helper()
		resp, err := cl.ReportStatus(ctx, &clusterv1.ReportStatusRequest{Kind: kinds.Deployment, Id: "dep-ae", ObservedVersion: ae.GetVersion(), ApplyError: ae})
		if err != nil || !resp.GetAccepted() {
			t.Fatalf("report %v: %v, %v", ae, resp, err)
		}
	}
	report(&clusterv1.ApplyError{Version: v, Message: "image: not a valid reference", Field: "image", Permanent: true})
	errs, err := env.Store.ApplyErrors(ctx, kinds.Deployment, "eu", "dep-ae")
	if err != nil || len(errs) != 1 || errs[0].Field != "image" || !errs[0].Permanent || errs[0].ClusterID != "eu-1" || errs[0].Region != "eu" {
		t.Fatalf("stored %+v, %v", errs, err)
	}
	report(&clusterv1.ApplyError{Version: v - 1, Message: "older error"})
	if errs, _ := env.Store.ApplyErrors(ctx, kinds.Deployment, "eu", "dep-ae"); errs[0].Message != "image: not a valid reference" {
		t.Errorf("a stale error replaced a newer one: %+v", errs)
	}
	report(&clusterv1.ApplyError{Version: v})
	if errs, _ := env.Store.ApplyErrors(ctx, kinds.Deployment, "eu", "dep-ae"); len(errs) != 0 {
		t.Errorf("error not cleared: %+v", errs)
	}
}

// TestApplyErrorFromAnotherRegionIsRefused: a cluster reports only on
// objects of its own region. An apply error it sends for another region's
// object (a sentinel of eu, from a cluster of us) would fail that
// sentinel's deploy; it must be refused as NotFound and leave no row.
func TestApplyErrorFromAnotherRegionIsRefused(t *testing.T) {
	env := ctrltest.Start(t, ctrltest.Options{Configure: fastConfig})
	ctx := context.Background()
	dv := putDeployment(t, env.Store, "dep-eu", "eu", "registry.example/app:1", 1, "running")
	sen := env.CreateSentinels(t, "eu", "sen-eu", "registry.example/sentinel:1", 1)[0]
	us := env.Cluster(t, env.ClusterToken(t, "us", "us-1"))
	for _, c := range []struct{ kind, id string }{{kinds.Deployment, "dep-eu"}, {kinds.Sentinel, sen}} {
		_, err := us.ReportStatus(ctx, &clusterv1.ReportStatusRequest{Kind: c.kind, Id: c.id, ObservedVersion: dv,
			ApplyError: &clusterv1.ApplyError{Version: dv, Message: "cannot apply", Permanent: true}})
		if status.Code(err) != codes.NotFound {
			t.Errorf("apply error on %s %s of eu from a cluster of us: %v, want NotFound", c.kind, c.id, err)
		}
	}
	var n int
	if err := env.Store.DB().QueryRowContext(ctx, "SELECT COUNT(*) FROM apply_errors").Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d apply errors stored (%v), want none", n, err)
	}
}
