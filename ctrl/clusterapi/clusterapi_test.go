package clusterapi_test

//lint:file-ignore SA1019 legacy-workload: removed no earlier than v0.3.0 (docs/compatibility.md); this file builds or reads the deprecated top-level workload fields

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"krane.dev/ctrl/deployspec"
	"krane.dev/ctrl/internal/ctrltest"
	"krane.dev/ctrl/serve"
	"krane.dev/ctrl/store"
	"krane.dev/internal/testenv"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
	"krane.dev/shared/kinds"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func fastConfig(c *serve.Config) {
	c.Watch.KeepAlive = 300 * time.Millisecond
	c.Watch.PollInterval = 50 * time.Millisecond
}

func deployment(id string, image string) store.Deployment {
	return store.Deployment{Spec: deployspec.Spec{ID: id, WorkspaceID: "ws", ProjectID: "proj", EnvironmentID: "env", AppID: "app", K8sNamespace: "ns-ws", K8sName: "dep-" + id, Replicas: 2, Workload: &clusterv1.Workload{Image: image, CpuMillicores: 250, MemoryMib: 256, EnvVars: map[string]string{"LOG": "debug"}, Command: []string{"/app", "serve"}, Port: 8080, Healthcheck: &clusterv1.Healthcheck{Method: "GET", Path: "/healthz", Port: 8080}}}}
}

func putDeployment(t testing.TB, s *store.Store, id, region, image string, replicas int32, desired string) uint64 {
	t.Helper()
	stamped, err := s.WriteTx(context.Background(), func(ctx context.Context, tx *store.Tx) error {
		if err := tx.PutDeployment(ctx, deployment(id, image)); err != nil {
			return err
		}
		return tx.PutTopology(ctx, store.Topology{DeploymentID: id, Region: region, DesiredReplicas: replicas, DesiredStatus: desired})
	})
	if err != nil {
		t.Fatal(err)
	}
	return stamped[len(stamped)-1].Version
}

// stampUntil stamps an object again until its version is at least v, and
// returns its version: reports must name versions ctrl issued.
func stampUntil(t testing.TB, s *store.Store, kind, region, id string, v uint64) uint64 {
	t.Helper()
	for {
		g, err := s.StampCommitted(context.Background(), []store.Ref{{Kind: kind, Region: region, ID: id}}, "")
		if err != nil {
			t.Fatal(err)
		}
		if g.Last >= v {
			return g.Last
		}
	}
}

// pastTime is a time of day in the past, whole seconds: reports observed
// at it and up to an hour later are not in ctrl's future.
func pastTime() time.Time { return time.Now().Add(-2 * time.Hour).Truncate(time.Second).UTC() }

// recv reads the next event, failing the test after a timeout.
func recv[T any](t testing.TB, next func() (T, error)) T {
	t.Helper()
	type res struct {
		v   T
		err error
	}
	ch := make(chan res, 1)
	go func() { v, err := next(); ch <- res{v, err} }()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatalf("stream: %v", r.err)
		}
		return r.v
	case <-time.After(20 * time.Second):
		t.Fatal("no event within 20s")
	}
	panic("unreachable")
}

