package controller_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"krane.dev/internal/testenv"
	"krane.dev/internal/testenv/kubeenv"
	"krane.dev/plugins/cilium/controller"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
	"krane.dev/sdk"
	"krane.dev/sdk/kube"
	"krane.dev/sdk/plugintest"
	"krane.dev/shared/kinds"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// testConfig allows team-a, team-b and every ws-* namespace, with sentinel
// as a peer.
const testConfig = `{"allowed_namespaces":["team-a","team-b"],"allowed_namespace_prefixes":["ws-"],"allowed_peer_namespaces":["sentinel"]}`

const (
	pluginNamespace = "krane"
	pluginAccount   = "krane-plugin-cilium"
)

// pluginKubeconfig installs rbac.yaml in c and returns a kubeconfig that
// authenticates as the plugin's ServiceAccount: every test drives the
// plugin through it, so RBAC is exercised by everything the plugin does.
func pluginKubeconfig(t *testing.T, c *kubeenv.Cluster) string {
	t.Helper()
	ctx := context.Background()
	for _, ns := range []string{pluginNamespace, "team-a", "team-b", "sentinel"} {
		if err := c.EnsureNamespace(ctx, ns); err != nil {
			t.Fatal(err)
		}
	}
	manifest, err := os.ReadFile(filepath.Join("..", "rbac.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.ApplyYAML(ctx, manifest); err != nil {
		t.Fatalf("apply rbac.yaml: %v", err)
	}
	_, path, err := c.ServiceAccountConfig(ctx, pluginNamespace, pluginAccount)
	if err != nil {
		t.Fatal(err)
	}
	return path
}

// start serves a new controller in-process and returns it (for its call
// counter) and the host-side client that reaches it over gRPC.
func start(t *testing.T, kubeconfig, config string) (*controller.Controller, sdk.Plugin) {
	t.Helper()
	impl := controller.New(hclog.New(&hclog.LoggerOptions{Name: "cilium", Level: hclog.Warn}))
	ctl := plugintest.New(t, impl)
	_, err := ctl.Configure(context.Background(), &sdk.ConfigureRequest{
		Region: "local-a", ClusterID: "c1",
		Kube:   sdk.KubeSource{Path: kubeconfig},
		Config: json.RawMessage(config),
	})
	if err != nil {
		t.Fatalf("Configure: %v", err)
	}
	return impl, ctl
}

func change(t *testing.T, id string, version uint64, ns, name, policy string) sdk.Change {
	t.Helper()
	s, err := sdk.SpecOf(&clusterv1.CiliumNetworkPolicy{Id: id, K8SNamespace: ns, K8SName: name, Policy: []byte(policy)})
	if err != nil {
		t.Fatal(err)
	}
	return sdk.Change{Kind: kinds.CiliumNetworkPolicy, ID: id, Version: version, Spec: s}
}

func deletion(id string, version uint64) sdk.Change {
	return sdk.Change{Kind: kinds.CiliumNetworkPolicy, ID: id, Version: version, Deleted: true}
}

// webPolicy lets sentinel pods reach app=<app> on port, as a spec only.
func webPolicy(app, port string) string {
	return fmt.Sprintf(`{"endpointSelector":{"matchLabels":{"app":%q}},
	  "ingress":[{"fromEndpoints":[{"matchLabels":{"k8s:io.kubernetes.pod.namespace":"sentinel","app":"sentinel"}}],
	              "toPorts":[{"ports":[{"port":%q,"protocol":"TCP"}]}]}]}`, app, port)
}

func cnps(c *kubeenv.Cluster, ns string) dynamic.ResourceInterface {
	return c.Dynamic.Resource(controller.GVR).Namespace(ns)
}

func get(t *testing.T, c *kubeenv.Cluster, ns, name string) *unstructured.Unstructured {
	t.Helper()
	u, err := cnps(c, ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get CiliumNetworkPolicy %s/%s: %v", ns, name, err)
	}
	return u
}

func str(t *testing.T, u *unstructured.Unstructured, path ...any) string {
	t.Helper()
	var cur any = u.Object
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, _ := cur.(map[string]any)
			cur = m[k]
		case int:
			l, _ := cur.([]any)
			if k >= len(l) {
				t.Fatalf("%v: index %d out of %d", path, k, len(l))
			}
			cur = l[k]
		}
	}
	s, _ := cur.(string)
	return s
}

