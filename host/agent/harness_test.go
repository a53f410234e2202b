package agent_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"krane.dev/host/agent"
	"krane.dev/host/config"
	"krane.dev/internal/clustertest"
	"krane.dev/internal/testenv"
	"krane.dev/internal/testenv/kubeenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

const (
	cmKind    = "configmap.example.krane.dev"
	region    = "r1"
	token     = "test-cluster-token"
	cmManaged = "app.kubernetes.io/managed-by=krane,app.kubernetes.io/component=configmap-example"
)

// harness runs a real krane host (agent) against a ClusterService test
// server and a real API server, with real plugin processes.
type harness struct {
	t       *testing.T
	cluster *kubeenv.Cluster
	ctrl    *clustertest.Server
	dir     string
	cfgPath string
	agent   *agent.Agent
	logs    *syncBuffer
	ns      string
	plugins string
	logger  hclog.Logger
	stop    func()
}

var (
	pluginsOnce sync.Once
	pluginsDir  string
)

// pluginDir builds the plugins the tests use and links them into one
// directory (the noop plugin under three names: three distinct kinds).
func pluginDir(t *testing.T) string {
	cm := testenv.Build(t, "krane.dev/sdk/examples/configmap", "krane-plugin-configmap")
	noop := testenv.Build(t, "krane.dev/internal/testplugins/noop/plugin", "krane-plugin-noop")
	pluginsOnce.Do(func() {
		dir, err := testenv.SubDir("plugins")
		if err != nil {
			t.Fatal(err)
		}
		links := map[string]string{"krane-plugin-configmap": cm, "krane-plugin-noop-a": noop, "krane-plugin-noop-b": noop, "krane-plugin-noop-c": noop}
		for name, src := range links {
			if err := os.Link(src, filepath.Join(dir, name)); err != nil {
				t.Fatal(err)
			}
		}
		pluginsDir = dir
	})
	return pluginsDir
}

// newHarness prepares (but does not start) a host whose krane.hcl holds
// the given controller blocks; %NS% in them is replaced by the test's
// namespace.
func newHarness(t *testing.T, controllers string) *harness {
	t.Helper()
	cluster := kubeenv.Shared(t)
	h := newHostHarness(t, controllers, pluginDir(t))
	h.cluster = cluster
	if err := cluster.EnsureNamespace(context.Background(), h.ns); err != nil {
		t.Fatal(err)
	}
	// The API server is shared by this package's tests and the example
	// plugin's inventory is cluster-wide: start from a clean slate.
	cleanManaged(t, cluster)
	t.Cleanup(func() { cleanManaged(t, cluster) })
	h.writeConfig(controllers, "")
	return h
}

// newHostHarness prepares a host without an API server, for controllers
// that need none (the noop plugins), with plugins found in plugins.
func newHostHarness(t *testing.T, controllers, plugins string) *harness {
	t.Helper()
	h := &harness{t: t, ctrl: clustertest.Start(t, region, token), dir: t.TempDir(), logs: &syncBuffer{}, plugins: plugins}
	h.ctrl.KeepAlive = 200 * time.Millisecond
	h.ns = strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(t.Name()))
	if len(h.ns) > 50 {
		h.ns = h.ns[:50]
	}
	h.cfgPath = filepath.Join(h.dir, "krane.hcl")
	h.writeConfig(controllers, "")
	return h
}

func (h *harness) writeConfig(controllers, extra string) {
	h.t.Helper()
	hcl := fmt.Sprintf(`
region = %q
cluster_id = "c1"
control_plane {
  url = %q
  token = %q
}
kubernetes {
  kubeconfig = %q
  # The test's admin credentials serve the plugins too.
  plugin_identities { enabled = false }
}
sync {
  resync_interval = "1h"
  reconnect_min = "50ms"
  reconnect_max = "200ms"
  workers = 8
}
gc {
  max_delete_fraction = 0.25
  min_deletes = 5
}
server { listen = "127.0.0.1:0" }
log { level = "debug" }
plugin_dir = %q
%s
%s
`, region, h.ctrl.URL(), token, h.kubeconfig(), h.plugins, strings.ReplaceAll(controllers, "%NS%", h.ns), extra)
	if err := os.WriteFile(h.cfgPath, []byte(hcl), 0o600); err != nil {
		h.t.Fatal(err)
	}
}

