package watch

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"krane.dev/internal/testenv"
	"krane.dev/internal/testenv/kubeenv"
	"krane.dev/sentinel/proxy"
	"krane.dev/sentinel/routes"
)

func TestMain(m *testing.M) { testenv.Main(m) }

const (
	routesNS = "sentinel"
	appNS    = "app"
	host     = "app.example.com"
)

// backendServer is an instance: a real HTTP server on this machine's first
// non-loopback IPv4 address (the API refuses loopback endpoints), which the
// EndpointSlices list as an IPv4 endpoint with a per-slice port.
type backendServer struct {
	*httptest.Server
	hits atomic.Int64
	port int32
}

func startBackend(t *testing.T, name string, slow <-chan struct{}) *backendServer {
	b := &backendServer{}
	b.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b.hits.Add(1)
		if r.URL.Path == "/slow" && slow != nil {
			<-slow
		}
		_, _ = io.WriteString(w, name)
	}))
	l, err := net.Listen("tcp", net.JoinHostPort(localIP(t), "0"))
	if err != nil {
		t.Fatal(err)
	}
	b.Listener.Close()
	b.Listener = l
	b.Start()
	t.Cleanup(b.Close)
	_, p, _ := net.SplitHostPort(b.Listener.Addr().String())
	n, _ := strconv.Atoi(p)
	b.port = int32(n)
	return b
}

func slice(ip, name, service string, port int32, ready bool) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name, Namespace: appNS, Labels: map[string]string{discoveryv1.LabelServiceName: service}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Port: ptr(port)}},
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: ptr(ready)}}},
	}
}

func routesCM(t *testing.T, name string, r routes.Routes) *corev1.ConfigMap {
	b, err := r.Encode()
	if err != nil {
		t.Fatal(err)
	}
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: routesNS}, Data: map[string]string{routes.Key: string(b)}}
}

func ensureNS(t *testing.T, ctx context.Context, c kubernetes.Interface, names ...string) {
	for _, n := range names {
		_, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{})
		if err != nil && !strings.Contains(err.Error(), "already exists") {
			t.Fatal(err)
		}
	}
}

func get(t *testing.T, c *http.Client, url, path string) (int, string) {
	req, _ := http.NewRequest("GET", url+path, nil)
	req.Host = host
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// waitFor polls cond every 10ms for at most d and returns how long it took.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > d {
			t.Fatalf("%s: not within %v", what, d)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return time.Since(start)
}

