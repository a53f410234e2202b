package store_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"krane.dev/ctrl/store"
	"krane.dev/internal/testenv"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
	"krane.dev/shared/kinds"
)

// liveClusters registers clusters in region and has each send a
// heartbeat, so that the aggregation rule counts them.
func liveClusters(t testing.TB, s *store.Store, region string, ids ...string) {
	t.Helper()
	ctx := context.Background()
	for i, id := range ids {
		tok := store.Token{ID: fmt.Sprintf("%-12.12s", fmt.Sprintf("t%s%d", id, i)), SecretHash: [32]byte{1}, CreatedAt: time.Now()}
		if err := s.RegisterCluster(ctx, id, region, tok); err != nil {
			t.Fatal(err)
		}
		if err := s.Heartbeat(ctx, id, region, store.HeartbeatData{AgentVersion: "test"}); err != nil {
			t.Fatal(err)
		}
	}
}

// TestReportsOfTwoClustersDoNotOverwriteEachOther: two live clusters of
// one region report on one object. Whichever reports last, the region's
// observed version is the lower of the two (the cluster still at version
// 1 has not applied version 2), and each cluster's own report stays as it
// sent it. Before per-cluster rows, the region kept one status, that of
// the cluster that reported last: after cluster B's older report the
// object went from 2 back to 1, and after cluster A's newer one it said
// version 2 was applied while B still ran version 1.
func TestReportsOfTwoClustersDoNotOverwriteEachOther(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	liveClusters(t, s, "eu", "eu-a", "eu-b")
	for _, order := range [][2]string{{"eu-a", "eu-b"}, {"eu-b", "eu-a"}} {
		t.Run(order[0]+" first", func(t *testing.T) {
			id := "obj-" + order[0]
			_, v1 := putObject(t, s, quota, id, `{"cpu":"1"}`, "eu")
			_, v2 := putObject(t, s, quota, id, `{"cpu":"2"}`, "eu")
			report := map[string]func(){
				"eu-a": func() { reportResource(t, s, "eu", "eu-a", id, v2["eu"], `{"at":2}`) },
				"eu-b": func() { reportResource(t, s, "eu", "eu-b", id, v1["eu"], `{"at":1}`) },
			}
			report[order[0]]()
			report[order[1]]()
			o, err := s.GetObject(ctx, quota, id)
			if err != nil {
				t.Fatal(err)
			}
			if r := o.Regions[0]; r.ObservedVersion != v1["eu"] {
				t.Fatalf("after %s then %s: the region's observed version is %d, want %d (eu-b has not applied version %d)",
					order[0], order[1], r.ObservedVersion, v1["eu"], v2["eu"])
			}
			assertClusterReports(t, s, quota, "eu", id, map[string]uint64{"eu-a": v2["eu"], "eu-b": v1["eu"]})
		})
	}
}

func reportResource(t testing.TB, s *store.Store, region, cluster, id string, v uint64, status string) {
	t.Helper()
	accepted, err := s.ReportResource(context.Background(), quota, region, cluster, id, store.Observation{Version: v, At: time.Now()}, []byte(status))
	if err != nil || !accepted {
		t.Fatalf("cluster %s reports %s at version %d: accepted %v, %v", cluster, id, v, accepted, err)
	}
}

// assertClusterReports checks each cluster's own stored report on an
// object: its version.
func assertClusterReports(t testing.TB, s *store.Store, kind, region, id string, want map[string]uint64) {
	t.Helper()
	reps, err := s.ObjectReports(context.Background(), kind, region, id)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]uint64{}
	for _, r := range reps {
		got[r.ClusterID] = r.Version
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("%s %s in %s: the clusters' reports are at %v, want %v", kind, id, region, got, want)
	}
}

