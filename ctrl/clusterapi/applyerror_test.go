package clusterapi_test

import (
	"context"
	"testing"

	"krane.dev/ctrl/internal/ctrltest"
	"krane.dev/internal/kinds"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
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
	errs, err := env.Store.ApplyErrors(ctx, kinds.Deployment, "dep-ae")
	if err != nil || len(errs) != 1 || errs[0].Field != "image" || !errs[0].Permanent || errs[0].ClusterID != "eu-1" || errs[0].Region != "eu" {
		t.Fatalf("stored %+v, %v", errs, err)
	}
	report(&clusterv1.ApplyError{Version: v - 1, Message: "older error"})
	if errs, _ := env.Store.ApplyErrors(ctx, kinds.Deployment, "dep-ae"); errs[0].Message != "image: not a valid reference" {
		t.Errorf("a stale error replaced a newer one: %+v", errs)
	}
	report(&clusterv1.ApplyError{Version: v})
	if errs, _ := env.Store.ApplyErrors(ctx, kinds.Deployment, "dep-ae"); len(errs) != 0 {
		t.Errorf("error not cleared: %+v", errs)
	}
}
