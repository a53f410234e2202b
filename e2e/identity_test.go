package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"krane.dev/internal/stack"
	"krane.dev/internal/testenv"
)

// The shared stack's kranes request plugin tokens of the shortest lifetime
// the API server grants and replace them every few seconds, so renewals
// happen during the suite's deploys (stack_test.go passes these).
var tokenRenewalEnv = []string{
	"KRANE_KUBERNETES__PLUGIN_IDENTITIES__TOKEN_TTL=10m",
	"KRANE_KUBERNETES__PLUGIN_IDENTITIES__REFRESH=3s",
}

// sumMetric adds up every series of name on a krane's /metrics whose
// labels contain each of labels (e.g. `kind="deployment"`).
func sumMetric(t *testing.T, st *stack.Stack, region, name string, labels ...string) float64 {
	t.Helper()
	resp, err := http.Get(st.KraneHTTP[region] + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for line := range strings.Lines(string(body)) {
		series, value, ok := strings.Cut(strings.TrimSpace(line), " ")
		if !ok || !strings.HasPrefix(series, name+"{") {
			continue
		}
		match := true
		for _, l := range labels {
			match = match && strings.Contains(series, l)
		}
		if v, err := strconv.ParseFloat(value, 64); err == nil && match {
			sum += v
		}
	}
	return sum
}

// TestPluginTokenRenewedWhileApplying: the deployment plugin's token is
// replaced while deploys are applied in the cluster, and no apply fails:
// the plugin moves to each new token without a refusal.
func TestPluginTokenRenewedWhileApplying(t *testing.T) {
	st := sharedStack(t)
	const region = "local-a"
	issued := func() float64 {
		return sumMetric(t, st, region, "krane_host_plugin_token_requests_total", `controller="deployment"`, `result="ok"`)
	}
	failed := func() float64 {
		return sumMetric(t, st, region, "krane_host_applies_total", `kind="deployment"`, `result="error"`) +
			sumMetric(t, st, region, "krane_host_applies_total", `kind="deployment"`, `result="permanent_error"`)
	}
	tokens, failures := issued(), failed()
	if tokens < 1 {
		t.Fatalf("the deployment plugin holds no token of its own (krane_host_plugin_token_requests_total = %v)", tokens)
	}
	// Deploy until at least two renewals happened meanwhile.
	for i := 0; issued() < tokens+2; i++ {
		if i == 20 {
			t.Fatalf("20 deploys and %v renewals (refresh 3s)", issued()-tokens)
		}
		deployJSON(t, st, fmt.Sprintf("e2e-renewal-%d", i), "registry.local/e2e/renewal:1", 1)
	}
	if n := failed() - failures; n != 0 {
		t.Errorf("%v deployment applies failed while the plugin's token was renewed %v times", n, issued()-tokens)
	}
	if n := sumMetric(t, st, region, "krane_host_plugin_token_requests_total", `controller="deployment"`, `result="error"`); n != 0 {
		t.Errorf("%v token requests for the deployment plugin failed", n)
	}
}

// snoopRBAC is the snoop plugin's identity: an account that may list
// ConfigMaps, and krane's right to request its tokens.
const snoopRBAC = `
apiVersion: v1
kind: ServiceAccount
metadata: {name: krane-plugin-snoop, namespace: krane}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: krane-plugin-snoop}
rules:
  - apiGroups: [""]
    resources: ["configmaps"]
    verbs: ["list"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: krane-plugin-snoop}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: krane-plugin-snoop}
subjects:
  - {kind: ServiceAccount, name: krane-plugin-snoop, namespace: krane}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: krane-token-snoop, namespace: krane}
rules:
  - apiGroups: [""]
    resources: ["serviceaccounts/token"]
    resourceNames: ["krane-plugin-snoop"]
    verbs: ["create"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: krane-token-snoop, namespace: krane}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: krane-token-snoop}
subjects:
  - {kind: ServiceAccount, name: krane, namespace: krane}
`

// TestPluginCannotReadAnotherPluginsObjects: a plugin that lists Secrets
// (what the deployment plugin writes) with the credentials the host gave
// it is refused by the API server as its own ServiceAccount, while the
// deployment plugin in the same krane keeps working. On a host that hands
// plugins its own credentials, the read succeeds and the test fails.
func TestPluginCannotReadAnotherPluginsObjects(t *testing.T) {
	st := sharedStack(t)
	const region = "local-a"
	ctx := context.Background()
	bin, err := testenv.BuildBinary("krane.dev/internal/testplugins/snoop", "krane-plugin-snoop")
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Clusters[region].ApplyYAML(ctx, []byte(snoopRBAC)); err != nil {
		t.Fatal(err)
	}
	hcl, err := st.KraneConfigPath(region)
	if err != nil {
		t.Fatal(err)
	}
	before, err := os.ReadFile(hcl)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.EditKraneConfig(region, func(string) string { return string(before) }) })
	block := fmt.Sprintf("\ncontroller \"snoop\" {\n  path = %q\n}\n", filepath.Clean(bin))
	if err := st.EditKraneConfig(region, func(s string) string { return s + block }); err != nil {
		t.Fatal(err)
	}
	want := `secrets is forbidden: User "system:serviceaccount:krane:krane-plugin-snoop" cannot list resource "secrets"`
	waitFor(t, 2*time.Minute, "the snoop plugin's read of Secrets refused", func() error {
		resp, err := http.Get(st.KraneHTTP[region] + "/readyz")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if !strings.Contains(string(body), want) {
			return fmt.Errorf("/readyz says:\n%s", body)
		}
		return nil
	})
	// The deployment plugin, in the same krane, still works.
	deployJSON(t, st, "e2e-snooped", "registry.local/e2e/snooped:1", 1)
}
