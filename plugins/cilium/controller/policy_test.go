package controller_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"krane.dev/plugins/cilium/controller"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
	"krane.dev/sdk"
	"krane.dev/sdk/kube"
)

// fuzzConfig is the config the fuzz target and the corpus run under: the
// policy lives in team-a, may name sentinel as a peer, and is at most 4 KiB
// (so the oversize seed stays small).
var fuzzConfig = controller.Config{
	AllowedNamespaces:     []string{"team-a"},
	AllowedPeerNamespaces: []string{"sentinel"},
	MaxPolicyBytes:        4096,
}

const (
	fuzzNamespace = "team-a"
	fuzzName      = "web"
	fuzzID        = "pol-1"
	fuzzVersion   = 7
)

func buildFuzz(policy []byte) (*controller.Desired, error) {
	pb := &clusterv1.CiliumNetworkPolicy{Id: fuzzID, K8SNamespace: fuzzNamespace, K8SName: fuzzName, Policy: policy}
	return controller.Build(pb, fuzzID, fuzzVersion, fuzzConfig)
}

// FuzzPolicy feeds arbitrary bytes through the policy path (decode,
// validate, build). It must never panic; every refusal must be a permanent
// error with a message; every acceptance must be a well-formed Krane object
// that validates again to the same hash.
func FuzzPolicy(f *testing.F) {
	// testdata/fuzz/FuzzPolicy holds the hand-written seeds.
	f.Fuzz(func(t *testing.T, policy []byte) {
		d, err := buildFuzz(policy)
		if err != nil {
			checkRefusal(t, err)
			return
		}
		checkDesired(t, d)
	})
}

func checkRefusal(t *testing.T, err error) {
	t.Helper()
	var pe *sdk.PermanentError
	if !errors.As(err, &pe) {
		t.Fatalf("refused with a retryable error: %v", err)
	}
	if pe.Field == "" || strings.TrimSpace(pe.Err.Error()) == "" {
		t.Fatalf("refusal without field or message: %q", err)
	}
}

// checkDesired asserts what every accepted policy must look like.
func checkDesired(t *testing.T, d *controller.Desired) {
	t.Helper()
	u := d.Object
	if u.GetAPIVersion() != "cilium.io/v2" || u.GetKind() != "CiliumNetworkPolicy" {
		t.Fatalf("built %s %s", u.GetAPIVersion(), u.GetKind())
	}
	if u.GetNamespace() != fuzzNamespace || u.GetName() != fuzzName {
		t.Fatalf("built %s/%s, want %s/%s", u.GetNamespace(), u.GetName(), fuzzNamespace, fuzzName)
	}
	wantLabels := map[string]string{kube.ManagedByLabel: kube.ManagedBy, kube.ComponentLabel: controller.Component, controller.IDLabel: fuzzID}
	if !maps.Equal(u.GetLabels(), wantLabels) {
		t.Fatalf("labels %v, want exactly %v", u.GetLabels(), wantLabels)
	}
	wantAnn := kube.VersionAnnotations(fuzzVersion, d.SpecHash)
	if !maps.Equal(u.GetAnnotations(), wantAnn) {
		t.Fatalf("annotations %v, want exactly %v", u.GetAnnotations(), wantAnn)
	}
	meta, _, _ := unstructured.NestedMap(u.Object, "metadata")
	if keys := slices.Sorted(maps.Keys(meta)); !slices.Equal(keys, []string{"annotations", "labels", "name", "namespace"}) {
		t.Fatalf("metadata carries %v", keys)
	}
	for k := range u.Object {
		if !slices.Contains([]string{"apiVersion", "kind", "metadata", "spec", "specs"}, k) {
			t.Fatalf("object carries %q", k)
		}
	}
	// What Krane applies is itself a valid policy with the same hash.
	again, err := json.Marshal(u.Object)
	if err != nil {
		t.Fatal(err)
	}
	d2, err := buildFuzz(again)
	if err != nil {
		t.Fatalf("the built object does not validate again: %v\n%s", err, again)
	}
	if d2.SpecHash != d.SpecHash {
		t.Fatalf("hash changed on a second pass: %s then %s", d.SpecHash, d2.SpecHash)
	}
}