// TestActualStateMigrationMovesTodaysRows migrates a database holding
// rows of the schema before per-cluster reports (statuses in the objects'
// columns, guards in report_guards) and checks that each status lands on
// the cluster that sent it.
func TestActualStateMigrationMovesTodaysRows(t *testing.T) {
	ctx := context.Background()
	s, err := store.Open(ctx, testenv.SharedMySQL(t).Database(t, t.Name()), store.PoolOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if err := s.MigrateTo(ctx, 12); err != nil {
		t.Fatal(err)
	}
	const at, before = int64(1_700_000_000_000_000_000), int64(1_699_999_999_000_000_000)
	for _, q := range []string{
		`INSERT INTO clusters (id, region, created_at) VALUES ('eu-a', 'eu', 1), ('eu-b', 'eu', 1), ('us-1', 'us', 1)`,
		// eu-a sent the last report of d1 (version 5); eu-b's guard is older.
		fmt.Sprintf(`INSERT INTO deployment_topology (deployment_id, region, desired_replicas, version, report_observed_version, report_observed_at_ns,
  reported_desired_replicas, reported_ready_replicas, reported_available_replicas, created_at, updated_at)
  VALUES ('d1', 'eu', 3, 5, 5, %d, 3, 2, 2, 1, 1)`, at),
		fmt.Sprintf(`INSERT INTO report_guards VALUES ('deployment', 'eu', 'd1', 'eu-a', 5, %d, %d), ('deployment', 'eu', 'd1', 'eu-b', 4, %d, %d)`, at, at, before, before),
		// s1 was reported before guards existed: us has one cluster.
		fmt.Sprintf(`INSERT INTO sentinels (id, region, workspace_id, project_id, app_id, environment_id, k8s_name, image, replicas, cpu_millicores, memory_mib,
  running_image, available_replicas, health, health_reason, version, report_observed_version, report_observed_at_ns, created_at, updated_at)
  VALUES ('s1', 'us', 'w', 'p', 'a', 'e', 'sen', 'sen:2', 2, 100, 128, 'sen:2', 2, 'healthy', 'ok', 7, 7, %d, 1, 1)`, at),
		fmt.Sprintf(`INSERT INTO cilium_network_policies (id, region, k8s_namespace, k8s_name, policy, version, status_applied, status_message,
  report_observed_version, report_observed_at_ns, created_at, updated_at) VALUES ('p1', 'eu', 'ns', 'pol', '{}', 3, TRUE, 'fine', 3, %d, 1, 1)`, at),
		fmt.Sprintf(`INSERT INTO report_guards VALUES ('ciliumnetworkpolicy', 'eu', 'p1', 'eu-b', 3, %d, %d)`, at, at),
		fmt.Sprintf(`INSERT INTO resources (kind, region, id, spec, version, status, report_observed_version, report_observed_at_ns, created_at, updated_at)
  VALUES ('%s', 'eu', 'r1', '{}', 9, '{"used": "1"}', 9, %d, 1, 1)`, quota, at),
		fmt.Sprintf(`INSERT INTO report_guards VALUES ('%s', 'eu', 'r1', 'eu-a', 9, %d, %d)`, quota, at, at),
	} {
		if _, err := s.DB().ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	if _, err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		kind, region, id string
		want             string
	}{
		{"deployment", "eu", "d1", `[eu-a@5 {"available_replicas":2,"desired_replicas":3,"ready_replicas":2} eu-b@4 ]`},
		{"sentinel", "us", "s1", `[us-1@7 {"available_replicas":2,"health":"HEALTH_HEALTHY","observed_generation":0,"ready_replicas":0,"reason":"ok","running_image":"sen:2","updated_replicas":0}]`},
		{"ciliumnetworkpolicy", "eu", "p1", `[eu-b@3 {"applied":true,"message":"fine"}]`},
		{quota, "eu", "r1", `[eu-a@9 {"used":"1"}]`},
	} {
		reps, err := s.ObjectReports(ctx, c.kind, c.region, c.id)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, r := range reps {
			got = append(got, fmt.Sprintf("%s@%d %s", r.ClusterID, r.Version, r.Status))
		}
		if fmt.Sprint(got) != c.want {
			t.Errorf("%s %s in %s after the migration: %v, want %s", c.kind, c.id, c.region, got, c.want)
		}
	}
	// The statuses read back through the rule, once the clusters beat.
	for _, id := range []string{"eu-a", "eu-b", "us-1"} {
		region := map[string]string{"eu-a": "eu", "eu-b": "eu", "us-1": "us"}[id]
		if _, err := s.DB().ExecContext(ctx, "INSERT INTO api_tokens (id, kind, cluster_id, region, secret_hash, created_at) VALUES (?, 'cluster', ?, ?, ?, 1)",
			"tok-"+id, id, region, make([]byte, 32)); err != nil {
			t.Fatal(err)
		}
		if err := s.Heartbeat(ctx, id, region, store.HeartbeatData{}); err != nil {
			t.Fatal(err)
		}
	}
	sn, err := s.GetSentinel(ctx, "s1")
	if err != nil || sn.RunningImage != "sen:2" || sn.Health != "healthy" || sn.ReportObservedVersion != 7 || !sn.Actual.Converged() {
		t.Fatalf("sentinel s1 after the migration: %+v, %v", sn, err)
	}

	// Down and up again: the guards come back (statuses are reported
	// again by the clusters), and the migration runs on them again.
	if err := s.MigrateDownTo(ctx, 12); err != nil {
		t.Fatal(err)
	}
	var guards int
	if err := s.DB().QueryRowContext(ctx, "SELECT COUNT(*) FROM report_guards").Scan(&guards); err != nil || guards != 5 {
		t.Fatalf("report_guards after migrating down: %d rows, %v; want the 5 reports", guards, err)
	}
	if _, err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if reps, err := s.ObjectReports(ctx, "deployment", "eu", "d1"); err != nil || len(reps) != 2 {
		t.Fatalf("d1's reports after down and up: %+v, %v", reps, err)
	}
}

// TestScaleCompletesWhileAReportBatchIsOpen holds a report batch of two
// clusters on a deployment open (written, not committed) and completes a
// scale of the same deployment meanwhile: reports lock their own rows
// only, never the desired-state row an operator's write changes. Before
// per-cluster rows a report locked the deployment's topology row until it
// committed, and the scale waited behind it.
func TestScaleCompletesWhileAReportBatchIsOpen(t *testing.T) {
	dsn := testenv.SharedMySQL(t).Database(t, t.Name())
	s := openDSN(t, dsn, store.PoolOptions{})
	ctx := context.Background()
	stamped, err := s.WriteTx(ctx, func(ctx context.Context, tx *store.Tx) error {
		return putDeployment(ctx, tx, "d1", "eu", "img:1", 2, "running")
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.DB().ExecContext(ctx, "UPDATE deployments SET status = 'ready' WHERE id = 'd1'"); err != nil {
		t.Fatal(err)
	}
	v := stamped[len(stamped)-1].Version
	liveClusters(t, s, "eu", "eu-1", "eu-2")
	held, release := make(chan struct{}), make(chan struct{})
	s.SetTestHooks(store.TestHooks{BeforeReportCommit: func(context.Context, int) {
		close(held)
		<-release
	}})
	reported := make(chan error, 1)
	go func() {
		var reps []store.Report
		for _, cluster := range []string{"eu-1", "eu-2"} {
			r, err := store.StatusReport(kinds.Deployment, "eu", cluster, "d1", store.Observation{Version: v, At: time.Now()},
				&clusterv1.DeploymentStatus{DeploymentId: "d1", DesiredReplicas: 2, ReadyReplicas: 2,
					Instances: []*clusterv1.Instance{{K8SName: cluster + "-pod", Status: clusterv1.Instance_STATUS_RUNNING}}})
			if err != nil {
				reported <- err
				return
			}
			reps = append(reps, r)
		}
		res, err := s.Ingest(ctx, reps)
		if err == nil && (!res[0].Changed || !res[1].Changed) {
			err = fmt.Errorf("results %+v, want both written", res)
		}
		reported <- err
	}()
	<-held
	// The batch holds its locks now. A scale that waited on them would
	// fail with a lock wait timeout (1 s on this writer's connections)
	// instead of completing.
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Params == nil {
		cfg.Params = map[string]string{}
	}
	cfg.Params["innodb_lock_wait_timeout"] = "1"
	s2 := openDSN(t, cfg.FormatDSN(), store.PoolOptions{})
	var before int32
	_, err = s2.WriteTx(ctx, func(ctx context.Context, tx *store.Tx) error {
		if _, err := tx.LockDeploymentToScale(ctx, "d1"); err != nil {
			return err
		}
		var err error
		before, err = tx.ScaleTopology(ctx, "d1", 3)
		return err
	})
	select {
	case err := <-reported:
		t.Fatalf("the report batch ended while held: %v", err)
	default:
	}
	if err != nil || before != 2 {
		t.Fatalf("scale while a report batch is open: replicas before %d, %v; want 2 and no error", before, err)
	}
	close(release)
	if err := <-reported; err != nil {
		t.Fatal(err)
	}
	assertClusterReports(t, s, kinds.Deployment, "eu", "d1", map[string]uint64{"eu-1": v, "eu-2": v})
}

// TestChurnLeavesActualStateTablesFlat: 10,000 create/delete cycles of
// objects over 50 clusters that report each one applied and then deleted
// (in batches, as ctrl's ingestion sends them). Every report of a
// cluster that applied a delete is pruned, so the actual-state tables end
// within a small constant of their size before; without pruning they
// would hold a row per object and cluster (500,000 here).
func TestChurnLeavesActualStateTablesFlat(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	var clusters []string
	for i := range 50 {
		clusters = append(clusters, fmt.Sprintf("c%02d", i))
	}
	liveClusters(t, s, "eu", clusters...)
	before, err := s.ActualStateRows(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const rounds, objects = 100, 100 // 10,000 cycles
	write := func(deleted bool) map[string]uint64 {
		t.Helper()
		stamped, err := s.WriteTx(ctx, func(ctx context.Context, tx *store.Tx) error {
			for i := range objects {
				if err := tx.PutResource(ctx, store.Resource{Kind: quota, Region: "eu", ID: fmt.Sprintf("churn-%03d", i), Spec: []byte(`{"cpu":"1"}`), Deleted: deleted}); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]uint64{}
		for _, st := range stamped {
			out[st.ID] = st.Version
		}
		return out
	}
	report := func(versions map[string]uint64, deleted bool) {
		t.Helper()
		var reps []store.Report
		for _, c := range clusters {
			for id, v := range versions {
				r := store.Report{Kind: quota, Region: "eu", ClusterID: c, ID: id, Obs: store.Observation{Version: v, At: time.Now()}, Deleted: deleted}
				if !deleted {
					r.Status = []byte(`{"used":"1"}`)
				}
				reps = append(reps, r)
			}
		}
		res, err := s.Ingest(ctx, reps)
		if err != nil {
			t.Fatal(err)
		}
		for i, r := range res {
			if !r.Accepted || r.Err != nil {
				t.Fatalf("report %+v: %+v", reps[i], r)
			}
		}
	}
	for range rounds {
		report(write(false), false)
		report(write(true), true)
	}
	after, err := s.ActualStateRows(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for table, n := range after {
		if n > before[table]+10 {
			t.Errorf("%s: %d rows after %d create/delete cycles over %d clusters, %d before", table, n, rounds*objects, len(clusters), before[table])
		}
	}
	t.Logf("actual-state rows before %v, after %v", before, after)
}

// TestALateReportDoesNotBringBackADeletedObject: once a cluster reported
// an object's delete as applied (its row goes), a report it sent before
// the delete and that arrives afterwards (several report senders, a call
// ctrl committed after its caller gave up) is refused: the object's state
// does not come back.
func TestALateReportDoesNotBringBackADeletedObject(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	liveClusters(t, s, "eu", "eu-a")
	_, v1 := putObject(t, s, quota, "late", `{"cpu":"1"}`, "eu")
	reportResource(t, s, "eu", "eu-a", "late", v1["eu"], `{"at":1}`)
	var vDel uint64
	stamped, err := s.WriteTx(ctx, func(ctx context.Context, tx *store.Tx) error {
		_, err := tx.DeleteObject(ctx, quota, "late", []string{"eu"})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	vDel = stamped[0].Version
	ingest := func(r store.Report) store.ReportResult {
		t.Helper()
		res, err := s.Ingest(ctx, []store.Report{r})
		if err != nil {
			t.Fatal(err)
		}
		return res[0]
	}
	base := store.Report{Kind: quota, Region: "eu", ClusterID: "eu-a", ID: "late"}
	del := base
	del.Obs, del.Deleted = store.Observation{Version: vDel, At: time.Now()}, true
	if r := ingest(del); !r.Accepted || r.Err != nil {
		t.Fatalf("the delete-applied report: %+v", r)
	}
	late := base
	late.Obs, late.Status = store.Observation{Version: v1["eu"], At: time.Now().Add(-time.Second)}, []byte(`{"at":1,"late":true}`)
	if r := ingest(late); r.Accepted || r.Err != nil {
		t.Fatalf("a report from before the delete, arriving after it: %+v; want it refused as stale", r)
	}
	var rows int
	if err := s.DB().QueryRowContext(ctx, "SELECT COUNT(*) FROM object_reports WHERE id = 'late'").Scan(&rows); err != nil || rows != 0 {
		t.Fatalf("%d report rows of the deleted object (%v); want none", rows, err)
	}
}

// TestAClusterWhoseControllerIsDownStillCounts: a live cluster whose
// controller for a kind is enabled but not running (crashed, refused by
// its pin, reloading) has not applied the kind's objects: it counts, and
// the region does not converge without it. So does a built-in controller
// that never started (its kinds unknown yet, its name the kind's). A
// cluster that runs no controller for the kind does not count.
func TestAClusterWhoseControllerIsDownStillCounts(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	liveClusters(t, s, "eu", "eu-up", "eu-down", "eu-other")
	hb := func(id string, ctl store.ControllerStatus) {
		t.Helper()
		if err := s.Heartbeat(ctx, id, "eu", store.HeartbeatData{AgentVersion: "t", Host: &store.HostReport{Controllers: []store.ControllerStatus{ctl}}}); err != nil {
			t.Fatal(err)
		}
	}
	hb("eu-up", store.ControllerStatus{Name: "quota", Kinds: []string{quota}, Running: true})
	hb("eu-down", store.ControllerStatus{Name: "quota", Kinds: []string{quota}, Running: false, LastError: "plugin process exited unexpectedly"})
	hb("eu-other", store.ControllerStatus{Name: "cilium", Kinds: []string{kinds.CiliumNetworkPolicy}, Running: true})
	_, v := putObject(t, s, quota, "q", `{"cpu":"1"}`, "eu")
	reportResource(t, s, "eu", "eu-up", "q", v["eu"], `{}`)
	o, err := s.GetObject(ctx, quota, "q")
	if err != nil {
		t.Fatal(err)
	}
	a := o.Regions[0].Actual
	if a.Converged() || strings.Join(a.Missing(), ",") != "eu-down" || slices.Contains(a.Counted, "eu-other") {
		t.Fatalf("counted %v, missing %v, converged %v; want eu-down counted and missing, eu-other not counted", a.Counted, a.Missing(), a.Converged())
	}

	never := store.RuleCluster("c", "eu", time.Now(), &store.HostReport{Controllers: []store.ControllerStatus{{Name: "deployment"}}})
	if !never.Serves(kinds.Deployment, time.Now()) || never.Serves(kinds.Sentinel, time.Now()) {
		t.Errorf("a built-in deployment controller that never started: serves deployment %v, sentinel %v; want true, false",
			never.Serves(kinds.Deployment, time.Now()), never.Serves(kinds.Sentinel, time.Now()))
	}
}
