package clusterapi_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"krane.dev/ctrl/clusterapi"
	"krane.dev/ctrl/internal/ctrltest"
	"krane.dev/ctrl/serve"
	"krane.dev/ctrl/store"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
	"krane.dev/shared/kinds"
)

// TestReportStatusesJudgesEachReportAlone: one batch mixes accepted, stale,
// unknown and malformed reports of several kinds, and names a deployment
// twice. Each gets the answer ReportStatus would give it, the call itself
// succeeds, and the tables hold exactly the accepted reports.
func TestReportStatusesJudgesEachReportAlone(t *testing.T) {
	listener := &recordingListener{}
	env := ctrltest.Start(t, ctrltest.Options{Configure: fastConfig, Deps: serve.Deps{Listener: listener}})
	ctx := context.Background()
	putDeployment(t, env.Store, "d1", "eu", "app:1", 2, "running")
	putDeployment(t, env.Store, "d2", "eu", "app:1", 1, "running")
	if _, err := env.Store.WriteTx(ctx, func(ctx context.Context, tx *store.Tx) error {
		return tx.PutSentinel(ctx, store.Sentinel{ID: "s1", Region: "eu", EnvironmentID: "env", K8sName: "sen", Image: "sentinel:1", Replicas: 2})
	}); err != nil {
		t.Fatal(err)
	}
	cli := env.Cluster(t, env.ClusterToken(t, "eu", "eu-1"))
	t0 := pastTime()
	stampUntil(t, env.Store, kinds.Deployment, "eu", "d1", 6)
	stampUntil(t, env.Store, kinds.Deployment, "eu", "d2", 3)
	dep := func(id string, v uint64, deleted bool, pods ...string) *clusterv1.ReportStatusRequest {
		st := &clusterv1.DeploymentStatus{DeploymentId: id, DesiredReplicas: 2, ReadyReplicas: int32(len(pods)), Deleted: deleted}
		for _, p := range pods {
			st.Instances = append(st.Instances, &clusterv1.Instance{K8SName: p, Address: p + ":8080", Status: clusterv1.Instance_STATUS_RUNNING, Zone: "a"})
		}
		return &clusterv1.ReportStatusRequest{Kind: kinds.Deployment, Id: id, ObservedVersion: v, ObservedAt: timestamppb.New(t0.Add(time.Duration(v) * time.Second)), Status: mustAny(st)}
	}
	wrongType := &clusterv1.ReportStatusRequest{Kind: kinds.Deployment, Id: "d1", ObservedVersion: 9, Status: mustAny(&clusterv1.SentinelStatus{})}
	unnamedPod := dep("d2", 9, false, "")
	sentinel := &clusterv1.ReportStatusRequest{Kind: kinds.Sentinel, Id: "s1", ObservedVersion: 3, ObservedAt: timestamppb.New(t0),
		Status: mustAny(&clusterv1.SentinelStatus{SentinelId: "s1", RunningImage: "sentinel:2", Health: clusterv1.Health_HEALTH_HEALTHY})}

	resp, err := cli.ReportStatuses(ctx, &clusterv1.ReportStatusesRequest{Reports: []*clusterv1.ReportStatusRequest{
		dep("d1", 5, false, "pod-a", "pod-b"), // accepted
		dep("d2", 3, true),                    // accepted: gone from the cluster
		dep("nope", 1, false, "pod-x"),        // unknown deployment
		wrongType,                             // malformed
		sentinel,                              // accepted
		dep("d2", 2, false, "pod-old"),        // stale: d2 is at 3 already
		unnamedPod,                            // malformed
		dep("d1", 6, false, "pod-b", "pod-c"), // accepted, after the first d1
	}})
	if err != nil {
		t.Fatalf("ReportStatuses: %v", err)
	}
	var got []string
	for _, r := range resp.GetResults() {
		got = append(got, fmt.Sprintf("%v/%s", r.GetAccepted(), codes.Code(r.GetCode())))
	}
	want := "[true/OK true/OK false/NotFound false/InvalidArgument true/OK false/OK false/InvalidArgument true/OK]"
	if fmt.Sprint(got) != want {
		t.Fatalf("results %v\nwant    %s", got, want)
	}
	if msg := resp.GetResults()[2].GetMessage(); msg != `no deployment "nope" in region "eu"` {
		t.Errorf("NotFound message %q", msg)
	}

	rows := func(query string) []string {
		t.Helper()
		r, err := env.Store.DB().QueryContext(ctx, query)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		var out []string
		for r.Next() {
			var a, b, c string
			if err := r.Scan(&a, &b, &c); err != nil {
				t.Fatal(err)
			}
			out = append(out, a+"/"+b+"/"+c)
		}
		return out
	}
	if got := fmt.Sprint(rows("SELECT deployment_id, k8s_name, observed_version FROM instances ORDER BY deployment_id, k8s_name")); got != "[d1/pod-b/6 d1/pod-c/6]" {
		t.Errorf("instances %s, want d1's pods of its newer report only", got)
	}
	if got := fmt.Sprint(rows("SELECT id, observed_version, deleted FROM object_reports WHERE kind = 'deployment' ORDER BY id")); got != "[d1/6/0 d2/3/1]" {
		t.Errorf("deployment reports %s", got)
	}
	if got := clusterReport(t, env.Store, kinds.Sentinel, "eu", "s1", "eu-1"); got != `v3 {"health":"HEALTH_HEALTHY","running_image":"sentinel:2"}` {
		t.Errorf("sentinel %s", got)
	}
	listener.mu.Lock()
	events := fmt.Sprint(listener.events)
	listener.mu.Unlock()
	if events != "[deployment d1 eu deployment d2 eu sentinel s1 deployment d1 eu]" {
		t.Errorf("listener events %s, want one per accepted report", events)
	}

	// ReportStatus answers the malformed report with the same code.
	if _, err := cli.ReportStatus(ctx, unnamedPod); status.Code(err) != codes.InvalidArgument {
		t.Errorf("ReportStatus of an instance without a pod name: %v, want InvalidArgument", err)
	}
	// Too many reports in one call: the call is refused.
	many := make([]*clusterv1.ReportStatusRequest, clusterapi.MaxReportsPerCall+1)
	for i := range many {
		many[i] = proto.Clone(sentinel).(*clusterv1.ReportStatusRequest)
	}
	if _, err := cli.ReportStatuses(ctx, &clusterv1.ReportStatusesRequest{Reports: many}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("%d reports in one call: %v, want InvalidArgument", len(many), err)
	}
}