// corpus reads the committed seeds, keyed by file name.
func corpus(t *testing.T) map[string][]byte {
	t.Helper()
	dir := filepath.Join("testdata", "fuzz", "FuzzPolicy")
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	seeds := map[string][]byte{}
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		header, value, ok := strings.Cut(string(data), "\n")
		lit, ok2 := strings.CutPrefix(strings.TrimSpace(value), "[]byte(")
		if !ok || !ok2 || header != "go test fuzz v1" {
			t.Fatalf("%s: not a single-[]byte fuzz seed", e.Name())
		}
		s, err := strconv.Unquote(strings.TrimSuffix(lit, ")"))
		if err != nil {
			t.Fatalf("%s: %v", e.Name(), err)
		}
		seeds[e.Name()] = []byte(s)
	}
	return seeds
}

func TestCorpus(t *testing.T) {
	seeds := corpus(t)
	var bad int
	for name, policy := range seeds {
		d, err := buildFuzz(policy)
		switch {
		case strings.HasPrefix(name, "bad-"):
			bad++
			if err == nil {
				t.Errorf("%s: accepted:\n%s", name, policy)
				continue
			}
			checkRefusal(t, err)
			t.Logf("%s: %v", name, err)
		case strings.HasPrefix(name, "good-"):
			if err != nil {
				t.Errorf("%s: refused: %v", name, err)
				continue
			}
			checkDesired(t, d)
		default:
			t.Errorf("%s: seed names start with bad- or good-", name)
		}
	}
	if bad < 20 {
		t.Errorf("%d bad seeds, want at least 20", bad)
	}
}

