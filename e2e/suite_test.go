package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"krane.dev/ctrl/store"
	"krane.dev/internal/stack"
)

var cnpResource = schema.GroupVersionResource{Group: "cilium.io", Version: "v2", Resource: "ciliumnetworkpolicies"}

// deployJSON creates a deployment through the CLI and waits for ready.
func deployJSON(t *testing.T, st *stack.Stack, env, image string, replicas int) string {
	t.Helper()
	out, err := st.Ctrl(context.Background(), "deploy", "create", "--workspace", "e2e", "--project", "p", "--app", "a",
		"--environment", env, "--image", image, "--replicas", fmt.Sprint(replicas), "--wait", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		ID     string `json:"id"`
		Status string `json:"status"`
	}
	// -o json with --wait prints JSON documents; the last is the final state.
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for dec.More() {
		if err := dec.Decode(&d); err != nil {
			t.Fatalf("deploy create -o json: %v\n%s", err, out)
		}
	}
	if d.ID == "" {
		t.Fatalf("deploy create -o json printed no deployment:\n%s", out)
	}
	if !strings.Contains(strings.ToLower(d.Status), "ready") {
		t.Fatalf("deployment %s ended %s", d.ID, d.Status)
	}
	return d.ID
}

// TestResyncRestoresHandDeletedReplicaSet: somebody deletes a workload by
// hand; the next resync puts it back, with nothing changed in ctrl.
func TestResyncRestoresHandDeletedReplicaSet(t *testing.T) {
	st := sharedStack(t)
	ctx := context.Background()
	id := deployJSON(t, st, "e2e-resync", "registry.local/e2e/resync:1", 1)
	c := st.Clusters["local-a"]
	sel := metav1.ListOptions{LabelSelector: "unkey.com/deployment.id=" + id}
	list, err := c.Client.AppsV1().ReplicaSets("").List(ctx, sel)
	if err != nil || len(list.Items) != 1 {
		t.Fatalf("ReplicaSets of %s: %d, %v", id, len(list.Items), err)
	}
	rs := list.Items[0]
	if err := c.Client.AppsV1().ReplicaSets(rs.Namespace).Delete(ctx, rs.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	waitFor(t, 60*time.Second, "the hand-deleted ReplicaSet restored", func() error {
		got, err := c.Client.AppsV1().ReplicaSets(rs.Namespace).Get(ctx, rs.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if got.UID == rs.UID {
			return fmt.Errorf("still the old object")
		}
		if got.Status.ReadyReplicas != 1 {
			return fmt.Errorf("restored but %d/1 ready", got.Status.ReadyReplicas)
		}
		return nil
	})
	t.Logf("hand-deleted ReplicaSet restored and ready %s later (resync every 5s)", time.Since(deleted).Round(100*time.Millisecond))
}

// TestDisabledControllerLeavesObjectsAlone: with the cilium controller
// disabled in one region's krane.hcl (reloaded, no restart), that region's
// policies are left exactly as they are, even when ctrl deletes them; the
// other region follows ctrl. Enabling it again converges.
func TestDisabledControllerLeavesObjectsAlone(t *testing.T) {
	st := sharedStack(t)
	s := ctrlStore(t, st)
	ctx := context.Background()
	ns := "ws-e2e-cilium"
	for _, c := range st.Clusters {
		if err := c.EnsureNamespace(ctx, ns); err != nil {
			t.Fatal(err)
		}
	}
	policy := []byte(`{"endpointSelector":{"matchLabels":{"app":"web"}},"ingress":[{"fromEndpoints":[{"matchLabels":{"app":"client"}}],"toPorts":[{"ports":[{"port":"8080","protocol":"TCP"}]}]}]}`)
	put := func(deleted bool) {
		t.Helper()
		_, err := s.WriteTx(ctx, func(ctx context.Context, tx *store.Tx) error {
			for _, region := range []string{"local-a", "local-b"} {
				p := store.CiliumNetworkPolicy{ID: "pol-" + region, Region: region, K8sNamespace: ns, K8sName: "allow-client", Policy: policy, Deleted: deleted}
				if err := tx.PutCiliumNetworkPolicy(ctx, p); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	exists := func(region string) (bool, error) {
		_, err := st.Clusters[region].Dynamic.Resource(cnpResource).Namespace(ns).Get(ctx, "allow-client", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return err == nil, err
	}
	put(false)
	waitFor(t, 30*time.Second, "the policy in both clusters", func() error {
		for _, r := range []string{"local-a", "local-b"} {
			if ok, err := exists(r); !ok {
				return fmt.Errorf("%s: missing (%v)", r, err)
			}
		}
		return nil
	})

	toggle := func(enabled bool) {
		t.Helper()
		err := st.EditKraneConfig("local-b", func(s string) string {
			return strings.Replace(s, fmt.Sprintf("controller \"cilium\" {\n  enabled = %v", !enabled), fmt.Sprintf("controller \"cilium\" {\n  enabled = %v", enabled), 1)
		})
		if err != nil {
			t.Fatal(err)
		}
		want := 0.0
		if enabled {
			want = 1
		}
		waitFor(t, 30*time.Second, fmt.Sprintf("cilium enabled=%v in local-b", enabled), func() error {
			if v := metric(t, st, "local-b", `krane_host_plugin_up{controller="cilium"}`); v != want && !(v == -1 && !enabled) {
				return fmt.Errorf("krane_host_plugin_up = %v", v)
			}
			return nil
		})
	}
	toggle(false)
	put(true)
	waitFor(t, 30*time.Second, "the policy gone from the enabled region", func() error {
		if ok, _ := exists("local-a"); ok {
			return fmt.Errorf("still in local-a")
		}
		return nil
	})
	time.Sleep(6 * time.Second) // a resync interval: nothing may act in local-b
	if ok, err := exists("local-b"); !ok {
		t.Fatalf("the disabled controller's policy in local-b was touched: %v", err)
	}
	toggle(true)
	waitFor(t, 30*time.Second, "re-enabled controller converges", func() error {
		if ok, _ := exists("local-b"); ok {
			return fmt.Errorf("still in local-b")
		}
		return nil
	})
}