// eventually retries f until it succeeds or 10 s pass.
func eventually(t *testing.T, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestConformance(t *testing.T) {
	cluster := kubeenv.Shared(t)
	kc := pluginKubeconfig(t, cluster)
	ctl := plugintest.New(t, controller.New(hclog.NewNullLogger()))
	plugintest.Conformance(t, ctl, plugintest.Suite{
		Configure: sdk.ConfigureRequest{Region: "local-a", ClusterID: "c1", Kube: sdk.KubeSource{Path: kc}, Config: []byte(testConfig)},
		BadConfigs: []plugintest.BadConfig{
			{Config: `{"allowed_namespace":["x"]}`, Key: "allowed_namespace"},
			{Config: `{"allowed_namespaces":"team-a"}`, Key: "allowed_namespaces"},
			{Config: `{"allowed_peer_namespaces":["Bad_Name"]}`, Key: "allowed_peer_namespaces"},
			{Config: `{"max_policy_bytes":0}`, Key: "max_policy_bytes"},
		},
		Objects: []sdk.Change{
			change(t, "conf-1", 10, "team-a", "conf-web", webPolicy("web", "8080")),
			change(t, "conf-2", 11, "team-b", "conf-deny-all", `{"apiVersion":"cilium.io/v2","kind":"CiliumNetworkPolicy","metadata":{"name":"x"},"spec":{"endpointSelector":{},"ingress":[{}],"egress":[{}]}}`),
		},
		Invalid: []plugintest.InvalidChange{
			{Change: change(t, "conf-bad-ns", 12, "kube-system", "x", webPolicy("web", "80")), Field: "k8s_namespace"},
			{Change: change(t, "conf-bad-name", 13, "team-a", "Not_A_Name", webPolicy("web", "80")), Field: "k8s_name"},
			{Change: change(t, "conf-bad-json", 14, "team-a", "x", `{"endpointSelector":`), Field: "policy"},
			{Change: change(t, "conf-cross-ns", 15, "team-a", "x", `{"endpointSelector":{},"ingress":[{"fromEndpoints":[{"matchLabels":{"k8s:io.kubernetes.pod.namespace":"team-b"}}]}]}`), Field: "policy.spec.ingress[0].fromEndpoints[0]"},
			{Change: sdk.Change{Kind: kinds.CiliumNetworkPolicy, ID: "conf-not-proto", Version: 16, Spec: sdk.Spec{TypeURL: "type.googleapis.com/krane.cluster.v1.CiliumNetworkPolicy", Value: []byte{0xff, 0x01}}}},
		},
	})
	left, err := cluster.Dynamic.Resource(controller.GVR).List(context.Background(), metav1.ListOptions{LabelSelector: kube.ManagedSelector(controller.Component)})
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range left.Items {
		if strings.HasPrefix(u.GetName(), "conf-") {
			t.Errorf("policy %s/%s left after the suite", u.GetNamespace(), u.GetName())
		}
	}
}

func TestApplyUpdateRenameDelete(t *testing.T) {
	cluster := kubeenv.Shared(t)
	impl, ctl := start(t, pluginKubeconfig(t, cluster), testConfig)
	ctx := context.Background()
	const id = "pol-lifecycle"

	// Apply: the full object form, with a name, namespace and labels that
	// Krane overrides.
	v1 := `{"apiVersion":"cilium.io/v2","kind":"CiliumNetworkPolicy",
	  "metadata":{"name":"whatever","namespace":"kube-system","labels":{"app.kubernetes.io/managed-by":"helm"}},
	  "spec":` + webPolicy("web", "8080") + `}`
	if r, err := plugintest.Apply(ctx, ctl, change(t, id, 1, "team-a", "lifecycle", v1)); err != nil || r != sdk.Applied {
		t.Fatalf("Apply v1 = %s, %v", r, err)
	}
	u := get(t, cluster, "team-a", "lifecycle")
	if got := str(t, u, "spec", "endpointSelector", "matchLabels", "app"); got != "web" {
		t.Errorf("endpointSelector app = %q", got)
	}
	if got := str(t, u, "spec", "ingress", 0, "fromEndpoints", 0, "matchLabels", "k8s:io.kubernetes.pod.namespace"); got != "sentinel" {
		t.Errorf("fromEndpoints namespace = %q", got)
	}
	if port, proto := str(t, u, "spec", "ingress", 0, "toPorts", 0, "ports", 0, "port"), str(t, u, "spec", "ingress", 0, "toPorts", 0, "ports", 0, "protocol"); port != "8080" || proto != "TCP" {
		t.Errorf("toPorts = %s/%s", port, proto)
	}
	l := u.GetLabels()
	if l[kube.ManagedByLabel] != "krane" || l[kube.ComponentLabel] != "ciliumnetworkpolicy" || l[controller.IDLabel] != id {
		t.Errorf("labels = %v", l)
	}
	if kube.AppliedVersion(u.GetAnnotations()) != 1 || u.GetAnnotations()[kube.SpecHashAnnotation] == "" {
		t.Errorf("annotations = %v", u.GetAnnotations())
	}
	if _, err := cnps(cluster, "kube-system").Get(ctx, "whatever", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the JSON's own name/namespace was used: %v", err)
	}

	// Re-apply: unchanged, without a single write.
	writes := impl.Calls().Writes()
	eventually(t, "re-apply is unchanged", func() error {
		r, err := plugintest.Apply(ctx, ctl, change(t, id, 1, "team-a", "lifecycle", v1))
		if err != nil || r != sdk.Unchanged {
			return fmt.Errorf("Apply = %s, %v", r, err)
		}
		return nil
	})
	if w := impl.Calls().Writes() - writes; w != 0 {
		t.Errorf("unchanged apply made %d writes", w)
	}

	// A label added by someone else is not drift; a hand edit of the
	// rules is, and the next apply takes the field back.
	patch := `{"metadata":{"labels":{"owner":"ops"}},"spec":{"ingress":[{"toPorts":[{"ports":[{"port":"22","protocol":"TCP"}]}]}]}}`
	if _, err := cnps(cluster, "team-a").Patch(ctx, "lifecycle", types.MergePatchType, []byte(patch), metav1.PatchOptions{FieldManager: "hand-edit"}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "hand edit is corrected", func() error {
		r, err := plugintest.Apply(ctx, ctl, change(t, id, 1, "team-a", "lifecycle", v1))
		if err != nil || r != sdk.Applied {
			return fmt.Errorf("Apply after hand edit = %s, %v", r, err)
		}
		return nil
	})
	u = get(t, cluster, "team-a", "lifecycle")
	if port := str(t, u, "spec", "ingress", 0, "toPorts", 0, "ports", 0, "port"); port != "8080" {
		t.Errorf("port after correction = %q", port)
	}
	if got := str(t, u, "spec", "ingress", 0, "fromEndpoints", 0, "matchLabels", "app"); got != "sentinel" {
		t.Errorf("fromEndpoints after correction = %q", got)
	}
	if u.GetLabels()["owner"] != "ops" {
		t.Errorf("someone else's label was removed: %v", u.GetLabels())
	}

	// Update: new port and a new egress rule.
	v2 := `{"endpointSelector":{"matchLabels":{"app":"web"}},
	  "ingress":[{"fromEndpoints":[{"matchLabels":{"k8s:io.kubernetes.pod.namespace":"sentinel"}}],"toPorts":[{"ports":[{"port":"9090","protocol":"TCP"}]}]}],
	  "egress":[{"toEntities":["world"],"toPorts":[{"ports":[{"port":"443","protocol":"TCP"}]}]}]}`
	if r, err := plugintest.Apply(ctx, ctl, change(t, id, 2, "team-a", "lifecycle", v2)); err != nil || r != sdk.Applied {
		t.Fatalf("Apply v2 = %s, %v", r, err)
	}
	u = get(t, cluster, "team-a", "lifecycle")
	if port := str(t, u, "spec", "ingress", 0, "toPorts", 0, "ports", 0, "port"); port != "9090" {
		t.Errorf("port after update = %q", port)
	}
	if e := str(t, u, "spec", "egress", 0, "toEntities", 0); e != "world" {
		t.Errorf("egress after update = %q", e)
	}
	if _, found, _ := unstructured.NestedFieldNoCopy(u.Object, "spec", "ingress"); !found {
		t.Error("ingress lost")
	}
	if kube.AppliedVersion(u.GetAnnotations()) != 2 {
		t.Errorf("version annotation = %v", u.GetAnnotations())
	}
	want, err := controller.Build(&clusterv1.CiliumNetworkPolicy{K8SNamespace: "team-a", K8SName: "lifecycle", Policy: []byte(v2)}, id, 2, controller.Config{AllowedNamespaces: []string{"team-a"}, AllowedPeerNamespaces: []string{"sentinel"}})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "inventory shows v2", func() error {
		items, err := plugintest.Inventory(ctx, ctl, kinds.CiliumNetworkPolicy)
		if err != nil {
			return err
		}
		for _, it := range items {
			if it.ID == id && it.Version == 2 && it.SpecHash == want.SpecHash {
				return nil
			}
		}
		return fmt.Errorf("inventory %v", items)
	})

	// A move that fails (the namespace is not there yet) keeps the old
	// object enforcing.
	if _, err := plugintest.Apply(ctx, ctl, change(t, id, 3, "ws-nowhere", "lifecycle", v2)); err == nil || sdk.IsPermanent(err) {
		t.Fatalf("move into a missing namespace = %v, want a retryable error", err)
	}
	get(t, cluster, "team-a", "lifecycle")

	// Rename (and move): the new one comes, then the old one goes.
	if r, err := plugintest.Apply(ctx, ctl, change(t, id, 3, "team-b", "lifecycle-renamed", v2)); err != nil || r != sdk.Applied {
		t.Fatalf("Apply renamed = %s, %v", r, err)
	}
	get(t, cluster, "team-b", "lifecycle-renamed")
	if _, err := cnps(cluster, "team-a").Get(ctx, "lifecycle", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("old object after rename: %v", err)
	}

	// Delete, twice.
	for i := range 2 {
		if r, err := plugintest.Apply(ctx, ctl, deletion(id, 4)); err != nil || r != sdk.Deleted {
			t.Fatalf("delete #%d = %s, %v", i+1, r, err)
		}
	}
	if _, err := cnps(cluster, "team-b").Get(ctx, "lifecycle-renamed", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("object after delete: %v", err)
	}
}

