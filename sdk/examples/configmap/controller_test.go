package main

import (
	"context"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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
	ctx := context.Background()
	for _, ns := range []string{"team-a", "team-b"} {
		if err := cluster.EnsureNamespace(ctx, ns); err != nil {
			t.Fatal(err)
		}
	}
	ctl := plugintest.New(t, NewController(hclog.NewNullLogger()))
	plugintest.Conformance(t, ctl, plugintest.Suite{
		Configure: sdk.ConfigureRequest{
			Region: "local-a", ClusterID: "c1",
			Kube:   sdk.KubeSource{Path: cluster.Kubeconfig},
			Config: []byte(`{"allowed_namespaces":["team-a","team-b"]}`),
		},
		BadConfigs: []plugintest.BadConfig{
			{Config: `{"allowed_namespace":["x"]}`, Key: "allowed_namespace"},
			{Config: `{"allowed_namespaces":"team-a"}`, Key: "allowed_namespaces"},
		},
		Objects: []sdk.Change{
			change(t, "r1", 10, Spec{Namespace: "team-a", Name: "settings", Data: map[string]string{"mode": "fast"}}),
			change(t, "r2", 11, Spec{Namespace: "team-b", Name: "flags", Data: map[string]string{"beta": "on", "gamma": "off"}}),
		},
		Invalid: []plugintest.InvalidChange{
			{Change: change(t, "bad-ns", 12, Spec{Namespace: "kube-system", Name: "x"}), Field: "namespace"},
			{Change: change(t, "bad-name", 13, Spec{Namespace: "team-a", Name: "Not_A_Name"}), Field: "name"},
			{Change: change(t, "bad-key", 14, Spec{Namespace: "team-a", Name: "x", Data: map[string]string{"a b": "c"}}), Field: "data"},
			{Change: sdk.Change{Kind: Kind, ID: "not-json", Version: 15, Spec: sdk.Spec{TypeURL: "type.googleapis.com/google.protobuf.Struct", Value: []byte{0xff, 0x01}}}, Field: ""},
		},
	})
	// The suite deleted its objects; nothing of ours is left behind.
	left, err := cluster.Client.CoreV1().ConfigMaps("").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/managed-by=krane"})
	if err != nil {
		t.Fatal(err)
	}
	if len(left.Items) != 0 {
		t.Errorf("%d managed ConfigMaps left after the suite", len(left.Items))
	}
}

// TestRBACManifestGrantsPermissions: rbac.yaml grants what Describe
// declares (and Configure checks).
func TestRBACManifestGrantsPermissions(t *testing.T) {
	plugintest.RBACGrantsOnly(t, "rbac.yaml", Permissions)
}

// TestConfigureNamesMissingPermissions: an identity without the plugin's
// RBAC fails Configure at once, naming what is missing, instead of an
// informer that never syncs.
func TestConfigureNamesMissingPermissions(t *testing.T) {
	cluster := envtest.Shared(t)
	_, kubeconfig, err := cluster.ServiceAccountConfig(context.Background(), "example-rbac", "no-rights")
	if err != nil {
		t.Fatal(err)
	}
	ctl := plugintest.New(t, NewController(hclog.NewNullLogger()))
	_, err = ctl.Configure(context.Background(), &sdk.ConfigureRequest{Kube: sdk.KubeSource{Path: kubeconfig}, Config: []byte(`{}`)})
	for _, want := range []string{"list configmaps", "watch configmaps", "patch configmaps", "delete configmaps", "system:serviceaccount:example-rbac:no-rights"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Configure without RBAC = %v; want it to name %q", err, want)
		}
	}
}