func TestWatchBootstrapsThenStreamsChangesAndKeepAlives(t *testing.T) {
	env := ctrltest.Start(t, ctrltest.Options{Configure: fastConfig})
	v1 := putDeployment(t, env.Store, "d1", "eu", "app:1", 2, "running")
	putDeployment(t, env.Store, "d2", "us", "app:1", 2, "running") // another region: not seen
	v3 := putDeployment(t, env.Store, "d3", "eu", "app:1", 2, "stopped")
	v4 := putDeployment(t, env.Store, "d4", "eu", "app:1", 3, "running")
	cli := env.Cluster(t, env.ClusterToken(t, "eu", "eu-1"))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := cli.Watch(ctx, &clusterv1.WatchRequest{Kind: kinds.Deployment})
	if err != nil {
		t.Fatal(err)
	}
	// Bootstrap: live rows only (d3 is stopped), in version order.
	ev := recv(t, stream.Recv)
	c := ev.GetChange()
	if c.GetId() != "d1" || c.GetVersion() != v1 || c.GetDeleted() {
		t.Fatalf("first event %v, want d1@%d", ev, v1)
	}
	var d clusterv1.Deployment
	if err := c.GetSpec().UnmarshalTo(&d); err != nil {
		t.Fatal(err)
	}
	want := &clusterv1.Deployment{Id: "d1", WorkspaceId: "ws", ProjectId: "proj", EnvironmentId: "env", AppId: "app",
		K8SNamespace: "ns-ws", K8SName: "dep-d1", Image: "app:1", CpuMillicores: 250, MemoryMib: 256, Replicas: 2,
		EnvVars: map[string]string{"LOG": "debug"}, Command: []string{"/app", "serve"}, Port: 8080,
		Healthcheck: &clusterv1.Healthcheck{Method: "GET", Path: "/healthz", Port: 8080}}
	// The workload, and its fields of the previous release at the top
	// level for that release's plugins.
	want.Workload = &clusterv1.Workload{Image: "app:1", CpuMillicores: 250, MemoryMib: 256, EnvVars: map[string]string{"LOG": "debug"},
		Command: []string{"/app", "serve"}, Port: 8080, Healthcheck: &clusterv1.Healthcheck{Method: "GET", Path: "/healthz", Port: 8080}}
	if !proto.Equal(&d, want) {
		t.Fatalf("spec %v\nwant %v", &d, want)
	}
	if ev := recv(t, stream.Recv); ev.GetChange().GetId() != "d4" || ev.GetChange().GetVersion() != v4 || ev.GetChange().GetSpec() == nil {
		t.Fatalf("second event %v, want d4@%d", ev, v4)
	}
	if ev := recv(t, stream.Recv); ev.GetBootstrapComplete().GetMaxVersion() != v4 {
		t.Fatalf("third event %v, want BootstrapComplete{%d}", ev, v4)
	}
	// Live: a soft delete arrives as deleted without a payload.
	v5 := putDeployment(t, env.Store, "d1", "eu", "app:1", 2, "stopped")
	ev = recv(t, stream.Recv)
	if ev.GetChange().GetId() != "d1" || ev.GetChange().GetVersion() != v5 || !ev.GetChange().GetDeleted() || ev.GetChange().GetSpec() != nil {
		t.Fatalf("event %v, want d1@%d deleted without spec", ev, v5)
	}
	// Idle: keep-alives carry the head.
	ev = recv(t, stream.Recv)
	if ka := ev.GetKeepAlive(); ka == nil || ka.GetHeadVersion() != v5 || time.Since(ka.GetServerTime().AsTime()) > time.Minute {
		t.Fatalf("event %v, want KeepAlive{head %d}", ev, v5)
	}
	_ = v3

	// Resuming from a cursor: every change after it, deleted ones included.
	stream2, err := cli.Watch(ctx, &clusterv1.WatchRequest{Kind: kinds.Deployment, Region: "eu", AfterVersion: v1})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for range 3 {
		c := recv(t, stream2.Recv).GetChange()
		got = append(got, fmt.Sprintf("%s@%d/%v", c.GetId(), c.GetVersion(), c.GetDeleted()))
	}
	if fmt.Sprint(got) != fmt.Sprintf("[d3@%d/true d4@%d/false d1@%d/true]", v3, v4, v5) {
		t.Fatalf("resumed stream %v", got)
	}
}

