package kube_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"krane.dev/sdk"
	"krane.dev/sdk/envtest"
	"krane.dev/sdk/kube"
)

// reviewGate holds every SelfSubjectAccessReview until a second one is in
// flight (or a long timeout passes, as it does when they come one at a
// time), and records the most that were in flight at once.
type reviewGate struct {
	mu      sync.Mutex
	now     int
	most    int
	overlap chan struct{}
}

func (g *reviewGate) wrap(cfg *rest.Config) {
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return roundTrip(func(req *http.Request) (*http.Response, error) {
			if !strings.HasSuffix(req.URL.Path, "/selfsubjectaccessreviews") {
				return rt.RoundTrip(req)
			}
			g.mu.Lock()
			g.now++
			if g.now > g.most {
				g.most = g.now
			}
			if g.now == 2 {
				close(g.overlap)
			}
			g.mu.Unlock()
			select {
			case <-g.overlap:
			case <-time.After(10 * time.Second):
			}
			defer func() { g.mu.Lock(); g.now--; g.mu.Unlock() }()
			return rt.RoundTrip(req)
		})
	}
}

type roundTrip func(*http.Request) (*http.Response, error)

func (f roundTrip) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

var checked = []sdk.Permission{
	{Resource: "configmaps", Verbs: []string{"list", "watch", "patch", "delete"}},
	{Group: "apps", Resource: "replicasets", Verbs: []string{"list", "watch", "patch"}},
	{Resource: "namespaces", Verbs: []string{"create"}},
}

// TestCheckPermissionsAsksConcurrently: the access reviews of a plugin's
// start-up are in flight together, not one after another.
func TestCheckPermissionsAsksConcurrently(t *testing.T) {
	cluster := envtest.Shared(t)
	cfg := rest.CopyConfig(cluster.Config)
	g := &reviewGate{overlap: make(chan struct{})}
	g.wrap(cfg)
	client, err := kube.NewClients(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := kube.CheckPermissions(context.Background(), client, checked); err != nil {
		t.Fatalf("the admin may do everything: %v", err)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.most < 2 {
		t.Fatalf("at most %d access review in flight at once: they are asked one after another", g.most)
	}
}

// TestCheckPermissionsNamesWhatIsMissing: asked concurrently, the reviews
// still name every missing verb, in the order the plugin declared them,
// and who lacks them.
func TestCheckPermissionsNamesWhatIsMissing(t *testing.T) {
	cluster := envtest.Shared(t)
	cfg, _, err := cluster.ServiceAccountConfig(context.Background(), "kube-perms", "no-rights")
	if err != nil {
		t.Fatal(err)
	}
	client, err := kube.NewClients(cfg)
	if err != nil {
		t.Fatal(err)
	}
	err = kube.CheckPermissions(context.Background(), client, checked)
	var missing *kube.MissingPermissionsError
	if !errors.As(err, &missing) {
		t.Fatalf("CheckPermissions without any grant = %v, want a MissingPermissionsError", err)
	}
	var got []string
	for _, m := range missing.Missing {
		got = append(got, m.Verb+" "+m.Resource)
	}
	want := "list configmaps, watch configmaps, patch configmaps, delete configmaps, list replicasets, watch replicasets, patch replicasets, create namespaces"
	if strings.Join(got, ", ") != want {
		t.Errorf("missing = %s, want %s", strings.Join(got, ", "), want)
	}
	if missing.User != "system:serviceaccount:kube-perms:no-rights" {
		t.Errorf("user = %q", missing.User)
	}
}
