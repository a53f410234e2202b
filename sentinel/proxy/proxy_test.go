package proxy

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"

	"krane.dev/sentinel/routes"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// env is a router behind a real HTTP server, as the sentinel runs it.
type env struct {
	t      *testing.T
	rt     *Router
	front  *httptest.Server
	client *http.Client
	reg    *prometheus.Registry
	ver    uint64
}

func newEnv(t *testing.T, opts Options) *env {
	t.Helper()
	reg := prometheus.NewRegistry()
	opts.Registry = reg
	if opts.EnvironmentID == "" {
		opts.EnvironmentID = "env_a"
	}
	if opts.Region == "" {
		opts.Region = "us"
	}
	rt, err := NewRouter(opts)
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewServer(rt)
	tr := &http.Transport{MaxIdleConnsPerHost: 64}
	e := &env{t: t, rt: rt, front: front, reg: reg, client: &http.Client{Transport: tr, Timeout: 10 * time.Second}}
	t.Cleanup(func() {
		tr.CloseIdleConnections()
		front.Close()
		rt.Close()
	})
	return e
}

// instance starts a real HTTP server that answers with its name and echoes
// what it received.
func startInstance(t *testing.T, name string, h http.HandlerFunc) *httptest.Server {
	t.Helper()
	if h == nil {
		h = func(w http.ResponseWriter, r *http.Request) {
			body, _ := io.ReadAll(r.Body)
			w.Header().Set("X-Instance", name)
			_ = json.NewEncoder(w).Encode(map[string]any{"instance": name, "header": r.Header, "host": r.Host, "body": string(body)})
		}
	}
	s := httptest.NewServer(h)
	t.Cleanup(s.Close)
	return s
}

func addr(s *httptest.Server) string { return strings.TrimPrefix(s.URL, "http://") }

// route publishes hosts served by a backend of deployment dep with the
// given instances (no backend when dep is "").
func (e *env) route(hosts []string, dep string, instances ...string) *Backend {
	e.t.Helper()
	e.ver++
	r := &routes.Routes{EnvironmentID: "env_a", Version: e.ver, Hosts: hosts}
	var b *Backend
	if dep != "" {
		r.Backend = &routes.Backend{DeploymentID: dep, Namespace: "ns", Service: dep, Port: 8080}
		b = e.rt.NewBackend(*r.Backend)
		b.SetInstances(instances)
	}
	if err := r.Validate(); err != nil {
		e.t.Fatal(err)
	}
	if err := e.rt.Apply(r, b); err != nil {
		e.t.Fatal(err)
	}
	return b
}

type reply struct {
	code   int
	body   string
	header http.Header
	echo   struct {
		Instance string      `json:"instance"`
		Header   http.Header `json:"header"`
		Host     string      `json:"host"`
		Body     string      `json:"body"`
	}
}