func TestDeleteRightAfterApply(t *testing.T) {
	cluster := kubeenv.Shared(t)
	_, ctl := start(t, pluginKubeconfig(t, cluster), testConfig)
	ctx := context.Background()
	// No pause between the two: the delete must not depend on the
	// informer having seen the new object.
	for i := range 5 {
		id := fmt.Sprintf("pol-quick-%d", i)
		if _, err := plugintest.Apply(ctx, ctl, change(t, id, 1, "team-a", id, webPolicy("quick", "80"))); err != nil {
			t.Fatal(err)
		}
		if r, err := plugintest.Apply(ctx, ctl, deletion(id, 2)); err != nil || r != sdk.Deleted {
			t.Fatalf("delete = %s, %v", r, err)
		}
		if _, err := cnps(cluster, "team-a").Get(ctx, id, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("%s still there after delete: %v", id, err)
		}
	}
}

func TestResyncOfUnchangedPoliciesWritesNothing(t *testing.T) {
	cluster := kubeenv.Shared(t)
	impl, ctl := start(t, pluginKubeconfig(t, cluster), testConfig)
	ctx := context.Background()
	const n = 100
	var changes []sdk.Change
	for i := range n {
		id := fmt.Sprintf("pol-resync-%03d", i)
		changes = append(changes, change(t, id, 1, "team-a", id, webPolicy(fmt.Sprintf("app-%d", i), "8080")))
	}
	begin := time.Now()
	for _, ch := range changes {
		if r, err := plugintest.Apply(ctx, ctl, ch); err != nil || r != sdk.Applied {
			t.Fatalf("Apply %s = %s, %v", ch.ID, r, err)
		}
	}
	t.Logf("%d policies applied in %s", n, time.Since(begin).Round(time.Millisecond))
	// Wait until the informer holds all of them.
	eventually(t, "inventory lists all", func() error {
		items, err := plugintest.Inventory(ctx, ctl, kinds.CiliumNetworkPolicy)
		if err != nil {
			return err
		}
		seen := 0
		for _, it := range items {
			if strings.HasPrefix(it.ID, "pol-resync-") {
				seen++
			}
		}
		if seen != n {
			return fmt.Errorf("%d of %d listed", seen, n)
		}
		return nil
	})
	reads, writes := impl.Calls().Reads(), impl.Calls().Writes()
	begin = time.Now()
	for _, ch := range changes {
		if r, err := plugintest.Apply(ctx, ctl, ch); err != nil || r != sdk.Unchanged {
			t.Fatalf("resync Apply %s = %s, %v", ch.ID, r, err)
		}
	}
	took := time.Since(begin)
	dr, dw := impl.Calls().Reads()-reads, impl.Calls().Writes()-writes
	t.Logf("resync of %d unchanged policies: %s, %d reads, %d writes", n, took.Round(time.Millisecond), dr, dw)
	if dw != 0 || dr != 0 {
		t.Errorf("resync of unchanged policies made %d reads and %d writes, want none", dr, dw)
	}
	for _, ch := range changes {
		if _, err := plugintest.Apply(ctx, ctl, deletion(ch.ID, 2)); err != nil {
			t.Fatal(err)
		}
	}
}

