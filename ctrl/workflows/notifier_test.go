package workflows_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"krane.dev/ctrl/deployspec"
	"krane.dev/ctrl/internal/ctrltest"
	"krane.dev/ctrl/serve"
	"krane.dev/ctrl/store"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
)

// TestResyncStartsOrphanedDeploysAndFlagsOverdueOnes covers the Notifier's
// periodic pass: a deployment recorded as pending whose workflow never
// started (the API could not reach Restate, and nobody retried) is started;
// a deployment stuck in network past its deadline (its workflow paused or
// killed in Restate) is logged and counted.
func TestResyncStartsOrphanedDeploysAndFlagsOverdueOnes(t *testing.T) {
	w := newWorld(t, ctrltest.Options{Configure: func(c *serve.Config) { c.Deploy.ResyncInterval = time.Second }}, "eu")
	st, ctx := w.env.Store, context.Background()
	spec := func(id, env string) store.Deployment {
		return store.Deployment{Spec: deployspec.Spec{ID: id, WorkspaceID: "ws1", ProjectID: "p", EnvironmentID: env, AppID: "a", K8sName: deployspec.K8sName(id),
			K8sNamespace: "ws-ws1", Replicas: 1, Workload: &clusterv1.Workload{Image: "registry.test/app:1", CpuMillicores: 100, MemoryMib: 64, Port: 8080}}}
	}

	orphan := deployspec.NewDeploymentID()
	if _, _, err := st.CreateDeployment(ctx, spec(orphan, "env-orphan"), "recorded while Restate was away"); err != nil {
		t.Fatal(err)
	}
	stuck := deployspec.NewDeploymentID()
	if _, _, err := st.CreateDeployment(ctx, spec(stuck, "env-stuck"), ""); err != nil {
		t.Fatal(err)
	}
	if _, _, err := st.TransitionDeployment(ctx, stuck, []string{"pending"}, "network", ""); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-time.Hour).UnixMilli()
	if _, err := st.DB().Exec("UPDATE deployments SET updated_at = ?", old); err != nil {
		t.Fatal(err)
	}

	ctrltest.WaitStatus(t, w.api, orphan, 30*time.Second, network)
	w.clusters["eu"].ReportRunning(t, orphan, 1)
	if d, _ := ctrltest.WaitStatus(t, w.api, orphan, 30*time.Second, ready, failed); d.GetStatus() != ready {
		t.Fatalf("orphan: %s %q, want ready", d.GetStatus(), d.GetError())
	}
	wait(t, "the overdue deploy to be logged", 30*time.Second, func() bool {
		return strings.Contains(w.env.Logs.String(), "a deploy is overdue") && strings.Contains(w.env.Logs.String(), stuck)
	})
	if v := overdueValue(t, w); v != 1 {
		t.Fatalf("krane_ctrl_deploys_overdue = %v, want 1", v)
	}
	time.Sleep(2500 * time.Millisecond) // two more passes
	if n := strings.Count(w.env.Logs.String(), "a deploy is overdue"); n != 1 {
		t.Fatalf("the overdue deploy was logged %d times, want once", n)
	}
}

func overdueValue(t *testing.T, w *world) float64 {
	t.Helper()
	mfs, err := w.env.Server.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "krane_ctrl_deploys_overdue" {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatal("no krane_ctrl_deploys_overdue metric")
	return 0
}