func (e *env) do(method, host, path string, body io.Reader, hdr map[string]string) reply {
	e.t.Helper()
	req, err := http.NewRequest(method, e.front.URL+path, body)
	if err != nil {
		e.t.Fatal(err)
	}
	req.Host = host
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := e.client.Do(req)
	if err != nil {
		e.t.Fatalf("%s %s%s: %v", method, host, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	r := reply{code: resp.StatusCode, body: string(b), header: resp.Header}
	_ = json.Unmarshal(b, &r.echo)
	return r
}

func (e *env) get(host string) reply { return e.do("GET", host, "/", nil, nil) }

func TestRoutesByHostAndRefusesOthers(t *testing.T) {
	e := newEnv(t, Options{})
	a := startInstance(t, "a", nil)
	e.route([]string{"app.example.com", "www.example.com"}, "dep_a", addr(a))
	for _, h := range []string{"app.example.com", "APP.Example.com:8040", "www.example.com.", "www.example.com:80"} {
		if r := e.get(h); r.code != 200 || r.echo.Instance != "a" || r.echo.Host != h {
			t.Errorf("host %q: got %d %q (host seen %q), want 200 from a with the client's Host", h, r.code, r.body, r.echo.Host)
		}
	}
	for _, h := range []string{"evil.example.com", "127.0.0.1", "[::1]:80", "app.example.com:http", "app.example.com.evil.com", ""} {
		if r := e.get(h); r.code != http.StatusMisdirectedRequest {
			t.Errorf("host %q: got %d %q, want 421", h, r.code, r.body)
		}
	}
	if got := testutil.ToFloat64(e.rt.metrics.requests.WithLabelValues("env_a", "", "4xx")); got < 5 {
		t.Errorf("421s counted as %v, want >= 5", got)
	}
}

func TestNoInstanceAnswers503WithReasonAtOnce(t *testing.T) {
	e := newEnv(t, Options{})
	if r := e.get("app.example.com"); r.code != 503 || !strings.Contains(r.body, "routes not loaded") {
		t.Fatalf("before routes: %d %q", r.code, r.body)
	}
	e.route([]string{"app.example.com"}, "")
	if r := e.get("app.example.com"); r.code != 503 || !strings.Contains(r.body, "no live deployment") {
		t.Fatalf("no backend: %d %q", r.code, r.body)
	}
	e.route([]string{"app.example.com"}, "dep_x")
	start := time.Now()
	r := e.get("app.example.com")
	if r.code != 503 || r.body != "no ready instance of deployment dep_x in region us\n" {
		t.Fatalf("no instance: %d %q", r.code, r.body)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("503 took %v, want at once", d)
	}
	if got := testutil.ToFloat64(e.rt.metrics.upstreamErrors.WithLabelValues("env_a", "dep_x", ReasonNoInstance)); got != 1 {
		t.Fatalf("no_instance errors = %v, want 1", got)
	}
}

func TestSwitchLetsInFlightRequestFinishOnOldBackend(t *testing.T) {
	e := newEnv(t, Options{})
	entered := make(chan struct{})
	release := make(chan struct{})
	old := startInstance(t, "old", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			close(entered)
			<-release
		}
		_, _ = io.WriteString(w, "old")
	})
	newer := startInstance(t, "new", func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "new") })
	oldB := e.route([]string{"app.example.com"}, "dep_old", addr(old))

	slow := make(chan reply, 1)
	go func() { slow <- e.do("GET", "app.example.com", "/slow", nil, nil) }()
	<-entered
	e.route([]string{"app.example.com"}, "dep_new", addr(newer))
	for i := 0; i < 20; i++ {
		if r := e.get("app.example.com"); r.code != 200 || r.body != "new" {
			t.Fatalf("request %d after the switch: %d %q, want new", i, r.code, r.body)
		}
	}
	if n := oldB.Pool().Active(); n != 1 {
		t.Fatalf("old pool has %d requests in flight, want the slow one", n)
	}
	close(release)
	if r := <-slow; r.code != 200 || r.body != "old" {
		t.Fatalf("in-flight request on the old backend: %d %q, want 200 old", r.code, r.body)
	}
	if n := oldB.Pool().Active(); n != 0 {
		t.Fatalf("old pool still has %d in flight", n)
	}
}

func deadAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := l.Addr().String()
	l.Close()
	return a
}

func TestDeadInstanceIsEjectedAndRequestsRetried(t *testing.T) {
	e := newEnv(t, Options{})
	live := startInstance(t, "live", nil)
	dead := deadAddr(t)
	e.route([]string{"app.example.com"}, "dep_a", dead, addr(live))
	for i := 0; i < 40; i++ {
		payload := fmt.Sprintf("payload-%d-%s", i, strings.Repeat("x", 2048))
		r := e.do("POST", "app.example.com", "/", strings.NewReader(payload), nil)
		if r.code != 200 || r.echo.Instance != "live" || r.echo.Body != payload {
			t.Fatalf("POST %d: %d %q instance %q, body intact %v", i, r.code, r.body, r.echo.Instance, r.echo.Body == payload)
		}
	}
	// One connect failure, then the dead instance is out for its backoff.
	if got := testutil.ToFloat64(e.rt.metrics.upstreamErrors.WithLabelValues("env_a", "dep_a", ReasonConnect)); got != 1 {
		t.Fatalf("connect failures = %v, want exactly 1 (the dead instance ejected after its first)", got)
	}
	if got := testutil.ToFloat64(e.rt.metrics.ejections.WithLabelValues("env_a", "dep_a")); got != 1 {
		t.Fatalf("ejections = %v, want 1", got)
	}
}

