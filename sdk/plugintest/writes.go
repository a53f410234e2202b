package plugintest

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"path/filepath"
	"sync"
	"testing"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"krane.dev/sdk"
	"krane.dev/sdk/kube"
)

// writeCounter is a reverse proxy in front of the suite's API server: the
// plugin is configured with a kubeconfig that points at it, so every call
// the plugin makes passes through it, whatever client the plugin uses. It
// records the calls that are not reads (GET, HEAD: LIST and WATCH are GETs)
// so the suite can check that an Unchanged Apply wrote nothing.
type writeCounter struct {
	mu     sync.Mutex
	writes []string // "METHOD path" of each write, in order
}

// count returns how many writes passed so far.
func (w *writeCounter) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.writes)
}

// since returns the writes after the first n.
func (w *writeCounter) since(n int) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.writes[n:]...)
}

// countWrites starts the proxy for src's API server and returns the
// KubeSource that reaches the server through it, with the identity src
// has (the proxy authenticates upstream with src's credentials). An
// in-cluster source cannot be redirected: it is returned as is, with a nil
// counter, and the write checks are skipped.
func countWrites(t *testing.T, src sdk.KubeSource) (sdk.KubeSource, *writeCounter) {
	t.Helper()
	if src.InCluster {
		t.Log("plugintest: an in-cluster KubeSource cannot be counted; the no-write checks are skipped")
		return src, nil
	}
	cfg, err := kube.RESTConfig(src)
	if err != nil {
		t.Fatalf("plugintest: the suite's KubeSource: %v", err)
	}
	upstream, err := rest.TransportFor(cfg)
	if err != nil {
		t.Fatalf("plugintest: a transport for %s: %v", cfg.Host, err)
	}
	target, err := url.Parse(cfg.Host)
	if err != nil {
		t.Fatalf("plugintest: API server address %q: %v", cfg.Host, err)
	}
	proxy := httputil.NewSingleHostReverseProxy(target)
	proxy.Transport = upstream
	proxy.FlushInterval = -1 // watches stream
	// Open watches end when the suite does, so the server can close.
	stop, cancel := context.WithCancel(context.Background())
	w := &writeCounter{}
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.mu.Lock()
			w.writes = append(w.writes, r.Method+" "+r.URL.Path)
			w.mu.Unlock()
		}
		ctx, done := context.WithCancel(r.Context())
		defer done()
		defer context.AfterFunc(stop, done)()
		proxy.ServeHTTP(rw, r.WithContext(ctx))
	}))
	t.Cleanup(func() {
		cancel()
		srv.Close()
	})

	kc := clientcmdapi.NewConfig()
	kc.Clusters["counted"] = &clientcmdapi.Cluster{Server: srv.URL}
	kc.AuthInfos["counted"] = &clientcmdapi.AuthInfo{}
	kc.Contexts["counted"] = &clientcmdapi.Context{Cluster: "counted", AuthInfo: "counted"}
	kc.CurrentContext = "counted"
	path := filepath.Join(t.TempDir(), "counted.kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatalf("plugintest: write the counting kubeconfig: %v", err)
	}
	return sdk.KubeSource{Path: path, QPS: src.QPS, Burst: src.Burst}, w
}

// noWrites fails t when writes happened after the first n, naming them.
func (w *writeCounter) noWrites(t *testing.T, n int, what string) {
	t.Helper()
	if w == nil {
		return
	}
	if extra := w.since(n); len(extra) > 0 {
		t.Errorf("%s answered unchanged but made %d API write(s): %v; an Unchanged Apply must not write (a resync re-applies every object every few minutes)", what, len(extra), extra)
	}
}
