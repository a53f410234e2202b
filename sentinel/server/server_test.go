package server

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"krane.dev/internal/testenv"
	"krane.dev/internal/testenv/kubeenv"
	"krane.dev/sentinel/routes"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func TestFromEnvDefaultsAndErrors(t *testing.T) {
	env := map[string]string{EnvEnvironmentID: "env_a", EnvRoutes: "sentinel/sen-a-routes"}
	c, err := FromEnv(func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	if c.HTTPAddr != ":8040" || c.AdminAddr != ":9091" || !c.AccessLog || c.RoutesNamespace != "sentinel" || c.RoutesName != "sen-a-routes" ||
		c.MaxHeaderBytes != 64<<10 || c.MaxBodyBytes != 32<<20 || c.ReadHeaderTimeout != 10*time.Second {
		t.Fatalf("defaults: %+v", c)
	}
	bad := map[string]string{EnvHTTPPort: "http", EnvRoutes: "no-slash", EnvAccessLog: "maybe", EnvTrusted: "10.0.0.0/8,nope", EnvDial: "soon"}
	_, err = FromEnv(func(k string) string { return bad[k] })
	if err == nil {
		t.Fatal("bad environment accepted")
	}
	for _, v := range []string{EnvEnvironmentID, EnvHTTPPort, EnvRoutes, EnvAccessLog, EnvTrusted, EnvDial} {
		if !strings.Contains(err.Error(), v) {
			t.Errorf("error does not name %s: %v", v, err)
		}
	}
}

func listen(t *testing.T) net.Listener {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestRunServesAndShutsDownReadinessFirst runs the whole sentinel against a
// real API server: not ready without routes, ready once they are read, 421
// and 431 at the edge (Go allows 4 KiB over MaxHeaderBytes), metrics served, and on shutdown readiness goes false
// while the data port still answers.
func TestRunServesAndShutsDownReadinessFirst(t *testing.T) {
	kube := kubeenv.Shared(t)
	ctx := context.Background()
	if _, err := kube.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "srv"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{EnvEnvironmentID: "env_s", EnvSentinelID: "sen_s", EnvRegion: "us", EnvRoutes: "srv/routes",
		EnvKubeconfig: kube.Kubeconfig, EnvShutdownDelay: "700ms", EnvDrainTimeout: "5s", EnvMaxHeaderBytes: "4096"}
	cfg, err := FromEnv(func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	data, admin := listen(t), listen(t)
	dataURL, adminURL := "http://"+data.Addr().String(), "http://"+admin.Addr().String()
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- Run(rctx, cfg, hclog.NewNullLogger(), Listeners{Data: data, Admin: admin}) }()
	defer func() { cancel(); <-done }()

	status := func(url, host string, hdr http.Header) int {
		req, _ := http.NewRequest("GET", url, nil)
		if host != "" {
			req.Host = host
		}
		for k, v := range hdr {
			req.Header[k] = v
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return -1
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	wait := func(what string, cond func() bool) {
		deadline := time.Now().Add(10 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: timed out", what)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	wait("admin up", func() bool { return status(adminURL+PathHealthz, "", nil) == 200 })
	if c := status(adminURL+PathReadyz, "", nil); c != 503 {
		t.Fatalf("readyz without routes: %d", c)
	}
	b, _ := (&routes.Routes{SentinelID: "sen_s", EnvironmentID: "env_s", Version: 7, Hosts: []string{"s.example.com"}}).Encode()
	if _, err := kube.Client.CoreV1().ConfigMaps("srv").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "routes"},
		Data: map[string]string{routes.Key: string(b)}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	wait("ready", func() bool { return status(adminURL+PathReadyz, "", nil) == 200 })
	if c := status(dataURL+"/_krane/sentinel/ready", "10.1.2.3", nil); c != 200 {
		t.Fatalf("data-port ready: %d", c)
	}
	if c := status(dataURL+"/", "s.example.com", nil); c != 503 {
		t.Fatalf("served host without deployment: %d, want 503", c)
	}
	if c := status(dataURL+"/", "other.example.com", nil); c != http.StatusMisdirectedRequest {
		t.Fatalf("other host: %d, want 421", c)
	}
	if c := status(dataURL+"/", "s.example.com", http.Header{"X-Big": {strings.Repeat("x", 16<<10)}}); c != http.StatusRequestHeaderFieldsTooLarge {
		t.Fatalf("big header: %d, want 431", c)
	}
	resp, err := http.Get(adminURL + PathMetrics)
	if err != nil {
		t.Fatal(err)
	}
	m, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`krane_sentinel_route_version{environment="env_s"} 7`, `krane_sentinel_requests_total{code="4xx",deployment="",environment="env_s"}`} {
		if !strings.Contains(string(m), want) {
			t.Errorf("metrics lack %s", want)
		}
	}

	// Shutdown: readiness false at once, the data port still serving
	// during the delay.
	cancel()
	wait("not ready after SIGTERM", func() bool { return status(adminURL+PathReadyz, "", nil) == 503 })
	if c := status(dataURL+"/_krane/sentinel/ready", "x", nil); c != 503 {
		t.Fatalf("data-port readiness while draining: %d", c)
	}
	if c := status(dataURL+"/_krane/sentinel/live", "x", nil); c != 200 {
		t.Fatalf("data port closed before the drain: %d", c)
	}
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	done <- nil
}
