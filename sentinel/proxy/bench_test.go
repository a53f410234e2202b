package proxy

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"testing"

	"krane.dev/sentinel/routes"
)

// BenchmarkProxy compares a direct request, a bare httputil.ReverseProxy and
// the sentinel's router on loopback, with the same client and instance.
// It is a quick local figure; the release benchmark lives in internal/bench.
func BenchmarkProxy(b *testing.B) {
	inst := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "hello") }))
	defer inst.Close()
	u, _ := url.Parse(inst.URL)
	bare := httptest.NewServer(&httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) { pr.SetURL(u); pr.SetXForwarded() },
		Transport: &http.Transport{MaxIdleConnsPerHost: 256}})
	defer bare.Close()
	rt, err := NewRouter(Options{EnvironmentID: "env_b"})
	if err != nil {
		b.Fatal(err)
	}
	defer rt.Close()
	r := &routes.Routes{EnvironmentID: "env_b", Version: 1, Hosts: []string{"b.example.com"},
		Backend: &routes.Backend{DeploymentID: "dep_b", Namespace: "ns", Service: "s"}}
	be := rt.NewBackend(*r.Backend)
	be.SetInstances([]string{u.Host})
	if err := rt.Apply(r, be); err != nil {
		b.Fatal(err)
	}
	sentinel := httptest.NewServer(rt)
	defer sentinel.Close()
	for _, c := range []struct{ name, url string }{{"direct", inst.URL}, {"httputil", bare.URL}, {"sentinel", sentinel.URL}} {
		b.Run(c.name, func(b *testing.B) {
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}}
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					req, _ := http.NewRequest("GET", c.url+"/", nil)
					req.Host = "b.example.com"
					resp, err := client.Do(req)
					if err != nil {
						b.Error(err)
						return
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != 200 {
						b.Errorf("%s: %d", c.name, resp.StatusCode)
						return
					}
				}
			})
			client.CloseIdleConnections()
		})
	}
}