// TestCorpusRejectedBeforeAnyAPICall feeds every hand-written bad policy
// through Apply over gRPC and checks that each is refused permanently
// without a single API call, reads included.
func TestCorpusRejectedBeforeAnyAPICall(t *testing.T) {
	cluster := kubeenv.Shared(t)
	// The same limits as the fuzz target, so the oversize seed is over.
	cfg := `{"allowed_namespaces":["team-a"],"allowed_peer_namespaces":["sentinel"],"max_policy_bytes":4096}`
	impl, ctl := start(t, pluginKubeconfig(t, cluster), cfg)
	ctx := context.Background()
	// Configure's calls (the RBAC check) are not the corpus's.
	reads, writes := impl.Calls().Reads(), impl.Calls().Writes()
	n := 0
	for name, policy := range corpus(t) {
		if !strings.HasPrefix(name, "bad-") {
			continue
		}
		n++
		_, err := plugintest.Apply(ctx, ctl, change(t, "corpus-"+fmt.Sprint(n), 1, fuzzNamespace, fuzzName, string(policy)))
		var pe *sdk.PermanentError
		if !errors.As(err, &pe) || pe.Error() == "" {
			t.Errorf("%s: Apply = %v, want a permanent error with a message", name, err)
		}
	}
	if r, w := impl.Calls().Reads()-reads, impl.Calls().Writes()-writes; r != 0 || w != 0 {
		t.Errorf("%d bad policies cost %d reads and %d writes, want none", n, r, w)
	}
	if n < 20 {
		t.Errorf("only %d bad seeds", n)
	}
	t.Logf("%d bad policies refused with 0 API calls", n)
}