func TestAllInstancesDeadAnswers502(t *testing.T) {
	e := newEnv(t, Options{})
	e.route([]string{"app.example.com"}, "dep_a", deadAddr(t), deadAddr(t))
	r := e.get("app.example.com")
	if r.code != http.StatusBadGateway || !strings.Contains(r.body, "could not connect to any instance of deployment dep_a") {
		t.Fatalf("got %d %q", r.code, r.body)
	}
}

func TestHopByHopHeadersRemoved(t *testing.T) {
	e := newEnv(t, Options{})
	a := startInstance(t, "a", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Connection", "X-Resp-Hop")
		w.Header().Set("X-Resp-Hop", "1")
		w.Header().Set("Keep-Alive", "timeout=5")
		w.Header().Set("X-End", "1")
		_ = json.NewEncoder(w).Encode(map[string]any{"instance": "a", "header": r.Header})
	})
	e.route([]string{"app.example.com"}, "dep_a", addr(a))
	r := e.do("GET", "app.example.com", "/", nil, map[string]string{
		"Connection": "X-Secret", "X-Secret": "s", "Keep-Alive": "timeout=5", "Proxy-Authorization": "Basic eA==",
		"Proxy-Connection": "keep-alive", "Te": "gzip", "X-End": "1",
	})
	if r.code != 200 {
		t.Fatalf("%d %q", r.code, r.body)
	}
	for _, h := range []string{"X-Secret", "Keep-Alive", "Proxy-Authorization", "Proxy-Connection", "Te"} {
		if v := r.echo.Header.Get(h); v != "" {
			t.Errorf("instance received hop-by-hop %s: %q", h, v)
		}
	}
	if r.echo.Header.Get("X-End") != "1" {
		t.Errorf("end-to-end header lost")
	}
	if r.header.Get("X-Resp-Hop") != "" || r.header.Get("Keep-Alive") != "" {
		t.Errorf("client received hop-by-hop response headers: %v", r.header)
	}
	if r.header.Get("X-End") != "1" {
		t.Errorf("end-to-end response header lost")
	}
}

func TestXForwardedFromUntrustedPeerIsReplaced(t *testing.T) {
	e := newEnv(t, Options{})
	a := startInstance(t, "a", nil)
	e.route([]string{"app.example.com"}, "dep_a", addr(a))
	r := e.do("GET", "app.example.com", "/", nil, map[string]string{
		"X-Forwarded-For": "6.6.6.6", "X-Forwarded-Host": "evil", "X-Forwarded-Proto": "https", "Forwarded": "for=6.6.6.6",
	})
	h := r.echo.Header
	if got := h.Get("X-Forwarded-For"); got != "127.0.0.1" {
		t.Errorf("X-Forwarded-For = %q, want the peer only", got)
	}
	if got := h.Get("X-Forwarded-Host"); got != "app.example.com" {
		t.Errorf("X-Forwarded-Host = %q", got)
	}
	if got := h.Get("X-Forwarded-Proto"); got != "http" {
		t.Errorf("X-Forwarded-Proto = %q", got)
	}
	if got := h.Get("Forwarded"); got != "" {
		t.Errorf("Forwarded passed through: %q", got)
	}
}