func TestListDesiredGetDesiredStateAndTypedForms(t *testing.T) {
	env := ctrltest.Start(t, ctrltest.Options{Configure: fastConfig})
	ctx := context.Background()
	vd := putDeployment(t, env.Store, "d1", "eu", "app:1", 2, "running")
	vs, err := env.Store.WriteTx(ctx, func(ctx context.Context, tx *store.Tx) error {
		if err := tx.PutSentinel(ctx, store.Sentinel{ID: "s1", Region: "eu", WorkspaceID: "ws", EnvironmentID: "env", K8sName: "sentinel-env", Image: "sentinel:1", Replicas: 2, CPUMillicores: 500, MemoryMiB: 512}); err != nil {
			return err
		}
		if err := tx.PutCiliumNetworkPolicy(ctx, store.CiliumNetworkPolicy{ID: "p1", Region: "eu", K8sNamespace: "ns-ws", K8sName: "allow", Policy: []byte(`{"spec":{"endpointSelector":{}}}`)}); err != nil {
			return err
		}
		return tx.PutResource(ctx, store.Resource{Kind: "configmap.example.krane.dev", Region: "eu", ID: "cm1", Spec: []byte(`{"data":{"a":"b"}}`)})
	})
	if err != nil {
		t.Fatal(err)
	}
	cli := env.Cluster(t, env.ClusterToken(t, "eu", "eu-1"))

	// ListDesired: snapshot + marker, then a clean close.
	ls, err := cli.ListDesired(ctx, &clusterv1.ListDesiredRequest{Kind: "configmap.example.krane.dev"})
	if err != nil {
		t.Fatal(err)
	}
	ev := recv(t, ls.Recv)
	var st structpb.Struct
	if err := ev.GetChange().GetSpec().UnmarshalTo(&st); err != nil || st.GetFields()["data"].GetStructValue().GetFields()["a"].GetStringValue() != "b" {
		t.Fatalf("generic change %v (%v)", ev, err)
	}
	if ev := recv(t, ls.Recv); ev.GetBootstrapComplete().GetMaxVersion() != vs[2].Version {
		t.Fatalf("marker %v, want max version %d", ev, vs[2].Version)
	}
	if _, err := ls.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("ListDesired did not close cleanly: %v", err)
	}

	// GetDesiredState.
	rc, err := cli.GetDesiredState(ctx, &clusterv1.GetDesiredStateRequest{Kind: kinds.Sentinel, Id: "s1"})
	if err != nil {
		t.Fatal(err)
	}
	var sn clusterv1.Sentinel
	if err := rc.GetSpec().UnmarshalTo(&sn); err != nil || sn.GetImage() != "sentinel:1" || rc.GetVersion() != vs[0].Version {
		t.Fatalf("GetDesiredState sentinel = %v (%v)", rc, err)
	}
	if _, err := cli.GetDesiredState(ctx, &clusterv1.GetDesiredStateRequest{Kind: kinds.Sentinel, Id: "nope"}); status.Code(err) != codes.NotFound {
		t.Fatalf("unknown id: %v, want NotFound", err)
	}
	if _, err := cli.GetDesiredState(ctx, &clusterv1.GetDesiredStateRequest{Kind: "unknown.kind", Id: "x"}); status.Code(err) != codes.NotFound {
		t.Fatalf("unknown kind: %v, want NotFound", err)
	}

	// Typed watch from 0: the snapshot, then a clean close.
	wd, err := cli.WatchDeployments(ctx, &clusterv1.WatchDeploymentsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if ds := recv(t, wd.Recv); ds.GetVersion() != vd || ds.GetApply().GetImage() != "app:1" {
		t.Fatalf("typed deployment %v", ds)
	}
	if _, err := wd.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("typed bootstrap did not close cleanly: %v", err)
	}
	// Typed watch from a cursor stays open and turns soft deletes into Delete.
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wd, err = cli.WatchDeployments(wctx, &clusterv1.WatchDeploymentsRequest{VersionLastSeen: vs[2].Version})
	if err != nil {
		t.Fatal(err)
	}
	vstop := putDeployment(t, env.Store, "d1", "eu", "app:1", 2, "stopped")
	if ds := recv(t, wd.Recv); ds.GetVersion() != vstop || ds.GetDelete().GetK8SName() != "dep-d1" || ds.GetDelete().GetK8SNamespace() != "ns-ws" {
		t.Fatalf("typed delete %v", ds)
	}
	gd, err := cli.GetDesiredDeploymentState(ctx, &clusterv1.GetDesiredDeploymentStateRequest{DeploymentId: "d1"})
	if err != nil || gd.GetDelete().GetId() != "d1" || gd.GetVersion() != vstop {
		t.Fatalf("GetDesiredDeploymentState = %v, %v", gd, err)
	}
	ws, err := cli.WatchSentinels(ctx, &clusterv1.WatchSentinelsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if ss := recv(t, ws.Recv); ss.GetApply().GetK8SName() != "sentinel-env" {
		t.Fatalf("typed sentinel %v", ss)
	}
	wc, err := cli.WatchCiliumNetworkPolicies(ctx, &clusterv1.WatchCiliumNetworkPoliciesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if cs := recv(t, wc.Recv); cs.GetApply().GetK8SName() != "allow" || len(cs.GetApply().GetPolicy()) == 0 {
		t.Fatalf("typed policy %v", cs)
	}
	gs, err := cli.GetDesiredSentinelState(ctx, &clusterv1.GetDesiredSentinelStateRequest{SentinelId: "s1"})
	if err != nil || gs.GetApply().GetReplicas() != 2 {
		t.Fatalf("GetDesiredSentinelState = %v, %v", gs, err)
	}

	// Heartbeat stores the cluster's cursors and returns the region's head.
	hb, err := cli.Heartbeat(ctx, &clusterv1.HeartbeatRequest{AgentVersion: "1.2.3", Cursors: map[string]uint64{"deployment": vd}})
	if err != nil || hb.GetHeadVersion() != vstop {
		t.Fatalf("Heartbeat = %v, %v; want head %d", hb, err, vstop)
	}
	clusters, err := env.Store.ListClusters(ctx)
	if err != nil || len(clusters) != 1 || clusters[0].AgentVersion != "1.2.3" || clusters[0].Cursors["deployment"] != vd || clusters[0].LastHeartbeatAt.IsZero() {
		t.Fatalf("clusters after heartbeat: %+v, %v", clusters, err)
	}
}

type recordingListener struct {
	mu     sync.Mutex
	events []string
}

func (l *recordingListener) DeploymentReported(_ context.Context, id, region string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, "deployment "+id+" "+region)
}

