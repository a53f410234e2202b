package testenv

import (
	"crypto/tls"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"sync/atomic"
	"testing"
)

// TLSProxy terminates TLS in front of a plain-HTTP server (Restate's
// ingress or admin API, which serve no TLS themselves): what production
// puts in front of them when their traffic must be encrypted.
type TLSProxy struct {
	srv      *httptest.Server
	requests atomic.Int64
}

// StartTLSProxy serves https on a free loopback port with the PEM
// certificate and key given, forwarding every request to target
// (http://host:port). It stops when tb ends.
func StartTLSProxy(tb testing.TB, target string, certPEM, keyPEM []byte) *TLSProxy {
	tb.Helper()
	u, err := url.Parse(target)
	if err != nil {
		tb.Fatal(err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		tb.Fatal(err)
	}
	p := &TLSProxy{}
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.FlushInterval = -1 // stream answers (attach waits) as they come
	p.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.requests.Add(1)
		rp.ServeHTTP(w, r)
	}))
	p.srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	p.srv.StartTLS()
	tb.Cleanup(p.srv.Close)
	return p
}

// URL is the proxy's https://127.0.0.1:port.
func (p *TLSProxy) URL() string { return p.srv.URL }

// Requests is how many requests the proxy has forwarded.
func (p *TLSProxy) Requests() int64 { return p.requests.Load() }