// TestReportStatusesStoresALargeBatch: 300 deployments with 3 pods each in
// one call; then a second call in which every deployment lost a pod.
func TestReportStatusesStoresALargeBatch(t *testing.T) {
	env := ctrltest.Start(t, ctrltest.Options{Configure: fastConfig})
	ctx := context.Background()
	const n = 300
	if _, err := env.Store.WriteTx(ctx, func(ctx context.Context, tx *store.Tx) error {
		for i := range n {
			id := fmt.Sprintf("d%03d", i)
			if err := tx.PutDeployment(ctx, deployment(id, "app:1")); err != nil {
				return err
			}
			if err := tx.PutTopology(ctx, store.Topology{DeploymentID: id, Region: "eu", DesiredReplicas: 3, DesiredStatus: "running"}); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	cli := env.Cluster(t, env.ClusterToken(t, "eu", "eu-1"))
	// Every report observes version 1 (each row has at least that); the
	// second batch is newer by its time of arrival.
	send := func(v uint64, pods int) {
		t.Helper()
		req := &clusterv1.ReportStatusesRequest{}
		for i := range n {
			id := fmt.Sprintf("d%03d", i)
			st := &clusterv1.DeploymentStatus{DeploymentId: id, DesiredReplicas: 3, ReadyReplicas: int32(pods)}
			for p := range pods {
				st.Instances = append(st.Instances, &clusterv1.Instance{K8SName: fmt.Sprintf("%s-pod-%d", id, p), Status: clusterv1.Instance_STATUS_RUNNING})
			}
			req.Reports = append(req.Reports, &clusterv1.ReportStatusRequest{Kind: kinds.Deployment, Id: id, ObservedVersion: v, Status: mustAny(st)})
		}
		resp, err := cli.ReportStatuses(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		for i, r := range resp.GetResults() {
			if !r.GetAccepted() {
				t.Fatalf("report %d not accepted: %v", i, r)
			}
		}
	}
	count := func(query string) int {
		t.Helper()
		var c int
		if err := env.Store.DB().QueryRowContext(ctx, query).Scan(&c); err != nil {
			t.Fatal(err)
		}
		return c
	}
	send(1, 3)
	if got := count("SELECT COUNT(*) FROM instances WHERE region = 'eu' AND cluster_id <> ''"); got != 3*n {
		t.Fatalf("%d instances after the first batch, want %d", got, 3*n)
	}
	send(1, 2)
	if got := count("SELECT COUNT(*) FROM instances"); got != 2*n {
		t.Fatalf("%d instances after every deployment lost a pod, want %d", got, 2*n)
	}
	if got := count("SELECT COUNT(*) FROM instances WHERE k8s_name LIKE '%-pod-2'"); got != 0 {
		t.Fatalf("%d instances of the lost pods remain", got)
	}
	if got := count("SELECT COUNT(*) FROM object_reports WHERE kind = 'deployment' AND observed_version = 1 AND JSON_VALUE(status, '$.ready_replicas') = 2"); got != n {
		t.Fatalf("%d summaries updated, want %d", got, n)
	}
}