func (l *recordingListener) SentinelReported(_ context.Context, id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, "sentinel "+id)
}

func TestStaleReportsDoNotOverwriteNewerOnes(t *testing.T) {
	listener := &recordingListener{}
	env := ctrltest.Start(t, ctrltest.Options{Configure: fastConfig, Deps: serve.Deps{Listener: listener}})
	ctx := context.Background()
	putDeployment(t, env.Store, "d1", "eu", "app:1", 2, "running")
	if _, err := env.Store.WriteTx(ctx, func(ctx context.Context, tx *store.Tx) error {
		return tx.PutSentinel(ctx, store.Sentinel{ID: "s1", Region: "eu", EnvironmentID: "env", K8sName: "sen", Image: "sentinel:1", Replicas: 2})
	}); err != nil {
		t.Fatal(err)
	}
	cli := env.Cluster(t, env.ClusterToken(t, "eu", "eu-1"))
	t0 := pastTime()
	stampUntil(t, env.Store, kinds.Deployment, "eu", "d1", 5)
	stampUntil(t, env.Store, kinds.Sentinel, "eu", "s1", 3)

	reportDeployment := func(v uint64, at time.Time, pods ...string) bool {
		t.Helper()
		st := &clusterv1.DeploymentStatus{DeploymentId: "d1", DesiredReplicas: 2, ReadyReplicas: int32(len(pods)), AvailableReplicas: int32(len(pods))}
		for _, p := range pods {
			st.Instances = append(st.Instances, &clusterv1.Instance{K8SName: p, Address: p + ":8080", Status: clusterv1.Instance_STATUS_RUNNING, Zone: "a"})
		}
		any, _ := anypb.New(st)
		resp, err := cli.ReportStatus(ctx, &clusterv1.ReportStatusRequest{Kind: kinds.Deployment, Id: "d1", ObservedVersion: v, ObservedAt: timestamppb.New(at), Status: any})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetAccepted()
	}
	instances := func() string {
		rows, err := env.Store.DB().QueryContext(ctx, "SELECT k8s_name, status, observed_version FROM instances WHERE deployment_id = 'd1' ORDER BY k8s_name")
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var out []string
		for rows.Next() {
			var name, st string
			var v uint64
			if err := rows.Scan(&name, &st, &v); err != nil {
				t.Fatal(err)
			}
			out = append(out, fmt.Sprintf("%s/%s/%d", name, st, v))
		}
		return fmt.Sprint(out)
	}
	summary := func() string {
		var v uint64
		var at int64
		var status string
		if err := env.Store.DB().QueryRowContext(ctx, "SELECT observed_version, observed_at_ns, status FROM object_reports WHERE kind = 'deployment' AND id = 'd1' AND cluster_id = 'eu-1'").Scan(&v, &at, &status); err != nil {
			t.Fatal(err)
		}
		canon, err := store.CanonicalJSON([]byte(status))
		if err != nil {
			t.Fatal(err)
		}
		return fmt.Sprintf("v%d at%d %s", v, at, canon)
	}

	if !reportDeployment(5, t0.Add(time.Second), "pod-a", "pod-b") {
		t.Fatal("first report rejected")
	}
	wantInstances, wantSummary := "[pod-a/running/5 pod-b/running/5]", fmt.Sprintf(`v5 at%d {"available_replicas":2,"desired_replicas":2,"ready_replicas":2}`, t0.Add(time.Second).UnixNano())
	// Older observed version, even if observed later: ignored.
	if reportDeployment(4, t0.Add(time.Hour), "pod-old") {
		t.Fatal("report with an older observed_version accepted")
	}
	// Same version, older observation time: ignored.
	if reportDeployment(5, t0, "pod-c") {
		t.Fatal("report with the same version and an older observed_at accepted")
	}
	if got := instances(); got != wantInstances {
		t.Fatalf("instances after stale reports %s, want %s", got, wantInstances)
	}
	if got := summary(); got != wantSummary {
		t.Fatalf("summary after stale reports %s, want %s", got, wantSummary)
	}
	// A newer report replaces the snapshot: pod-a gone, pod-c new.
	if !reportDeployment(5, t0.Add(2*time.Second), "pod-b", "pod-c") {
		t.Fatal("newer report rejected")
	}
	if got := instances(); got != "[pod-b/running/5 pod-c/running/5]" {
		t.Fatalf("instances after a newer report %s", got)
	}

	// Sentinel, through the typed form.
	rs := func(v uint64, at time.Time, image string) bool {
		t.Helper()
		resp, err := cli.ReportSentinelStatus(ctx, &clusterv1.ReportSentinelStatusRequest{ObservedVersion: v, ObservedAt: timestamppb.New(at),
			Status: &clusterv1.SentinelStatus{SentinelId: "s1", RunningImage: image, AvailableReplicas: 2, Health: clusterv1.Health_HEALTH_HEALTHY}})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetAccepted()
	}
	if !rs(3, t0, "sentinel:2") || rs(2, t0.Add(time.Hour), "sentinel:1") || rs(3, t0.Add(-time.Millisecond), "sentinel:0") {
		t.Fatal("sentinel report guard: want accepted, stale, stale")
	}
	if got := clusterReport(t, env.Store, kinds.Sentinel, "eu", "s1", "eu-1"); got != `v3 {"available_replicas":2,"health":"HEALTH_HEALTHY","running_image":"sentinel:2"}` {
		t.Fatalf("sentinel actual state %s, want sentinel:2 healthy", got)
	}

	// Another region's object is NotFound for this cluster.
	other := env.Cluster(t, env.ClusterToken(t, "us", "us-1"))
	any, _ := anypb.New(&clusterv1.DeploymentStatus{DeploymentId: "d1"})
	if _, err := other.ReportStatus(ctx, &clusterv1.ReportStatusRequest{Kind: kinds.Deployment, Id: "d1", ObservedVersion: 99, Status: any}); status.Code(err) != codes.NotFound {
		t.Fatalf("report from another region: %v, want NotFound", err)
	}
	// Wrong payload type.
	wrong, _ := anypb.New(&clusterv1.SentinelStatus{})
	if _, err := cli.ReportStatus(ctx, &clusterv1.ReportStatusRequest{Kind: kinds.Deployment, Id: "d1", Status: wrong}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("wrong status type: %v, want InvalidArgument", err)
	}

	listener.mu.Lock()
	defer listener.mu.Unlock()
	if fmt.Sprint(listener.events) != "[deployment d1 eu deployment d1 eu sentinel s1]" {
		t.Fatalf("listener events %v, want one per accepted report", listener.events)
	}
}