func TestMissingNamespaceIsRetryable(t *testing.T) {
	cluster := kubeenv.Shared(t)
	_, ctl := start(t, pluginKubeconfig(t, cluster), testConfig)
	ctx := context.Background()
	ch := change(t, "pol-ws", 1, "ws-not-yet", "web", webPolicy("web", "80"))
	_, err := plugintest.Apply(ctx, ctl, ch)
	if err == nil || sdk.IsPermanent(err) || !strings.Contains(err.Error(), `namespace "ws-not-yet" does not exist`) {
		t.Fatalf("Apply into a missing namespace = %v, want a retryable error naming it", err)
	}
	// Once the namespace exists, the retry succeeds.
	if err := cluster.EnsureNamespace(ctx, "ws-not-yet"); err != nil {
		t.Fatal(err)
	}
	if r, err := plugintest.Apply(ctx, ctl, ch); err != nil || r != sdk.Applied {
		t.Fatalf("retry = %s, %v", r, err)
	}
	if _, err := plugintest.Apply(ctx, ctl, deletion("pol-ws", 2)); err != nil {
		t.Fatal(err)
	}
}

func TestForeignPoliciesAreNotTouched(t *testing.T) {
	cluster := kubeenv.Shared(t)
	_, ctl := start(t, pluginKubeconfig(t, cluster), testConfig)
	ctx := context.Background()
	// One written by hand, one by another Krane plugin (the sentinel's
	// gossip policy carries component=sentinel and no policy id).
	foreign := map[string]map[string]string{
		"by-hand":        {"app": "x"},
		"sentinel-owned": {kube.ManagedByLabel: kube.ManagedBy, kube.ComponentLabel: "sentinel"},
	}
	for name, labels := range foreign {
		u := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "cilium.io/v2", "kind": "CiliumNetworkPolicy",
			"metadata": map[string]any{"name": name, "namespace": "team-a"},
			"spec":     map[string]any{"endpointSelector": map[string]any{}, "ingress": []any{map[string]any{}}},
		}}
		u.SetLabels(labels)
		if _, err := cnps(cluster, "team-a").Create(ctx, u, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	if _, err := plugintest.Apply(ctx, ctl, change(t, "pol-mine", 1, "team-a", "mine", webPolicy("web", "80"))); err != nil {
		t.Fatal(err)
	}
	eventually(t, "inventory lists only Krane's", func() error {
		items, err := plugintest.Inventory(ctx, ctl, kinds.CiliumNetworkPolicy)
		if err != nil {
			return err
		}
		mine := false
		for _, it := range items {
			if it.ID == "" {
				return fmt.Errorf("inventory lists a policy without id: %v", items)
			}
			mine = mine || it.ID == "pol-mine"
		}
		if !mine {
			return fmt.Errorf("pol-mine not listed: %v", items)
		}
		return nil
	})
	if _, err := plugintest.Apply(ctx, ctl, deletion("pol-mine", 2)); err != nil {
		t.Fatal(err)
	}
	for name := range foreign {
		get(t, cluster, "team-a", name) // still there
	}
}

