package store_test

//lint:file-ignore SA1019 legacy-workload: removed no earlier than v0.3.0 (docs/compatibility.md); this file builds or reads the deprecated top-level workload fields

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"krane.dev/ctrl/deployspec"
	"krane.dev/ctrl/store"
	"krane.dev/internal/testenv"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
	"krane.dev/shared/kinds"
)

// TestWorkloadMigrationMovesTodaysRows migrates a database holding
// deployments in the schema of a column per workload field and checks
// that each row's workload reads back whole (API view and cluster wire),
// that down restores the columns, and that up again gives the same.
func TestWorkloadMigrationMovesTodaysRows(t *testing.T) {
	ctx := context.Background()
	s, err := store.Open(ctx, testenv.SharedMySQL(t).Database(t, t.Name()), store.PoolOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if err := s.MigrateTo(ctx, 39); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`INSERT INTO deployments (id, workspace_id, project_id, environment_id, app_id, k8s_namespace, k8s_name, image, cpu_millicores, memory_mib,
  replicas, env_vars, healthcheck, port, command, shutdown_signal, status, created_at, updated_at) VALUES
  ('d1', 'ws', 'p', 'e', 'a', 'ws-ws', 'dep-d1', 'registry.test/app:1', 300, 512, 3, '{"A": "1", "B": "two words"}',
   '{"method": "POST", "path": "/healthz", "port": 9001, "period_seconds": 5, "failure_threshold": 2}', 9000, '["/app", "serve", "--fast"]', 'SIGINT', 'ready', 1, 1),
  ('d2', 'ws', 'p', 'e', 'a', 'ws-ws', 'dep-d2', 'registry.test/app:2', 250, 256, 1, '{}', NULL, 8080, '[]', 'SIGTERM', 'pending', 2, 2)`,
		`INSERT INTO deployment_topology (deployment_id, region, desired_replicas, version, created_at, updated_at) VALUES ('d1', 'eu', 3, 5, 1, 1)`,
	} {
		if _, err := s.DB().ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	want := map[string]*clusterv1.Workload{
		"d1": {Image: "registry.test/app:1", CpuMillicores: 300, MemoryMib: 512, EnvVars: map[string]string{"A": "1", "B": "two words"},
			Healthcheck: &clusterv1.Healthcheck{Method: "POST", Path: "/healthz", Port: 9001, PeriodSeconds: 5, FailureThreshold: 2},
			Port:        9000, Command: []string{"/app", "serve", "--fast"}, ShutdownSignal: "SIGINT"},
		"d2": {Image: "registry.test/app:2", CpuMillicores: 250, MemoryMib: 256, Port: 8080, ShutdownSignal: "SIGTERM"},
	}
	check := func(when string) {
		t.Helper()
		for id, w := range want {
			d, err := s.GetDeployment(ctx, id)
			if err != nil {
				t.Fatalf("%s: %v", when, err)
			}
			if !proto.Equal(d.Workload, w) {
				t.Errorf("%s: the workload of %s is %v, want %v", when, id, d.Workload, w)
			}
		}
		c, err := s.Desired(ctx, kinds.Deployment, "eu", "d1")
		if err != nil || c.Err != nil {
			t.Fatalf("%s: %v %v", when, err, c.Err)
		}
		d := c.Spec.(*clusterv1.Deployment)
		if !proto.Equal(d.GetWorkload(), want["d1"]) || d.GetImage() != "registry.test/app:1" || d.GetPort() != 9000 || d.GetReplicas() != 3 {
			t.Errorf("%s: d1 on the cluster wire: %v", when, d)
		}
	}
	if _, err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	check("after the migration")

	if err := s.MigrateDownTo(ctx, 39); err != nil {
		t.Fatal(err)
	}
	var image, env, command, signal string
	var port int
	var cpu int64
	if err := s.DB().QueryRowContext(ctx, "SELECT image, cpu_millicores, env_vars, command, port, shutdown_signal FROM deployments WHERE id = 'd1'").
		Scan(&image, &cpu, &env, &command, &port, &signal); err != nil {
		t.Fatal(err)
	}
	if image != "registry.test/app:1" || cpu != 300 || !strings.Contains(env, `"two words"`) || !strings.Contains(command, "--fast") || port != 9000 || signal != "SIGINT" {
		t.Fatalf("d1 after migrating down: %s %d %s %s %d %s", image, cpu, env, command, port, signal)
	}
	if _, err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	check("after down and up")
}

// TestWorkloadDocumentRefusesWhatANewerCtrlWrote: a document of another
// version, or with a field this ctrl does not know, is refused with the
// fix (upgrade), never streamed without the field.
func TestWorkloadDocumentRefusesWhatANewerCtrlWrote(t *testing.T) {
	s := openDSN(t, testenv.SharedMySQL(t).Database(t, t.Name()), store.PoolOptions{})
	ctx := context.Background()
	if _, _, err := s.CreateDeployment(ctx, store.Deployment{Spec: deployspec.Spec{ID: "d1", WorkspaceID: "ws", ProjectID: "p", EnvironmentID: "e", AppID: "a",
		K8sNamespace: "ws-ws", K8sName: "dep-d1", Replicas: 1, Workload: &clusterv1.Workload{Image: "img:1"}}}, ""); err != nil {
		t.Fatal(err)
	}
	for _, doc := range []string{`{"version": 2, "workload": {"image": "img:1"}}`, `{"version": 1, "workload": {"image": "img:1", "from_the_future": 1}}`} {
		if _, err := s.DB().ExecContext(ctx, "UPDATE deployments SET workload = ? WHERE id = 'd1'", doc); err != nil {
			t.Fatal(err)
		}
		if _, err := s.GetDeployment(ctx, "d1"); err == nil || !strings.Contains(err.Error(), "upgrade") {
			t.Errorf("document %s: %v, want an error saying to upgrade", doc, err)
		}
	}
}
