package main

import (
	"context"
	"testing"

	"github.com/hashicorp/go-hclog"

	"krane.dev/sdk"
	"krane.dev/sdk/envtest"
	"krane.dev/sdk/plugintest"
)

func TestMain(m *testing.M) { envtest.Main(m) }

func change(t *testing.T, id string, version uint64, spec Spec) sdk.Change {
	t.Helper()
	s, err := sdk.JSONSpec(spec)
	if err != nil {
		t.Fatal(err)
	}
	return sdk.Change{Kind: Kind, ID: id, Version: version, Spec: s}
}

func TestConformance(t *testing.T) {
	cluster := envtest.Shared(t)
	if err := cluster.EnsureNamespace(context.Background(), "team-a"); err != nil {
		t.Fatal(err)
	}
	plugintest.Conformance(t, plugintest.New(t, New(hclog.NewNullLogger())), plugintest.Suite{
		Configure:  sdk.ConfigureRequest{Kube: sdk.KubeSource{Path: cluster.Kubeconfig}, Config: []byte(`{}`)},
		BadConfigs: []plugintest.BadConfig{{Config: `{"cpu":"1"}`, Key: "cpu"}},
		Objects:    []sdk.Change{change(t, "team-a", 1, Spec{Namespace: "team-a", CPU: "2", Memory: "4Gi", Pods: 20})},
		Invalid: []plugintest.InvalidChange{
			{Change: change(t, "bad-cpu", 2, Spec{Namespace: "team-a", CPU: "lots"}), Field: "cpu"},
			{Change: change(t, "bad-ns", 3, Spec{Namespace: "Team_A"}), Field: "namespace"},
		},
	})
}

func TestRBACManifest(t *testing.T) { plugintest.RBACGrants(t, "rbac.yaml", Permissions) }