func TestXForwardedFromTrustedPeerIsKept(t *testing.T) {
	e := newEnv(t, Options{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}})
	a := startInstance(t, "a", nil)
	e.route([]string{"app.example.com"}, "dep_a", addr(a))
	r := e.do("GET", "app.example.com", "/", nil, map[string]string{
		"X-Forwarded-For": "203.0.113.7", "X-Forwarded-Host": "app.example.com", "X-Forwarded-Proto": "https",
	})
	h := r.echo.Header
	if got := h.Get("X-Forwarded-For"); got != "203.0.113.7, 127.0.0.1" {
		t.Errorf("X-Forwarded-For = %q, want the chain plus the peer", got)
	}
	if got := h.Get("X-Forwarded-Proto"); got != "https" {
		t.Errorf("X-Forwarded-Proto = %q, want the load balancer's", got)
	}
}

func TestBodyLimitAndUpstreamTimeout(t *testing.T) {
	e := newEnv(t, Options{MaxBodyBytes: 1024, ResponseHeaderTimeout: 200 * time.Millisecond})
	a := startInstance(t, "a", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/hang" {
			select {
			case <-r.Context().Done():
			case <-time.After(5 * time.Second):
			}
			return
		}
		if _, err := io.ReadAll(r.Body); err != nil {
			return
		}
		_, _ = io.WriteString(w, "ok")
	})
	e.route([]string{"app.example.com"}, "dep_a", addr(a))
	if r := e.do("POST", "app.example.com", "/", strings.NewReader(strings.Repeat("x", 1024)), nil); r.code != 200 {
		t.Fatalf("body at the limit: %d %q", r.code, r.body)
	}
	if r := e.do("POST", "app.example.com", "/", strings.NewReader(strings.Repeat("x", 1025)), nil); r.code != 413 {
		t.Fatalf("body over the limit (Content-Length): %d %q", r.code, r.body)
	}
	// Without a Content-Length the limit applies while streaming.
	chunked := io.MultiReader(strings.NewReader(strings.Repeat("x", 4096)))
	if r := e.do("POST", "app.example.com", "/", struct{ io.Reader }{chunked}, nil); r.code != 413 {
		t.Fatalf("chunked body over the limit: %d %q", r.code, r.body)
	}
	start := time.Now()
	r := e.do("GET", "app.example.com", "/hang", nil, nil)
	if r.code != http.StatusGatewayTimeout || time.Since(start) > 3*time.Second {
		t.Fatalf("hanging instance: %d %q after %v, want 504 after ~200ms", r.code, r.body, time.Since(start))
	}
}

func TestProbes(t *testing.T) {
	e := newEnv(t, Options{})
	if r := e.do("GET", "10.0.0.1:8040", PathLive, nil, nil); r.code != 200 {
		t.Fatalf("live: %d", r.code)
	}
	if r := e.do("GET", "10.0.0.1:8040", PathReady, nil, nil); r.code != 503 || !strings.Contains(r.body, "routes not loaded") {
		t.Fatalf("ready before routes: %d %q", r.code, r.body)
	}
	// A backend without synced instances is not ready: the cache is cold.
	r := &routes.Routes{EnvironmentID: "env_a", Version: 1, Hosts: []string{"a.example.com"},
		Backend: &routes.Backend{DeploymentID: "dep_a", Namespace: "ns", Service: "s"}}
	b := e.rt.NewBackend(*r.Backend)
	if err := e.rt.Apply(r, b); err != nil {
		t.Fatal(err)
	}
	if rr := e.do("GET", "x", PathReady, nil, nil); rr.code != 503 || !strings.Contains(rr.body, "not synced") {
		t.Fatalf("ready before sync: %d %q", rr.code, rr.body)
	}
	b.SetInstances(nil)
	// The notes' health path, the plugin's default probe, is readiness too.
	for _, path := range []string{PathReady, PathHealth} {
		if rr := e.do("GET", "x", path, nil, nil); rr.code != 200 {
			t.Fatalf("%s after sync: %d %q", path, rr.code, rr.body)
		}
	}
	e.rt.Drain()
	for _, path := range []string{PathReady, PathHealth} {
		if rr := e.do("GET", "x", path, nil, nil); rr.code != 503 || !strings.Contains(rr.body, "draining") {
			t.Fatalf("%s while draining: %d %q", path, rr.code, rr.body)
		}
	}
}
