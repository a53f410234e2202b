package identity

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"krane.dev/host/config"
	"krane.dev/internal/testenv"
	"krane.dev/internal/testenv/kubeenv"
	"krane.dev/sdk"
	"krane.dev/sdk/kube"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// rbac: the host's ServiceAccount may create tokens for krane-plugin-a and
// krane-plugin-gone (which does not exist) only; krane-plugin-b exists.
const rbac = `
apiVersion: v1
kind: Namespace
metadata: {name: ident}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: krane-plugin-a, namespace: ident}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: krane-plugin-b, namespace: ident}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: mint, namespace: ident}
rules:
  - apiGroups: [""]
    resources: ["serviceaccounts/token"]
    resourceNames: ["krane-plugin-a", "krane-plugin-gone"]
    verbs: ["create"]
  - apiGroups: [""]
    resources: ["secrets"]
    verbs: ["create"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: mint, namespace: ident}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: mint}
subjects:
  - {kind: ServiceAccount, name: host, namespace: ident}
`

func setup(t *testing.T, refresh time.Duration) (*Minter, string) {
	t.Helper()
	c := kubeenv.Shared(t)
	ctx := t.Context()
	if err := c.ApplyYAML(ctx, []byte(rbac)); err != nil {
		t.Fatal(err)
	}
	hostCfg, _, err := c.ServiceAccountConfig(ctx, "ident", "host")
	if err != nil {
		t.Fatal(err)
	}
	m, err := newMinter(hostCfg, config.PluginIdentities{Enabled: true, Namespace: "ident", TokenTTL: config.MinTokenTTL, Refresh: refresh})
	if err != nil {
		t.Fatal(err)
	}
	return m, hostCfg.BearerToken
}

// noLeak fails the test if a goroutine it started outlives it (idle
// HTTP/2 connections of the clients aside).
func noLeak(t *testing.T) {
	opts := []goleak.Option{goleak.IgnoreCurrent(), goleak.IgnoreAnyFunction("golang.org/x/net/http2.(*clientConnReadLoop).run")}
	t.Cleanup(func() { goleak.VerifyNone(t, opts...) })
}

// whoAmI connects with the kubeconfig a plugin gets and asks the API
// server who it is.
func whoAmI(t *testing.T, path string) string {
	t.Helper()
	rc, err := kube.RESTConfig(sdkSource(path))
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	r, err := cs.AuthenticationV1().SelfSubjectReviews().Create(t.Context(), &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return r.Status.UserInfo.Username
}

func TestPluginRunsAsItsOwnAccount(t *testing.T) {
	m, hostToken := setup(t, 0)
	noLeak(t)
	metrics := NewMetrics(prometheus.NewRegistry())
	p := ForPlugin("a", "krane-plugin-a", func() (*Minter, error) { return m, nil }, hclog.NewNullLogger(), metrics)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); p.Run(ctx) }()

	src, err := p.Source(ctx, 7, 9)
	if err != nil {
		t.Fatal(err)
	}
	if src.InCluster || src.QPS != 7 || src.Burst != 9 {
		t.Errorf("source = %+v", src)
	}
	if got := whoAmI(t, src.Path); got != "system:serviceaccount:ident:krane-plugin-a" {
		t.Errorf("the plugin's kubeconfig authenticates as %q", got)
	}
	dir := filepath.Dir(src.Path)
	for path, want := range map[string]os.FileMode{dir: 0o700 | os.ModeDir, src.Path: 0o600, filepath.Join(dir, "token"): 0o600} {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != want {
			t.Errorf("%s has mode %s, want %s", path, fi.Mode(), want)
		}
		if fi.IsDir() {
			continue
		}
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(data, []byte(hostToken)) {
			t.Errorf("%s holds the host's own token", path)
		}
	}
	// A second instance of the plugin (a restart) gets the same files.
	again, err := p.Source(ctx, 7, 9)
	if err != nil || again != src {
		t.Errorf("second Source = %+v, %v; want %+v", again, err, src)
	}
	if n := testutil.ToFloat64(metrics.Renewals.WithLabelValues("a", "ok")); n != 1 {
		t.Errorf("%v tokens requested for two starts of one plugin, want 1", n)
	}
	cancel()
	<-done
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("the plugin's credentials outlive its controller: %v", err)
	}
	if _, err := p.Source(t.Context(), 0, 0); err == nil {
		t.Error("Source after the controller stopped issued a token")
	}
}