// kubeconfig is the API server's kubeconfig, or "" (in-cluster, which the
// noop plugins never use) without one.
func (h *harness) kubeconfig() string {
	if h.cluster == nil {
		return ""
	}
	return h.cluster.Kubeconfig
}

func (h *harness) load() *config.Config {
	h.t.Helper()
	cfg, err := config.Load(h.cfgPath, []string{})
	if err != nil {
		h.t.Fatal(err)
	}
	return cfg
}

// start runs the agent until the test ends.
func (h *harness) start() {
	h.t.Helper()
	h.logger = hclog.New(&hclog.LoggerOptions{Name: "krane", Level: hclog.Debug, Output: io.MultiWriter(h.logs, testWriter{h.t})})
	h.agent = agent.New(h.load(), h.logger, agent.Options{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := h.agent.Run(ctx); err != nil {
			h.t.Errorf("agent: %v", err)
		}
	}()
	h.stop = func() {
		cancel()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			h.t.Errorf("agent did not stop within 30s")
		}
	}
	h.t.Cleanup(h.stop)
}

func (h *harness) reload() {
	h.t.Helper()
	if err := h.agent.Reload(h.load()); err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) cm(i int, data string) map[string]any {
	return map[string]any{"namespace": h.ns, "name": fmt.Sprintf("cm-%d", i), "data": map[string]any{"v": data}}
}

// configMaps returns the managed ConfigMaps of the test namespace by name.
func (h *harness) configMaps() map[string]corev1.ConfigMap {
	h.t.Helper()
	list, err := h.cluster.Client.CoreV1().ConfigMaps(h.ns).List(context.Background(), metav1.ListOptions{LabelSelector: cmManaged})
	if err != nil {
		h.t.Fatal(err)
	}
	out := map[string]corev1.ConfigMap{}
	for _, cm := range list.Items {
		out[cm.Name] = cm
	}
	return out
}

// eventually retries cond until it holds or the timeout passes.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var err error
	for time.Now().Before(deadline) {
		if err = cond(); err == nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("timed out after %s waiting for %s: %v", timeout, what, err)
}

// metric returns the value of a metric series line from /metrics, or -1.
func (h *harness) metric(series string) float64 {
	rec := httptest.NewRecorder()
	h.agent.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	for _, line := range strings.Split(rec.Body.String(), "\n") {
		if strings.HasPrefix(line, series+" ") {
			var v float64
			fmt.Sscanf(strings.TrimPrefix(line, series+" "), "%g", &v)
			return v
		}
	}
	return -1
}

func cleanManaged(t *testing.T, c *kubeenv.Cluster) {
	err := c.Client.CoreV1().ConfigMaps("").DeleteCollection(context.Background(), metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: cmManaged})
	if err != nil {
		// DeleteCollection needs a namespace: delete one by one.
		list, lerr := c.Client.CoreV1().ConfigMaps("").List(context.Background(), metav1.ListOptions{LabelSelector: cmManaged})
		if lerr != nil {
			t.Fatal(lerr)
		}
		for _, cm := range list.Items {
			_ = c.Client.CoreV1().ConfigMaps(cm.Namespace).Delete(context.Background(), cm.Name, metav1.DeleteOptions{})
		}
	}
}

// managedConfigMap creates a ConfigMap that looks like the example plugin's.
func (h *harness) managedConfigMap(name, id string) {
	h.t.Helper()
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: h.ns, Labels: map[string]string{
		"app.kubernetes.io/managed-by": "krane", "app.kubernetes.io/component": "configmap-example", "krane.dev/id": id,
	}}, Data: map[string]string{"v": "orphan"}}
	if _, err := h.cluster.Client.CoreV1().ConfigMaps(h.ns).Create(context.Background(), cm, metav1.CreateOptions{}); err != nil {
		h.t.Fatal(err)
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	if os.Getenv("KRANE_TEST_VERBOSE") != "" {
		w.t.Log(strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}