func TestBuildKeepsTheRulesAndOverridesMetadata(t *testing.T) {
	policy := `{"apiVersion":"cilium.io/v2","kind":"CiliumNetworkPolicy",
	  "metadata":{"name":"evil","namespace":"kube-system","labels":{"app.kubernetes.io/managed-by":"helm","x":"y"},"annotations":{"krane.dev/version":"999"}},
	  "spec":{"endpointSelector":{"matchLabels":{"app":"web"}},
	    "ingress":[{"fromEndpoints":[{"matchLabels":{"k8s:io.kubernetes.pod.namespace":"sentinel"}}],
	                "toPorts":[{"ports":[{"port":"8080","protocol":"TCP"}]}]}]}}`
	d, err := buildFuzz([]byte(policy))
	if err != nil {
		t.Fatal(err)
	}
	checkDesired(t, d)
	// The rules are as ctrl wrote them: cilium's sanitised form (label
	// keys rewritten to "k8s.io...") must not leak into the object.
	spec, _, _ := unstructured.NestedMap(d.Object.Object, "spec")
	got, _ := json.Marshal(spec)
	want := `{"endpointSelector":{"matchLabels":{"app":"web"}},"ingress":[{"fromEndpoints":[{"matchLabels":{"k8s:io.kubernetes.pod.namespace":"sentinel"}}],"toPorts":[{"ports":[{"port":"8080","protocol":"TCP"}]}]}]}`
	if string(got) != want {
		t.Errorf("spec\n got %s\nwant %s", got, want)
	}

	// The spec-only form builds the same object.
	d2, err := buildFuzz([]byte(want))
	if err != nil {
		t.Fatal(err)
	}
	if d2.SpecHash != d.SpecHash {
		t.Errorf("spec-only form hashes to %s, full form to %s", d2.SpecHash, d.SpecHash)
	}

	// An empty endpointSelector (every pod of the namespace) survives.
	d3, err := buildFuzz([]byte(`{"endpointSelector":{},"ingress":[{}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if sel, found, _ := unstructured.NestedMap(d3.Object.Object, "spec", "endpointSelector"); !found || len(sel) != 0 {
		t.Errorf("empty endpointSelector lost: %v", d3.Object.Object["spec"])
	}
}

func TestBuildChecksTarget(t *testing.T) {
	policy := []byte(`{"endpointSelector":{},"ingress":[{}]}`)
	cases := []struct {
		name  string
		pb    *clusterv1.CiliumNetworkPolicy
		id    string
		field string
	}{
		{"namespace not allowed", &clusterv1.CiliumNetworkPolicy{K8SNamespace: "kube-system", K8SName: "x", Policy: policy}, "p", "k8s_namespace"},
		{"namespace not a name", &clusterv1.CiliumNetworkPolicy{K8SNamespace: "Team_A", K8SName: "x", Policy: policy}, "p", "k8s_namespace"},
		{"name not a name", &clusterv1.CiliumNetworkPolicy{K8SNamespace: "team-a", K8SName: "Web!", Policy: policy}, "p", "k8s_name"},
		{"empty name", &clusterv1.CiliumNetworkPolicy{K8SNamespace: "team-a", Policy: policy}, "p", "k8s_name"},
		{"id not a label value", &clusterv1.CiliumNetworkPolicy{K8SNamespace: "team-a", K8SName: "x", Policy: policy}, "p/1", "id"},
		{"id mismatch", &clusterv1.CiliumNetworkPolicy{Id: "q", K8SNamespace: "team-a", K8SName: "x", Policy: policy}, "p", "id"},
	}
	for _, c := range cases {
		_, err := controller.Build(c.pb, c.id, 1, fuzzConfig)
		var pe *sdk.PermanentError
		if !errors.As(err, &pe) || pe.Field != c.field {
			t.Errorf("%s: got %v, want a permanent error on %s", c.name, err, c.field)
		}
	}
	// The namespace error names the namespace, for the operator.
	_, err := controller.Build(cases[0].pb, "p", 1, fuzzConfig)
	if err == nil || !strings.Contains(err.Error(), `"kube-system"`) {
		t.Errorf("error does not name the namespace: %v", err)
	}
}

func TestScope(t *testing.T) {
	cfg := fuzzConfig
	cfg.AllowedPeerNamespaces = []string{"sentinel", "kube-system"}
	peer := func(sel string) string {
		return `{"endpointSelector":{},"ingress":[{"fromEndpoints":[` + sel + `]}]}`
	}
	cases := []struct {
		policy string
		field  string // "" = accepted
	}{
		{peer(`{}`), ""},
		{peer(`{"matchLabels":{"app":"x"}}`), ""},
		{peer(`{"matchLabels":{"k8s:io.kubernetes.pod.namespace":"team-a"}}`), ""},
		{peer(`{"matchLabels":{"io.kubernetes.pod.namespace":"kube-system","k8s-app":"kube-dns"}}`), ""},
		{peer(`{"matchExpressions":[{"key":"k8s:io.kubernetes.pod.namespace","operator":"In","values":["sentinel","kube-system"]}]}`), ""},
		// Narrowed to an allowed namespace by a second requirement.
		{peer(`{"matchLabels":{"k8s:io.kubernetes.pod.namespace":"sentinel","k8s:io.cilium.k8s.namespace.labels.team":"x"}}`), ""},
		{peer(`{"matchLabels":{"k8s:io.kubernetes.pod.namespace":"team-b"}}`), "policy.spec.ingress[0].fromEndpoints[0]"},
		{peer(`{"matchLabels":{"any:io.kubernetes.pod.namespace":"team-b"}}`), "policy.spec.ingress[0].fromEndpoints[0]"},
		{peer(`{"matchExpressions":[{"key":"k8s:io.kubernetes.pod.namespace","operator":"DoesNotExist"}]}`), "policy.spec.ingress[0].fromEndpoints[0]"},
		{peer(`{"matchExpressions":[{"key":"io.cilium.k8s.namespace.labels.kubernetes.io/metadata.name","operator":"In","values":["team-b"]}]}`), "policy.spec.ingress[0].fromEndpoints[0]"},
		{peer(`{"matchLabels":{"reserved:host":""}}`), ""},
		{peer(`{"matchLabels":{"reserved:init":""}}`), "policy.spec.ingress[0].fromEndpoints[0]"},
		{`{"endpointSelector":{},"egress":[{"toEndpoints":[{"matchLabels":{"k8s:io.kubernetes.pod.namespace":"team-b"}}]}]}`, "policy.spec.egress[0].toEndpoints[0]"},
		{`{"endpointSelector":{},"egress":[{"toEntities":["world","host","kube-apiserver"]}]}`, ""},
		{`{"endpointSelector":{},"egress":[{"toEntities":["world","unmanaged"]}]}`, "policy.spec.egress[0].toEntities[1]"},
		{`{"endpointSelector":{},"ingress":[{"fromEntities":["init"]}]}`, "policy.spec.ingress[0].fromEntities[0]"},
		{`{"endpointSelector":{},"egress":[{"toServices":[{"k8sService":{"serviceName":"dns","namespace":"kube-system"}}]}]}`, ""},
		{`{"endpointSelector":{},"egress":[{"toServices":[{"k8sService":{"serviceName":"db","namespace":"team-b"}}]}]}`, "policy.spec.egress[0].toServices[0].k8sService.namespace"},
		// The subject is always the own namespace.
		{`{"endpointSelector":{"matchLabels":{"k8s:io.kubernetes.pod.namespace":"team-a"}},"ingress":[{}]}`, ""},
		{`{"endpointSelector":{"matchLabels":{"k8s:io.kubernetes.pod.namespace":"sentinel"}},"ingress":[{}]}`, "policy.spec.endpointSelector"},
		{`{"endpointSelector":{"matchExpressions":[{"key":"k8s:io.kubernetes.pod.namespace","operator":"NotIn","values":["x"]}]},"ingress":[{}]}`, "policy.spec.endpointSelector"},
		// Deny rules and requirements only take traffic away: not restricted.
		{`{"endpointSelector":{},"ingress":[{}],"ingressDeny":[{"fromEndpoints":[{"matchLabels":{"k8s:io.kubernetes.pod.namespace":"team-b"}}]}]}`, ""},
		{`{"endpointSelector":{},"egressDeny":[{"toEntities":["cluster"]}]}`, ""},
		// specs are checked one by one.
		{`{"specs":[{"endpointSelector":{},"ingress":[{}]},{"endpointSelector":{},"ingress":[{"fromEntities":["all"]}]}]}`, "policy.specs[1].ingress[0].fromEntities[0]"},
	}
	for _, c := range cases {
		_, err := controller.Parse([]byte(c.policy), "team-a", "p", cfg)
		if c.field == "" {
			if err != nil {
				t.Errorf("%s: refused: %v", c.policy, err)
			}
			continue
		}
		var pe *sdk.PermanentError
		if !errors.As(err, &pe) || pe.Field != c.field {
			t.Errorf("%s:\n got %v\nwant a permanent error on %s", c.policy, err, c.field)
		}
	}
}

func TestParseConfig(t *testing.T) {
	cfg, err := controller.ParseConfig([]byte(`{}`))
	if err != nil || cfg.MaxPolicyBytes != controller.DefaultMaxPolicyBytes {
		t.Errorf("empty config: %+v, %v", cfg, err)
	}
	cfg, err = controller.ParseConfig([]byte(`{"allowed_namespaces":["a"],"allowed_namespace_prefixes":["ws-"],"allowed_peer_namespaces":["sentinel"],"max_policy_bytes":4096}`))
	if err != nil || cfg.MaxPolicyBytes != 4096 || !cfg.NamespaceAllowed("ws-1") || !cfg.NamespaceAllowed("a") || cfg.NamespaceAllowed("b") {
		t.Errorf("full config: %+v, %v", cfg, err)
	}
	for raw, key := range map[string]string{
		`{"allowed_namespace":["a"]}`:           "allowed_namespace",
		`{"allowed_namespaces":"a"}`:            "allowed_namespaces",
		`{"allowed_peer_namespaces":["Not_A"]}`: "allowed_peer_namespaces",
		`{"allowed_namespace_prefixes":[""]}`:   "allowed_namespace_prefixes",
		`{"max_policy_bytes":0}`:                "max_policy_bytes",
		`{"max_policy_bytes":4194304}`:          "max_policy_bytes",
	} {
		_, err := controller.ParseConfig([]byte(raw))
		var ce *sdk.ConfigError
		if !errors.As(err, &ce) || !strings.HasPrefix(ce.Key, key) {
			t.Errorf("%s: got %v, want a ConfigError on %s", raw, err, key)
		}
	}
}

func TestOversizeIsRefusedBeforeDecoding(t *testing.T) {
	// Far too large and not even JSON: the size alone decides.
	huge := bytes.Repeat([]byte("{"), fuzzConfig.MaxPolicyBytes+1)
	_, err := buildFuzz(huge)
	var pe *sdk.PermanentError
	if !errors.As(err, &pe) || !strings.Contains(err.Error(), "max_policy_bytes") {
		t.Errorf("got %v, want a permanent error naming max_policy_bytes", err)
	}
}