// TestTokenRenewedBeforeExpiry: with a refresh far shorter than the
// lifetime, the token file is replaced by a new token of the same account,
// while the old token (still valid) and the new both authenticate.
func TestTokenRenewedBeforeExpiry(t *testing.T) {
	m, _ := setup(t, 200*time.Millisecond)
	noLeak(t)
	metrics := NewMetrics(prometheus.NewRegistry())
	p := ForPlugin("a", "krane-plugin-a", func() (*Minter, error) { return m, nil }, hclog.NewNullLogger(), metrics)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan struct{})
	go func() { defer close(done); p.Run(ctx) }()
	src, err := p.Source(ctx, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	tokenPath := filepath.Join(filepath.Dir(src.Path), "token")
	first, err := os.ReadFile(tokenPath)
	if err != nil {
		t.Fatal(err)
	}
	// Wait for three renewals (each one's metric comes after its write).
	wait, stop := context.WithTimeout(ctx, time.Minute)
	defer stop()
	for testutil.ToFloat64(metrics.Renewals.WithLabelValues("a", "ok")) < 4 {
		select {
		case <-wait.Done():
			t.Fatalf("%v tokens after a minute with refresh 200ms", testutil.ToFloat64(metrics.Renewals.WithLabelValues("a", "ok")))
		case <-time.After(20 * time.Millisecond):
		}
	}
	now, err := os.ReadFile(tokenPath)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(first, now) {
		t.Fatal("the token file still holds the first token after renewals")
	}
	if got := whoAmI(t, src.Path); got != "system:serviceaccount:ident:krane-plugin-a" {
		t.Errorf("after renewals the kubeconfig authenticates as %q", got)
	}
	if exp := testutil.ToFloat64(metrics.Expiry.WithLabelValues("a")); time.Unix(int64(exp), 0).Before(time.Now().Add(5 * time.Minute)) {
		t.Errorf("expiry gauge %v is not about ten minutes ahead", exp)
	}
	cancel()
	<-done
}

func TestTokenRefusalsNameTheFix(t *testing.T) {
	m, _ := setup(t, 0)
	ctx := t.Context()
	for account, want := range map[string]string{
		"krane-plugin-b":    "may not request tokens for ServiceAccount ident/krane-plugin-b: apply the plugin's rbac.yaml",
		"krane-plugin-gone": "ServiceAccount ident/krane-plugin-gone does not exist: apply the plugin's rbac.yaml",
	} {
		_, _, err := m.Issue(ctx, account)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("token for %s: %v, want an error saying %q", account, err, want)
		}
	}
	src, remove, err := m.Issue(ctx, "krane-plugin-a")
	if err != nil {
		t.Fatal(err)
	}
	if got := whoAmI(t, src.Path); got != "system:serviceaccount:ident:krane-plugin-a" {
		t.Errorf("Issue's kubeconfig authenticates as %q", got)
	}
	remove()
	if _, err := os.Stat(src.Path); !os.IsNotExist(err) {
		t.Errorf("Issue's files outlive their removal: %v", err)
	}
}

func sdkSource(path string) sdk.KubeSource { return sdk.KubeSource{Path: path} }

// TestTokenDiesWithKranesPod: with pod_name and pod_uid set (the manifests
// set them from the downward API), a plugin's token is bound to a Secret
// krane's pod owns, so once the pod is gone (and the garbage collector
// took the Secret) the API server refuses the token although its lifetime
// has not ended. A token requested without the binding (the negative
// control) stays valid.
func TestTokenDiesWithKranesPod(t *testing.T) {
	c := kubeenv.Shared(t)
	ctx := t.Context()
	if err := c.ApplyYAML(ctx, []byte(rbac)); err != nil {
		t.Fatal(err)
	}
	pod, err := c.Client.CoreV1().Pods("ident").Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "krane-bound", Namespace: "ident"},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "krane", Image: "krane"}}, NodeName: "no-such-node"},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	hostCfg, _, err := c.ServiceAccountConfig(ctx, "ident", "host")
	if err != nil {
		t.Fatal(err)
	}
	pi := config.PluginIdentities{Enabled: true, Namespace: "ident", TokenTTL: config.MinTokenTTL}
	unbound, err := newMinter(hostCfg, pi)
	if err != nil {
		t.Fatal(err)
	}
	pi.PodName, pi.PodUID = pod.Name, string(pod.UID)
	boundMinter, err := newMinter(hostCfg, pi)
	if err != nil {
		t.Fatal(err)
	}
	bound, err := boundMinter.request(ctx, "krane-plugin-a")
	if err != nil {
		t.Fatal(err)
	}
	again, err := boundMinter.request(ctx, "krane-plugin-a") // the anchor is made once
	if err != nil {
		t.Fatal(err)
	}
	free, err := unbound.request(ctx, "krane-plugin-a")
	if err != nil {
		t.Fatal(err)
	}
	valid := func(tok string) bool {
		t.Helper()
		r, err := c.Client.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: tok}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return r.Status.Authenticated
	}
	if !valid(bound.value) || !valid(again.value) || !valid(free.value) {
		t.Fatal("fresh tokens refused")
	}
	if err := c.Client.CoreV1().Pods("ident").Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for valid(bound.value) || valid(again.value) {
		if time.Now().After(deadline) {
			t.Fatal("a token bound to krane's pod is still valid two minutes after the pod was deleted")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !valid(free.value) {
		t.Error("negative control: the unbound token was refused too, so the pod's deletion proves nothing")
	}
}