func TestUnconvertibleRowIsSkippedLoggedAndCounted(t *testing.T) {
	env := ctrltest.Start(t, ctrltest.Options{Configure: fastConfig})
	ctx := context.Background()
	putDeployment(t, env.Store, "d1", "eu", "app:1", 1, "running")
	bad := putDeployment(t, env.Store, "d2", "eu", "app:1", 1, "running")
	// Valid JSON of the wrong shape: the row cannot become a Deployment.
	if _, err := env.Store.DB().ExecContext(ctx, `UPDATE deployments SET workload = JSON_SET(workload, '$.workload.env_vars', JSON_ARRAY(1, 2)) WHERE id = 'd2'`); err != nil {
		t.Fatal(err)
	}
	v3 := putDeployment(t, env.Store, "d3", "eu", "app:1", 1, "running")
	cli := env.Cluster(t, env.ClusterToken(t, "eu", "eu-1"))
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := cli.Watch(sctx, &clusterv1.WatchRequest{Kind: kinds.Deployment})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for {
		ev := recv(t, stream.Recv)
		if ev.GetBootstrapComplete() != nil {
			if ev.GetBootstrapComplete().GetMaxVersion() != v3 {
				t.Fatalf("BootstrapComplete %v, want %d", ev, v3)
			}
			break
		}
		got = append(got, ev.GetChange().GetId())
	}
	if fmt.Sprint(got) != "[d1 d3]" {
		t.Fatalf("bootstrap sent %v, want [d1 d3] (d2 skipped)", got)
	}
	// The stream moves on past a bad row too.
	if _, err := env.Store.WriteTx(ctx, func(ctx context.Context, tx *store.Tx) error { tx.Touch(kinds.Deployment, "eu", "d2"); return nil }); err != nil {
		t.Fatal(err)
	}
	v5 := putDeployment(t, env.Store, "d4", "eu", "app:1", 1, "running")
	if ev := recv(t, stream.Recv); ev.GetChange().GetId() != "d4" || ev.GetChange().GetVersion() != v5 {
		t.Fatalf("after a skipped row: %v, want d4@%d", ev, v5)
	}
	if _, err := cli.GetDesiredState(ctx, &clusterv1.GetDesiredStateRequest{Kind: kinds.Deployment, Id: "d2"}); status.Code(err) != codes.Internal {
		t.Fatalf("GetDesiredState of the bad row: %v, want Internal", err)
	}
	logs := env.Logs.String()
	if strings.Count(logs, "skipping a desired-state row") != 2 || !strings.Contains(logs, "id=d2") || !strings.Contains(logs, fmt.Sprintf("version=%d", bad)) {
		t.Fatalf("want two error logs naming d2 and its versions:\n%s", logs)
	}
	_, body := scrape(t, env)
	if !strings.Contains(body, `krane_ctrl_watch_rows_skipped_total{kind="deployment"} 2`) {
		t.Fatalf("skipped-rows metric missing or wrong:\n%s", grepLines(body, "skipped"))
	}
}