func TestRBACIsLeastPrivilege(t *testing.T) {
	cluster := kubeenv.Shared(t)
	ctx := context.Background()
	pluginKubeconfig(t, cluster)
	cfg, _, err := cluster.ServiceAccountConfig(ctx, pluginNamespace, pluginAccount)
	if err != nil {
		t.Fatal(err)
	}
	kc := kubernetes.NewForConfigOrDie(cfg)
	dyn := dynamic.NewForConfigOrDie(cfg)
	if _, err := dyn.Resource(controller.GVR).List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("list CiliumNetworkPolicies: %v", err)
	}
	if _, err := kc.Discovery().ServerResourcesForGroupVersion("cilium.io/v2"); err != nil {
		t.Errorf("discovery: %v", err)
	}
	forbidden := map[string]error{}
	_, forbidden["list secrets"] = kc.CoreV1().Secrets("team-a").List(ctx, metav1.ListOptions{})
	_, forbidden["create configmap"] = kc.CoreV1().ConfigMaps("team-a").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "x"}}, metav1.CreateOptions{})
	_, forbidden["create namespace"] = kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "x"}}, metav1.CreateOptions{})
	_, forbidden["list pods"] = kc.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	_, forbidden["update a policy"] = dyn.Resource(controller.GVR).Namespace("team-a").Update(ctx, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "cilium.io/v2", "kind": "CiliumNetworkPolicy", "metadata": map[string]any{"name": "x", "namespace": "team-a"},
	}}, metav1.UpdateOptions{})
	for what, err := range forbidden {
		if !apierrors.IsForbidden(err) {
			t.Errorf("%s: got %v, want Forbidden", what, err)
		}
	}
}

// TestReconfigureAppliesTheNewRules: a policy accepted under one config is
// judged again under the next (nothing validated earlier is reused).
func TestReconfigureAppliesTheNewRules(t *testing.T) {
	cluster := kubeenv.Shared(t)
	kc := pluginKubeconfig(t, cluster)
	_, ctl := start(t, kc, testConfig)
	ctx := context.Background()
	ch := change(t, "pol-reconf", 1, "team-b", "reconf", webPolicy("web", "80"))
	if r, err := plugintest.Apply(ctx, ctl, ch); err != nil || r != sdk.Applied {
		t.Fatalf("Apply = %s, %v", r, err)
	}
	narrower := `{"allowed_namespaces":["team-a","team-b"]}` // sentinel no longer a peer
	if _, err := ctl.Configure(ctx, &sdk.ConfigureRequest{Kube: sdk.KubeSource{Path: kc}, Config: json.RawMessage(narrower)}); err != nil {
		t.Fatal(err)
	}
	_, err := plugintest.Apply(ctx, ctl, ch)
	var pe *sdk.PermanentError
	if !errors.As(err, &pe) || !strings.Contains(pe.Field, "fromEndpoints") || !strings.Contains(err.Error(), `"sentinel"`) {
		t.Fatalf("Apply after the peer was removed = %v, want a permanent error on the sentinel peer", err)
	}
	if _, err := ctl.Configure(ctx, &sdk.ConfigureRequest{Kube: sdk.KubeSource{Path: kc}, Config: json.RawMessage(testConfig)}); err != nil {
		t.Fatal(err)
	}
	if _, err := plugintest.Apply(ctx, ctl, deletion("pol-reconf", 2)); err != nil {
		t.Fatal(err)
	}
}
