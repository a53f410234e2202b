package fleetapi_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"krane.dev/ctrl/fleetapi"
	"krane.dev/ctrl/internal/ctrltest"
	"krane.dev/ctrl/store"
	"krane.dev/internal/testenv"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
	ctrlv1 "krane.dev/proto/krane/ctrl/v1"
	"krane.dev/shared/kinds"
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
// heartbeat, agent version and the controllers its host runs; per kind the
// reported cursor against the newest version of the cluster's region, the
// lag in versions and in seconds, parked objects and the objects it could
// not apply. What an older host does not send stays "not reported".
func TestListClustersShowsHeartbeatsLagAndApplyErrors(t *testing.T) {
	env := ctrltest.Start(t, ctrltest.Options{})
	ctx := context.Background()
	euTok := env.ClusterToken(t, "eu", "eu-1")
	usTok := env.ClusterToken(t, "us", "us-1")
	v1 := putPolicy(t, env.Store, "pol-1", "eu")
	v2 := putPolicy(t, env.Store, "pol-2", "eu") // before the heartbeat, not applied by it
	// pol-2 committed a minute ago, as far as the lag is concerned.
	if _, err := env.Store.DB().ExecContext(ctx, "UPDATE cilium_network_policies SET version_at = version_at - 60000 WHERE id = 'pol-2'"); err != nil {
		t.Fatal(err)
	}
	if _, err := env.Cluster(t, euTok).Heartbeat(ctx, &clusterv1.HeartbeatRequest{
		AgentVersion: "1.2.3", Cursors: map[string]uint64{kinds.CiliumNetworkPolicy: v1, kinds.Deployment: 0},
		HostReport: true, Parked: map[string]int32{kinds.CiliumNetworkPolicy: 2},
		Controllers: []*clusterv1.ControllerStatus{
			{Name: "cilium", PluginVersion: "0.4.0", Kinds: []string{kinds.CiliumNetworkPolicy}, Running: true},
			{Name: "deployment", PluginVersion: "0.3.0", Kinds: []string{kinds.Deployment}, Running: false, LastError: "plugin process exited unexpectedly"},
		},
	}); err != nil {
		t.Fatal(err)
	}
	v3 := putPolicy(t, env.Store, "pol-3", "eu") // after the heartbeat
	if err := env.Store.ReportApplyError(ctx, kinds.CiliumNetworkPolicy, "eu", "eu-1", "pol-2",
		&clusterv1.ApplyError{Version: v2, Message: "bad policy", Permanent: true}, v2); err != nil {
		t.Fatal(err)
	}
	// us-1 runs a host that does not report its controllers.
	if _, err := env.Cluster(t, usTok).Heartbeat(ctx, &clusterv1.HeartbeatRequest{AgentVersion: "1.0.0"}); err != nil {
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
	ctls := eu.GetControllers()
	if !eu.GetControllersReported() || len(ctls) != 2 ||
		ctls[0].GetName() != "cilium" || ctls[0].GetPluginVersion() != "0.4.0" || !ctls[0].GetRunning() || len(ctls[0].GetKinds()) != 1 ||
		ctls[1].GetName() != "deployment" || ctls[1].GetRunning() || ctls[1].GetLastError() == "" {
		t.Fatalf("eu-1 controllers: reported %v, %v", eu.GetControllersReported(), ctls)
	}
	byKind := map[string]*ctrlv1.KindProgress{}
	for _, k := range eu.GetKinds() {
		byKind[k.GetKind()] = k
	}
	cnp := byKind[kinds.CiliumNetworkPolicy]
	if cnp == nil || cnp.Cursor == nil || cnp.GetCursor() != v1 || cnp.GetHeadVersion() != v3 || !cnp.GetBehind() || cnp.GetApplyErrors() != 1 {
		t.Fatalf("ciliumnetworkpolicy of eu-1: %v (want cursor %d, head %d, behind, 1 apply error)", cnp, v1, v3)
	}
	if cnp.LagVersions == nil || cnp.GetLagVersions() != v3-v1 || cnp.Parked == nil || cnp.GetParked() != 2 {
		t.Fatalf("ciliumnetworkpolicy of eu-1: %v (want lag %d versions, 2 parked)", cnp, v3-v1)
	}
	// pol-2 (the oldest change above the cursor) was a minute old at the heartbeat.
	if cnp.LagSeconds == nil || cnp.GetLagSeconds() < 59 || cnp.GetLagSeconds() > 120 {
		t.Fatalf("ciliumnetworkpolicy of eu-1: lag %v seconds, want about 60 (pol-2 committed a minute before the heartbeat)", cnp.LagSeconds)
	}
	dep := byKind[kinds.Deployment]
	if dep == nil || dep.Cursor == nil || dep.GetCursor() != 0 || dep.GetHeadVersion() != 0 || dep.GetBehind() ||
		dep.GetLagVersions() != 0 || dep.LagSeconds == nil || dep.GetLagSeconds() != 0 || dep.Parked == nil || dep.GetParked() != 0 {
		t.Fatalf("deployment of eu-1 (nothing desired, cursor 0): %v", dep)
	}
	if us.GetLastHeartbeatAt() == nil || us.GetControllersReported() || len(us.GetControllers()) != 0 || len(us.GetKinds()) != 0 {
		t.Fatalf("us-1 runs a host that reports no controllers, and its region has nothing desired: %v", us)
	}

	// A heartbeat that catches up: no lag left, in versions or seconds.
	if _, err := env.Cluster(t, euTok).Heartbeat(ctx, &clusterv1.HeartbeatRequest{
		AgentVersion: "1.2.3", Cursors: map[string]uint64{kinds.CiliumNetworkPolicy: v3}, HostReport: true,
	}); err != nil {
		t.Fatal(err)
	}
	resp, err = api.ListClusters(ctx, &ctrlv1.ListClustersRequest{Region: "eu"})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range resp.GetClusters()[0].GetKinds() {
		if k.GetKind() == kinds.CiliumNetworkPolicy && (k.GetBehind() || k.GetLagVersions() != 0 || k.LagSeconds == nil || k.GetLagSeconds() != 0 || k.GetParked() != 0) {
			t.Fatalf("ciliumnetworkpolicy of eu-1 after catching up: %v", k)
		}
	}
	if c := resp.GetClusters()[0]; !c.GetControllersReported() || len(c.GetControllers()) != 0 {
		t.Fatalf("eu-1 now reports running no controller: %v", c)
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
	if k := resp.GetClusters()[0].GetKinds()[0]; k.Cursor != nil || !k.GetBehind() || k.LagVersions != nil || k.LagSeconds != nil || k.Parked != nil {
		t.Fatalf("us-1 without a cursor: %v (want no cursor, behind, no lag or parked figures)", k)
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

// gauge returns the value of the series of name with labels, and whether
// ctrl exports it.
func gauge(t *testing.T, env *ctrltest.Env, name string, labels map[string]string) (float64, bool) {
	t.Helper()
	mfs, err := env.Server.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if want, ok := labels[l.GetName()]; ok && want != l.GetValue() {
					continue series
				}
			}
			return m.GetGauge().GetValue(), true
		}
	}
	return 0, false
}

// TestLagMetricPerClusterAndKind: ctrl's /metrics has the lag of each
// (region, cluster, kind) in versions and seconds, and the series of a
// cluster that is no longer registered go away.
func TestLagMetricPerClusterAndKind(t *testing.T) {
	env := ctrltest.Start(t, ctrltest.Options{})
	ctx := context.Background()
	tok := env.ClusterToken(t, "eu", "eu-1")
	v1 := putPolicy(t, env.Store, "pol-1", "eu")
	v2 := putPolicy(t, env.Store, "pol-2", "eu")
	if _, err := env.Store.DB().ExecContext(ctx, "UPDATE cilium_network_policies SET version_at = version_at - 30000 WHERE id = 'pol-2'"); err != nil {
		t.Fatal(err)
	}
	if _, err := env.Cluster(t, tok).Heartbeat(ctx, &clusterv1.HeartbeatRequest{
		Cursors: map[string]uint64{kinds.CiliumNetworkPolicy: v1}, HostReport: true, Parked: map[string]int32{kinds.CiliumNetworkPolicy: 1},
	}); err != nil {
		t.Fatal(err)
	}
	series := map[string]string{"region": "eu", "cluster": "eu-1", "kind": kinds.CiliumNetworkPolicy}
	if v, ok := gauge(t, env, "krane_ctrl_cluster_lag_versions", series); !ok || v != float64(v2-v1) {
		t.Fatalf("krane_ctrl_cluster_lag_versions%v = %v (exported %v), want %d", series, v, ok, v2-v1)
	}
	if v, ok := gauge(t, env, "krane_ctrl_cluster_lag_seconds", series); !ok || v < 29 || v > 90 {
		t.Fatalf("krane_ctrl_cluster_lag_seconds%v = %v (exported %v), want about 30", series, v, ok)
	}
	if v, ok := gauge(t, env, "krane_ctrl_cluster_parked_objects", series); !ok || v != 1 {
		t.Fatalf("krane_ctrl_cluster_parked_objects%v = %v (exported %v), want 1", series, v, ok)
	}
	if _, ok := gauge(t, env, "krane_ctrl_cluster_heartbeat_age_seconds", map[string]string{"cluster": "eu-1"}); !ok {
		t.Fatal("no krane_ctrl_cluster_heartbeat_age_seconds for eu-1")
	}

	// The cluster is removed from the database: its series go (within the
	// collector's few seconds of caching).
	if _, err := env.Store.DB().ExecContext(ctx, "DELETE FROM clusters WHERE id = 'eu-1'"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		_, lag := gauge(t, env, "krane_ctrl_cluster_lag_versions", series)
		_, hb := gauge(t, env, "krane_ctrl_cluster_heartbeat_age_seconds", map[string]string{"cluster": "eu-1"})
		if !lag && !hb {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the series of a removed cluster are still exported after a minute")
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestRemoveClusterThroughTheAPI: FleetService.RemoveCluster removes the
// cluster with what it reported, records the operator who did it, and the
// cluster's token stops working; the listing shows the rest, each with
// whether it is live by the aggregation rule.
func TestRemoveClusterThroughTheAPI(t *testing.T) {
	env := ctrltest.Start(t, ctrltest.Options{})
	ctx := context.Background()
	euTok := env.ClusterToken(t, "eu", "eu-1")
	env.ClusterToken(t, "eu", "eu-2") // never beats: not live
	eu := env.Cluster(t, euTok)
	v := putPolicy(t, env.Store, "pol-1", "eu")
	if _, err := eu.Heartbeat(ctx, &clusterv1.HeartbeatRequest{AgentVersion: "1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := eu.ReportStatus(ctx, &clusterv1.ReportStatusRequest{Kind: kinds.CiliumNetworkPolicy, Id: "pol-1", ObservedVersion: v,
		Status: mustAny(t, &clusterv1.CiliumNetworkPolicyStatus{Applied: true})}); err != nil {
		t.Fatal(err)
	}
	api := ctrlv1.NewFleetServiceClient(env.Dial(t, env.OperatorToken(t, "alice")))
	list, err := api.ListClusters(ctx, &ctrlv1.ListClustersRequest{})
	if err != nil || len(list.GetClusters()) != 2 || !list.GetClusters()[0].GetLive() || list.GetClusters()[1].GetLive() {
		t.Fatalf("clusters before: %v, %v; want eu-1 live, eu-2 not", list, err)
	}
	resp, err := api.RemoveCluster(ctx, &ctrlv1.RemoveClusterRequest{ClusterId: "eu-1"})
	if err != nil || resp.GetRegion() != "eu" || resp.GetTokensRevoked() != 1 || resp.GetReportsDeleted() != 1 {
		t.Fatalf("RemoveCluster: %v, %v", resp, err)
	}
	if _, err := api.RemoveCluster(ctx, &ctrlv1.RemoveClusterRequest{ClusterId: "eu-1"}); status.Code(err) != codes.NotFound {
		t.Fatalf("removing it again: %v, want NotFound", err)
	}
	audit, err := env.Store.ClusterAudit(ctx, "eu-1", 10)
	if err != nil || len(audit) != 1 || audit[0].Actor != "alice" || audit[0].Action != "remove" {
		t.Fatalf("audit: %+v, %v", audit, err)
	}
	if list, err := api.ListClusters(ctx, &ctrlv1.ListClustersRequest{}); err != nil || len(list.GetClusters()) != 1 || list.GetClusters()[0].GetId() != "eu-2" {
		t.Fatalf("clusters after: %v, %v", list, err)
	}
	// What the removed cluster had in flight (authenticated before its
	// token was revoked) is refused, not stored again.
	if err := env.Store.ReportApplyError(ctx, kinds.CiliumNetworkPolicy, "eu", "eu-1", "pol-1",
		&clusterv1.ApplyError{Version: v, Message: "late", Permanent: true}, v); !errors.Is(err, store.ErrClusterNotRegistered) {
		t.Fatalf("a late apply error of the removed cluster: %v, want ErrClusterNotRegistered", err)
	}
	if res, err := env.Store.Ingest(ctx, []store.Report{{Kind: kinds.CiliumNetworkPolicy, Region: "eu", ClusterID: "eu-1", ID: "pol-1",
		Obs: store.Observation{Version: v, At: time.Now()}, Status: []byte(`{"applied":true}`)}}); err != nil || !errors.Is(res[0].Err, store.ErrClusterNotRegistered) {
		t.Fatalf("a late report of the removed cluster: %+v, %v; want ErrClusterNotRegistered", res, err)
	}
	if rows, err := env.Store.ActualStateRows(ctx); err != nil || rows["object_reports"]+rows["apply_errors"] != 0 {
		t.Fatalf("actual-state rows after the removal and its late reports: %v, %v", rows, err)
	}
	waitUnauthenticated := time.Now().Add(30 * time.Second)
	for {
		_, err := eu.Heartbeat(ctx, &clusterv1.HeartbeatRequest{AgentVersion: "1"})
		if status.Code(err) == codes.Unauthenticated {
			break
		}
		if time.Now().After(waitUnauthenticated) {
			t.Fatalf("the removed cluster's heartbeat: %v, want UNAUTHENTICATED", err)
		}
		time.Sleep(50 * time.Millisecond) // the token cache trusts a looked-up token for up to auth.cache_ttl
	}
}

func mustAny(t *testing.T, m proto.Message) *anypb.Any {
	t.Helper()
	a, err := anypb.New(m)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// TestListClustersPagesByCountAndBytes: clusters whose heartbeats say the
// most a heartbeat may (64 controllers with long errors) are listed a
// page at a time, by count and by bytes, each page within the budget and
// all pages together every cluster once, in order.
func TestListClustersPagesByCountAndBytes(t *testing.T) {
	env := ctrltest.Start(t, ctrltest.Options{})
	ctx := context.Background()
	const n = 60
	var controllers []*clusterv1.ControllerStatus
	for i := range 32 { // as much as a heartbeat may say (its declared bounds)
		var kinds []string
		for k := range 16 {
			kinds = append(kinds, fmt.Sprintf("kind-%02d-%02d.%s", i, k, strings.Repeat("x", 114)))
		}
		controllers = append(controllers, &clusterv1.ControllerStatus{Name: fmt.Sprintf("plugin-%02d-%s", i, strings.Repeat("n", 54)),
			PluginVersion: strings.Repeat("v", 128), Kinds: kinds, LastError: strings.Repeat("e", 1024)})
	}
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		region := fmt.Sprintf("r%d", i%3)
		c := env.Cluster(t, env.ClusterToken(t, region, fmt.Sprintf("c%03d", i)))
		wg.Go(func() { // one heartbeat batch for them all
			_, err := c.Heartbeat(ctx, &clusterv1.HeartbeatRequest{AgentVersion: "1", HostReport: true, Controllers: controllers})
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	api := ctrlv1.NewFleetServiceClient(env.Dial(t, env.OperatorToken(t, "ops")))
	var got []string
	pages, cutByBytes := 0, false
	for token := ""; ; pages++ {
		resp, err := api.ListClusters(ctx, &ctrlv1.ListClustersRequest{PageToken: token, PageSize: 50})
		if err != nil {
			t.Fatal(err)
		}
		if size := proto.Size(resp); size > fleetapi.PageBytes+(200<<10) || len(resp.GetClusters()) > 50 {
			t.Fatalf("page %d: %d clusters, %d bytes", pages, len(resp.GetClusters()), size)
		}
		for _, c := range resp.GetClusters() {
			got = append(got, c.GetRegion()+"/"+c.GetId())
		}
		if token = resp.GetNextPageToken(); token == "" {
			break
		}
		cutByBytes = cutByBytes || len(resp.GetClusters()) < 50
	}
	all, err := fleetapi.ListAll(ctx, api, "")
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, c := range all.GetClusters() {
		want = append(want, c.GetRegion()+"/"+c.GetId())
	}
	if len(got) != n || !slices.IsSorted(got) || fmt.Sprint(got) != fmt.Sprint(want) || !cutByBytes {
		t.Fatalf("%d clusters in %d pages (want %d, in order, several pages by bytes): %v", len(got), pages+1, n, got)
	}
	if _, err := api.ListClusters(ctx, &ctrlv1.ListClustersRequest{PageSize: 6000}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("page_size 6000: %v, want InvalidArgument", err)
	}
}

// TestRegionSeriesAndThePerClusterSwitch: the per-region series (what the
// shipped alerts read) hold the worst lag, the summed parked objects and
// the silent clusters of a region whatever the fleet's size; the
// per-cluster series go once the fleet outgrows PerClusterMax, and the
// scrape says which it carries.
func TestRegionSeriesAndThePerClusterSwitch(t *testing.T) {
	env := ctrltest.Start(t, ctrltest.Options{})
	ctx := context.Background()
	v1 := putPolicy(t, env.Store, "pol-1", "eu")
	v2 := putPolicy(t, env.Store, "pol-2", "eu")
	for i, cursor := range []uint64{v1, v2} {
		tok := env.ClusterToken(t, "eu", fmt.Sprintf("eu-%d", i+1))
		if _, err := env.Cluster(t, tok).Heartbeat(ctx, &clusterv1.HeartbeatRequest{
			AgentVersion: "1.2.3", Cursors: map[string]uint64{kinds.CiliumNetworkPolicy: cursor}, HostReport: true,
			Parked: map[string]int32{kinds.CiliumNetworkPolicy: int32(i + 1)},
		}); err != nil {
			t.Fatal(err)
		}
	}
	env.ClusterToken(t, "eu", "eu-3") // registered, never heartbeats: silent

	scrape := func(perClusterMax int) map[string][]*dto.Metric {
		reg := prometheus.NewRegistry()
		reg.MustRegister(fleetapi.NewCollector(env.Store, nil, fleetapi.CollectorOptions{PerClusterMax: perClusterMax}))
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		out := map[string][]*dto.Metric{}
		for _, mf := range mfs {
			out[mf.GetName()] = mf.GetMetric()
		}
		return out
	}
	value := func(ms []*dto.Metric, labels ...string) float64 {
		t.Helper()
	next:
		for _, m := range ms {
			for i := 0; i < len(labels); i += 2 {
				if !slices.ContainsFunc(m.GetLabel(), func(l *dto.LabelPair) bool { return l.GetName() == labels[i] && l.GetValue() == labels[i+1] }) {
					continue next
				}
			}
			return m.GetGauge().GetValue()
		}
		t.Fatalf("no series with %v among %v", labels, ms)
		return 0
	}

	small := scrape(3)
	if got := value(small["krane_ctrl_fleet_metrics_per_cluster"]); got != 1 {
		t.Fatalf("3 clusters, per_cluster_max 3: krane_ctrl_fleet_metrics_per_cluster = %v, want 1", got)
	}
	if n := len(small["krane_ctrl_cluster_agent_info"]); n != 3 {
		t.Fatalf("3 clusters, per_cluster_max 3: %d krane_ctrl_cluster_agent_info series, want 3", n)
	}

	big := scrape(2)
	if got := value(big["krane_ctrl_fleet_metrics_per_cluster"]); got != 0 {
		t.Fatalf("3 clusters, per_cluster_max 2: krane_ctrl_fleet_metrics_per_cluster = %v, want 0", got)
	}
	for name := range big {
		if strings.HasPrefix(name, "krane_ctrl_cluster_") {
			t.Fatalf("3 clusters, per_cluster_max 2: per-cluster series %s exported", name)
		}
	}
	want := []struct {
		name   string
		labels []string
		value  float64
	}{
		{"krane_ctrl_region_clusters", []string{"region", "eu"}, 3},
		{"krane_ctrl_region_clusters_silent", []string{"region", "eu"}, 1},
		{"krane_ctrl_region_lag_versions_max", []string{"region", "eu", "kind", kinds.CiliumNetworkPolicy}, float64(v2 - v1)},
		{"krane_ctrl_region_parked_objects", []string{"region", "eu", "kind", kinds.CiliumNetworkPolicy}, 3},
		{"krane_ctrl_agent_versions", []string{"version", "1.2.3"}, 2},
		{"krane_ctrl_agent_versions", []string{"version", ""}, 1},
	}
	for _, w := range want {
		if got := value(big[w.name], w.labels...); got != w.value {
			t.Errorf("%s%v = %v, want %v", w.name, w.labels, got, w.value)
		}
	}
	if age := value(big["krane_ctrl_region_heartbeat_age_seconds_max"], "region", "eu"); age < 0 || age > 600 {
		t.Errorf("krane_ctrl_region_heartbeat_age_seconds_max{region=eu} = %v, want the age of a heartbeat sent in this test", age)
	}
}