func TestGenericAndCiliumReports(t *testing.T) {
	env := ctrltest.Start(t, ctrltest.Options{Configure: fastConfig})
	ctx := context.Background()
	if _, err := env.Store.WriteTx(ctx, func(ctx context.Context, tx *store.Tx) error {
		if err := tx.PutCiliumNetworkPolicy(ctx, store.CiliumNetworkPolicy{ID: "p1", Region: "eu", K8sNamespace: "ns", K8sName: "allow", Policy: []byte(`{}`)}); err != nil {
			return err
		}
		return tx.PutResource(ctx, store.Resource{Kind: genericKind, Region: "eu", ID: "cm1", Spec: []byte(`{"data":{}}`)})
	}); err != nil {
		t.Fatal(err)
	}
	cli := env.Cluster(t, env.ClusterToken(t, "eu", "eu-1"))
	t0 := pastTime()
	stampUntil(t, env.Store, genericKind, "eu", "cm1", 2)
	stampUntil(t, env.Store, kinds.CiliumNetworkPolicy, "eu", "p1", 2)
	report := func(kind, id string, v uint64, at time.Time, msg proto.Message) bool {
		t.Helper()
		a, err := anypb.New(msg)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := cli.ReportStatus(ctx, &clusterv1.ReportStatusRequest{Kind: kind, Id: id, ObservedVersion: v, ObservedAt: timestamppb.New(at), Status: a})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetAccepted()
	}
	st := func(phase string) *structpb.Struct {
		s, _ := structpb.NewStruct(map[string]any{"phase": phase})
		return s
	}
	if !report(genericKind, "cm1", 2, t0, st("Applied")) || report(genericKind, "cm1", 1, t0.Add(time.Hour), st("Stale")) {
		t.Fatal("generic report guard: want accepted, then stale")
	}
	if doc := clusterReport(t, env.Store, genericKind, "eu", "cm1", "eu-1"); !strings.Contains(doc, `"Applied"`) {
		t.Fatalf("generic status %q", doc)
	}
	if !report(kinds.CiliumNetworkPolicy, "p1", 2, t0, &clusterv1.CiliumNetworkPolicyStatus{Applied: false, Message: "rejected: bad selector"}) ||
		report(kinds.CiliumNetworkPolicy, "p1", 2, t0.Add(-time.Second), &clusterv1.CiliumNetworkPolicyStatus{Applied: true}) {
		t.Fatal("cilium report guard: want accepted, then stale")
	}
	if got := clusterReport(t, env.Store, kinds.CiliumNetworkPolicy, "eu", "p1", "eu-1"); got != `v2 {"message":"rejected: bad selector"}` {
		t.Fatalf("cilium status %s", got)
	}
	if _, err := cli.ReportStatus(ctx, &clusterv1.ReportStatusRequest{Kind: genericKind, Id: "nope", ObservedVersion: 1, Status: mustAny(st("x"))}); status.Code(err) != codes.NotFound {
		t.Fatalf("report on an unknown object: %v, want NotFound", err)
	}
	_, body := scrape(t, env)
	for _, want := range []string{
		`krane_ctrl_status_reports_total{kind="` + genericKind + `",result="accepted"} 1`,
		`krane_ctrl_status_reports_total{kind="` + genericKind + `",result="stale"} 1`,
		`krane_ctrl_status_reports_total{kind="ciliumnetworkpolicy",result="stale"} 1`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %s:\n%s", want, grepLines(body, "status_reports"))
		}
	}
}

func mustAny(m proto.Message) *anypb.Any {
	a, err := anypb.New(m)
	if err != nil {
		panic(err)
	}
	return a
}

func scrape(t *testing.T, env *ctrltest.Env) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + env.Server.HTTPAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// metricValue is the value of the series named exactly (name and labels)
// in the server's /metrics, -1 when absent.
func metricValue(t *testing.T, env *ctrltest.Env, series string) float64 {
	t.Helper()
	_, body := scrape(t, env)
	for _, l := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(l, series+" "); ok {
			var f float64
			if _, err := fmt.Sscanf(v, "%g", &f); err == nil {
				return f
			}
		}
	}
	return -1
}
