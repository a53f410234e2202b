package proxy

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"krane.dev/sentinel/routes"
)

// FuzzRequestPath feeds arbitrary Host values and header pairs through host
// normalization and the full handler. It must never panic, a normalized
// host must be valid and stable, and a host that is not served must never
// reach the backend.
func FuzzRequestPath(f *testing.F) {
	for _, s := range [][3]string{
		{"app.example.com", "X-Forwarded-For", "1.2.3.4"},
		{"APP.EXAMPLE.COM.:8040", "Connection", "X-A, close"},
		{"[::1]:80", "Forwarded", "for=\"[::1]\""},
		{"app.example.com:", "Te", "trailers"},
		{"app.example.com:99999999", "X-Forwarded-Host", ""},
		{"a..b", "Host", "x"},
		{"-a.example.com", "Upgrade", "websocket"},
		{"app.example.com\x00", "X", "\xff"},
		{strings.Repeat("a", 64) + ".com", "Content-Length", "-1"},
		{"xn--bcher-kva.example", "Keep-Alive", "timeout=1"},
	} {
		f.Add(s[0], s[1], s[2])
	}
	rt, err := NewRouter(Options{EnvironmentID: "env_f"})
	if err != nil {
		f.Fatal(err)
	}
	r := &routes.Routes{EnvironmentID: "env_f", Version: 1, Hosts: []string{"app.example.com"},
		Backend: &routes.Backend{DeploymentID: "dep_f", Namespace: "ns", Service: "s"}}
	b := rt.NewBackend(*r.Backend)
	b.SetInstances(nil) // no instance: a served host gets 503, never a dial
	if err := rt.Apply(r, b); err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, host, name, value string) {
		n, ok := NormalizeHost(host)
		if ok {
			if !routes.ValidHost(n) {
				t.Fatalf("NormalizeHost(%q) = %q, not a valid host", host, n)
			}
			if n2, ok2 := NormalizeHost(n); !ok2 || n2 != n {
				t.Fatalf("NormalizeHost not stable: %q -> %q -> %q %v", host, n, n2, ok2)
			}
		}
		req := httptest.NewRequest("GET", "http://x/", nil)
		req.Host = host
		if name != "" && !strings.ContainsAny(name, " :\r\n\x00") {
			req.Header.Add(name, value)
		}
		w := httptest.NewRecorder()
		rt.ServeHTTP(w, req)
		served := ok && n == "app.example.com"
		switch {
		case served && w.Code != http.StatusServiceUnavailable && w.Code != http.StatusRequestEntityTooLarge:
			t.Fatalf("host %q: %d, want 503 (served host, no instance)", host, w.Code)
		case !served && w.Code != http.StatusMisdirectedRequest:
			t.Fatalf("host %q: %d, want 421", host, w.Code)
		}
	})
}