// TestFollowsRoutesAndEndpointSlices runs a router fed by a real API
// server: it becomes ready only with routes and synced instances, routes to
// the live deployment, switches on a promote within a second while a
// request in flight on the old deployment finishes, drops an instance that
// turns unready, and keeps the last good routes when the ConfigMap breaks.
func TestFollowsRoutesAndEndpointSlices(t *testing.T) {
	kube := kubeenv.Shared(t)
	c := kube.Client
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ensureNS(t, ctx, c, routesNS, appNS)

	ip := localIP(t)
	release := make(chan struct{})
	old := startBackend(t, "old", release)
	newA := startBackend(t, "new-a", nil)
	newB := startBackend(t, "new-b", nil)
	dead := deadPort(t)
	for _, s := range []*discoveryv1.EndpointSlice{
		slice(ip, "dep-old-1", "dep-old", old.port, true),
		slice(ip, "dep-old-2", "dep-old", dead, false), // unready: never dialed
		slice(ip, "dep-new-1", "dep-new", newA.port, true),
		slice(ip, "dep-new-2", "dep-new", newB.port, true),
	} {
		if _, err := c.DiscoveryV1().EndpointSlices(appNS).Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	rt, err := proxy.NewRouter(proxy.Options{EnvironmentID: "env_w", SentinelID: "sen_w", Region: "us"})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	front := httptest.NewServer(rt)
	defer front.Close()
	client := &http.Client{Timeout: 10 * time.Second}

	wctx, wcancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	logs := &logLines{}
	logger := hclog.New(&hclog.LoggerOptions{Output: logs, Level: hclog.Info})
	go func() {
		done <- Run(wctx, Options{Client: c, Namespace: routesNS, Name: "sen-w-routes", SentinelID: "sen_w", EnvironmentID: "env_w", Router: rt, Logger: logger})
	}()
	defer func() {
		wcancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()

	// No ConfigMap yet: not ready, once the watch has seen there is none.
	waitFor(t, 30*time.Second, "the watch to find no routes ConfigMap", func() bool { return logs.has("routes ConfigMap not found") })
	if ok, why := rt.Ready(); ok {
		t.Fatal("ready without routes")
	} else if !strings.Contains(why, "routes not loaded") {
		t.Fatalf("reason %q", why)
	}

	cms := c.CoreV1().ConfigMaps(routesNS)
	r := routes.Routes{SentinelID: "sen_w", EnvironmentID: "env_w", Version: 1, Hosts: []string{host},
		Backend: &routes.Backend{DeploymentID: "dep_old", Namespace: appNS, Service: "dep-old", Port: 1}}
	cm, err := cms.Create(ctx, routesCM(t, "sen-w-routes", r), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "ready after routes", func() bool { ok, _ := rt.Ready(); return ok })
	// Ready means warm: the first request is served.
	if code, body := get(t, client, front.URL, "/"); code != 200 || body != "old" {
		t.Fatalf("first request: %d %q", code, body)
	}
	for i := 0; i < 10; i++ {
		if code, body := get(t, client, front.URL, "/"); code != 200 || body != "old" {
			t.Fatalf("request %d: %d %q", i, code, body)
		}
	}

	// Promote with a request in flight on the old deployment.
	slow := make(chan string, 1)
	go func() { _, b := get(t, client, front.URL, "/slow"); slow <- b }()
	waitFor(t, 5*time.Second, "slow request reached old", func() bool { return old.hits.Load() >= 12 })
	r.Version = 2
	r.Backend = &routes.Backend{DeploymentID: "dep_new", Namespace: appNS, Service: "dep-new", Port: 1}
	cm.Data = routesCM(t, cm.Name, r).Data
	if cm, err = cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	took := waitFor(t, time.Second, "promote served by the new deployment", func() bool {
		_, body := get(t, client, front.URL, "/")
		return strings.HasPrefix(body, "new-")
	})
	t.Logf("switch took %v", took)
	for i := 0; i < 20; i++ {
		if code, body := get(t, client, front.URL, "/"); code != 200 || !strings.HasPrefix(body, "new-") {
			t.Fatalf("after the switch: %d %q", code, body)
		}
	}
	close(release)
	if b := <-slow; b != "old" {
		t.Fatalf("in-flight request on the old deployment got %q", b)
	}

	// An instance that turns unready stops receiving requests.
	s2, err := c.DiscoveryV1().EndpointSlices(appNS).Get(ctx, "dep-new-2", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s2.Endpoints[0].Conditions.Ready = ptr(false)
	if _, err := c.DiscoveryV1().EndpointSlices(appNS).Update(ctx, s2, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	_, nb := rt.Current()
	waitFor(t, time.Second, "unready instance removed", func() bool { return nb.Pool().Ready() == 1 })
	before := newB.hits.Load()
	for i := 0; i < 20; i++ {
		if code, body := get(t, client, front.URL, "/"); code != 200 || body != "new-a" {
			t.Fatalf("with new-b unready: %d %q", code, body)
		}
	}
	if n := newB.hits.Load() - before; n != 0 {
		t.Fatalf("unready instance got %d requests", n)
	}

	// Broken routes (another environment) are refused; the last good stay.
	refusals := logs.count("routes refused")
	bad := r
	bad.EnvironmentID = "env_other"
	bad.Version = 3
	cm.Data = routesCM(t, cm.Name, bad).Data
	if _, err = cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the watch to refuse the routes", func() bool { return logs.count("routes refused") > refusals })
	if cur, _ := rt.Current(); cur.Version != 2 {
		t.Fatalf("routes of another environment applied: version %d", cur.Version)
	}
	if code, body := get(t, client, front.URL, "/"); code != 200 || body != "new-a" {
		t.Fatalf("after refused routes: %d %q", code, body)
	}

	// The ConfigMap deleted (by hand, or in the moment a sentinel is
	// renamed): the last routes keep serving, and the sentinel stays ready.
	if err := cms.Delete(ctx, cm.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the watch to see the routes ConfigMap deleted", func() bool { return logs.has("routes ConfigMap deleted") })
	if ok, why := rt.Ready(); !ok {
		t.Fatalf("not ready after the routes ConfigMap was deleted: %s", why)
	}
	if code, body := get(t, client, front.URL, "/"); code != 200 || body != "new-a" {
		t.Fatalf("after the routes ConfigMap was deleted: %d %q", code, body)
	}
}

// localIP is where the test's instances listen (testenv.HostIP).
func localIP(t *testing.T) string { return testenv.HostIP(t) }

func deadPort(t *testing.T) int32 {
	l, err := net.Listen("tcp", net.JoinHostPort(localIP(t), "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return int32(l.Addr().(*net.TCPAddr).Port)
}

// logLines keeps what the watch logs, so a test can wait for what it saw
// (a refusal, an absence) instead of sleeping.
type logLines struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *logLines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logLines) has(s string) bool { return l.count(s) > 0 }

func (l *logLines) count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Count(l.b.String(), s)
}
