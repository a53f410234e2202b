package cli_test

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"krane.dev/ctrl/internal/ctrltest"
	"krane.dev/ctrl/store"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
	"krane.dev/shared/kinds"
)

// TestFleetList: `ctrl fleet list` (through the API) and `ctrl cluster
// list` (from the database) print the same view: per cluster its tokens,
// heartbeat, krane version and controllers with their versions (or "not
// reported"), per kind cursor, newest version, lag in versions and time,
// parked objects and apply errors, and why a controller is down; -o json
// prints the same document from both.
func TestFleetList(t *testing.T) {
	env := ctrltest.Start(t, ctrltest.Options{})
	ctx := context.Background()
	eu := env.ClusterToken(t, "eu", "eu-1")
	env.ClusterToken(t, "us", "us-1")
	v, err := env.Store.WriteTx(ctx, func(ctx context.Context, tx *store.Tx) error {
		return tx.PutCiliumNetworkPolicy(ctx, store.CiliumNetworkPolicy{ID: "pol-1", Region: "eu", K8sNamespace: "ns", K8sName: "pol-1", Policy: []byte(`{}`)})
	})
	if err != nil {
		t.Fatal(err)
	}
	head := v[0].Version
	vUS, err := env.Store.WriteTx(ctx, func(ctx context.Context, tx *store.Tx) error {
		return tx.PutCiliumNetworkPolicy(ctx, store.CiliumNetworkPolicy{ID: "pol-us", Region: "us", K8sNamespace: "ns", K8sName: "pol-us", Policy: []byte(`{}`)})
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := env.Cluster(t, eu).Heartbeat(ctx, &clusterv1.HeartbeatRequest{
		AgentVersion: "7.7.7", Cursors: map[string]uint64{kinds.Deployment: 0, kinds.CiliumNetworkPolicy: 0},
		HostReport: true, Parked: map[string]int32{kinds.CiliumNetworkPolicy: 3},
		Controllers: []*clusterv1.ControllerStatus{
			{Name: "cilium", PluginVersion: "0.9.1", Kinds: []string{kinds.CiliumNetworkPolicy}, Running: true},
			{Name: "deployment", PluginVersion: "0.9.0", Kinds: []string{kinds.Deployment}, LastError: "plugin binary missing"},
		},
	}); err != nil {
		t.Fatal(err)
	}
	t.Setenv("CTRL_ADDR", env.Server.GRPCAddr())
	t.Setenv("CTRL_TOKEN", env.OperatorToken(t, "cli test"))
	t.Setenv("CTRL_DB_DSN", env.DSN)

	for _, args := range [][]string{{"fleet", "list"}, {"cluster", "list"}} {
		code, out, errOut := run(t, args...)
		if code != 0 {
			t.Fatalf("%v: exit %d\n%s%s", args, code, out, errOut)
		}
		for _, want := range [][]string{
			{"CLUSTER", "REGION", "TOKENS", "LAST", "HEARTBEAT", "KRANE", "CONTROLLERS"},
			{"eu-1", "eu", "1"},
			{"us-1", "us", "1", "never", "-", "not", "reported"},
			{"CLUSTER", "KIND", "CURSOR", "NEWEST", "LAG", "LAG", "AGE", "PARKED", "APPLY", "ERRORS"},
			{"eu-1", kinds.CiliumNetworkPolicy, "0", itoa(head), itoa(head)},
			{"eu-1", kinds.Deployment, "0", "0", "0", "0s", "0", "0"},
			{"us-1", kinds.CiliumNetworkPolicy, "-", itoa(vUS[0].Version), "-", "-", "-", "0"},
		} {
			if !regexpLine(out, want...) {
				t.Errorf("%v: no line starting %q:\n%s", args, want, out)
			}
		}
		if !strings.Contains(out, "cilium 0.9.1, deployment 0.9.0 (not running)") || !strings.Contains(out, "7.7.7") ||
			!strings.Contains(out, "eu-1: controller deployment is not running: plugin binary missing") {
			t.Errorf("%v: controllers of eu-1 not shown:\n%s", args, out)
		}
		if !regexpLine(out, "eu-1", kinds.CiliumNetworkPolicy, "0", itoa(head), itoa(head)) || !strings.Contains(out, " 3 ") {
			t.Errorf("%v: parked objects of eu-1 not shown:\n%s", args, out)
		}
	}

	var docs []string
	for _, args := range [][]string{{"fleet", "list", "--region", "eu", "-o", "json"}, {"cluster", "list", "--region", "eu", "-o", "json"}} {
		code, out, errOut := run(t, args...)
		var doc struct {
			Clusters []struct {
				ID                  string `json:"id"`
				ControllersReported bool   `json:"controllersReported"`
				Controllers         []struct {
					Name, PluginVersion string
					Running             bool
				} `json:"controllers"`
				Kinds []struct {
					Kind        string
					LagVersions string `json:"lagVersions"`
					LagSeconds  *float64
					Parked      *int
				} `json:"kinds"`
			} `json:"clusters"`
		}
		if err := json.Unmarshal([]byte(out), &doc); code != 0 || err != nil || len(doc.Clusters) != 1 || doc.Clusters[0].ID != "eu-1" ||
			!doc.Clusters[0].ControllersReported || len(doc.Clusters[0].Controllers) != 2 || len(doc.Clusters[0].Kinds) != 2 {
			t.Fatalf("%v: exit %d, %v\n%s%s", args, code, err, out, errOut)
		}
		k := doc.Clusters[0].Kinds[0]
		if k.Kind != kinds.CiliumNetworkPolicy || k.LagVersions != itoa(head) || k.Parked == nil || *k.Parked != 3 || k.LagSeconds == nil {
			t.Fatalf("%v: %+v", args, k)
		}
		docs = append(docs, out)
	}
	if docs[0] != docs[1] {
		t.Fatalf("fleet list and cluster list print different JSON:\n%s\n%s", docs[0], docs[1])
	}

	t.Setenv("CTRL_TOKEN", eu)
	if code, _, errOut := run(t, "fleet", "list"); code == 0 || !strings.Contains(errOut, "operator token") {
		t.Fatalf("fleet list with a cluster token: exit %d\n%s", code, errOut)
	}
	if code, out, errOut := run(t, "admin", "cluster", "list", "-o", "yaml"); code != 0 || !strings.Contains(out, "clusters:") {
		t.Fatalf("admin cluster list -o yaml: exit %d\n%s%s", code, out, errOut)
	}
	if code, _, errOut := run(t, "cluster", "list", "-o", "xml"); code == 0 || !strings.Contains(errOut, "want table, json or yaml") {
		t.Fatalf("cluster list -o xml: exit %d\n%s", code, errOut)
	}
}

func itoa(v uint64) string { return strconv.FormatUint(v, 10) }
