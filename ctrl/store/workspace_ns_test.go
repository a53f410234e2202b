package store_test

import (
	"context"
	"testing"

	"krane.dev/ctrl/deployspec"
	"krane.dev/ctrl/store"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
)

// TestWorkspaceKeepsItsNamespace: a workspace that has deployments keeps
// the namespace they run in, even where deployspec.Namespace now maps its
// id elsewhere (no running workspace moves); a workspace without one gets
// deployspec.Namespace; and a namespace another workspace already holds is
// never handed out again, so two workspaces never share one even when
// stored rows of the old mapping did (the one that joined later moves).
func TestWorkspaceKeepsItsNamespace(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	create := func(id, workspace, ns string) {
		t.Helper()
		if _, _, err := s.CreateDeployment(ctx, store.Deployment{Spec: deployspec.Spec{ID: id, WorkspaceID: workspace, ProjectID: "p", EnvironmentID: "env", AppID: "app",
			K8sNamespace: ns, K8sName: deployspec.K8sName(id), Replicas: 1, Workload: &clusterv1.Workload{Image: "registry.test/app:1", CpuMillicores: 100, MemoryMib: 128}}}, ""); err != nil {
			t.Fatal(err)
		}
	}
	want := func(workspace, ns string) {
		t.Helper()
		got, err := s.WorkspaceNamespace(ctx, workspace)
		if err != nil {
			t.Fatal(err)
		}
		if got != ns {
			t.Errorf("WorkspaceNamespace(%q) = %q, want %q", workspace, got, ns)
		}
	}
	// New workspaces: the mapping.
	want("Acme", deployspec.Namespace("Acme"))
	want("acme-g4bwzwhz", deployspec.Namespace("acme-g4bwzwhz"))

	// A workspace running under the old mapping ("team-frontend" was
	// "ws-team-frontend") keeps it.
	create("dep_old", "team-frontend", "ws-team-frontend")
	want("team-frontend", "ws-team-frontend")

	// Stored rows of the old mapping where two workspaces shared one
	// namespace: Acme (whose mapping is unchanged) keeps it, the one that
	// joined later gets its own.
	create("dep_acme", "Acme", "ws-acme-g4bwzwhz")
	create("dep_mimic", "acme-g4bwzwhz", "ws-acme-g4bwzwhz")
	want("Acme", "ws-acme-g4bwzwhz")
	if got, _ := s.WorkspaceNamespace(ctx, "acme-g4bwzwhz"); got == "ws-acme-g4bwzwhz" {
		t.Errorf("workspace acme-g4bwzwhz keeps sharing namespace %s with Acme", got)
	}

	// A namespace some other workspace holds is never handed out, even
	// when the mapping gives it (a hash collision, a hand-written row).
	create("dep_squat", "squatter", deployspec.Namespace("fresh"))
	if got, err := s.WorkspaceNamespace(ctx, "fresh"); err == nil {
		t.Errorf("WorkspaceNamespace(fresh) = %q, held by workspace squatter; want an error", got)
	}
}
