package serve_test

import (
	"context"
	"crypto/x509"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"krane.dev/ctrl/internal/ctrltest"
	"krane.dev/ctrl/serve"
	"krane.dev/internal/testenv"
)

// TestRestateOverTLSWithAPrivateCA: restate-server serves no TLS itself,
// so a TLS-terminating proxy with a certificate from a private CA stands
// in front of its admin API, as in production. ctrl with https://
// restate.admin_url and restate.ca_file registers through it; with
// another CA registration fails, saying the certificate is not trusted.
func TestRestateOverTLSWithAPrivateCA(t *testing.T) {
	dir := t.TempDir()
	path := func(n string) string { return filepath.Join(dir, n) }
	ca, other := newTestCA(t, "restate ca"), newTestCA(t, "another ca")
	cert, key := ca.valid(t, 401, x509.ExtKeyUsageServerAuth)
	writeInPlace(t, path("ca.pem"), ca.pem)
	writeInPlace(t, path("other-ca.pem"), other.pem)
	rs := testenv.SharedRestate(t)
	admin := testenv.StartTLSProxy(t, rs.AdminURL(), cert, key)
	ingress := testenv.StartTLSProxy(t, rs.IngressURL(), cert, key)

	env := ctrltest.Start(t, ctrltest.Options{Restate: rs, Configure: func(c *serve.Config) {
		c.Restate.AdminURL, c.Restate.IngressURL, c.Restate.CAFile = admin.URL(), ingress.URL(), path("ca.pem")
	}})
	if admin.Requests() == 0 {
		t.Fatal("ctrl registered with Restate, but not through the TLS proxy")
	}
	t.Logf("registered through the TLS proxy (%d admin requests)", admin.Requests())
	_ = env

	// The wrong CA: registration never succeeds, and the log says why.
	cfg := ctrltest.Config(testenv.SharedMySQL(t).Database(t, t.Name()+"-wrong"))
	cfg.Restate.AdminURL, cfg.Restate.IngressURL, cfg.Restate.CAFile = admin.URL(), ingress.URL(), path("other-ca.pem")
	cfg.Restate.Endpoint.Listen = "127.0.0.1:0"
	cfg.Restate.IdentityKeys = rs.IdentityKey()
	cfg.Sentinel.DefaultImage = ctrltest.SentinelImage
	logs := &ctrltest.LogBuffer{}
	srv, err := serve.Start(context.Background(), cfg, serve.NewLogger(cfg.Log, logs), serve.Deps{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if err := srv.WaitRestateRegistered(ctx); err == nil {
		t.Fatal("ctrl registered with Restate through a proxy whose certificate restate.ca_file did not sign")
	}
	if l := logs.String(); !strings.Contains(l, "restate.ca_file") || !strings.Contains(l, "unknown authority") {
		t.Fatalf("ctrl with the wrong restate.ca_file: want its log to name restate.ca_file and the unknown authority:\n%s", l)
	}
}

// TestRestateCallsTheEndpointOverTLS: with restate.endpoint.tls_cert,
// ctrl serves its Restate endpoint over TLS and registers its https://
// URL; a restate-server that trusts the private CA (SSL_CERT_FILE)
// discovers it (an HTTP/2 call over TLS from Restate to ctrl, as its
// invocations are), so registration succeeds. Its negative control: the same endpoint registered with a
// Restate that does not trust the CA fails, since Restate cannot
// discover it.
func TestRestateCallsTheEndpointOverTLS(t *testing.T) {
	dir := t.TempDir()
	path := func(n string) string { return filepath.Join(dir, n) }
	ca := newTestCA(t, "endpoint ca")
	cert, key := ca.valid(t, 501, x509.ExtKeyUsageServerAuth)
	writeInPlace(t, path("ca.pem"), ca.pem)
	writeInPlace(t, path("endpoint.crt"), cert)
	writeInPlace(t, path("endpoint.key"), key)
	rs, err := testenv.StartRestateTrusting(path("ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rs.Stop)
	withTLS := func(c *serve.Config) {
		c.Restate.Endpoint.TLSCert, c.Restate.Endpoint.TLSKey = path("endpoint.crt"), path("endpoint.key")
	}
	// ctrltest.Start waits until ctrl registered its endpoint.
	env := ctrltest.Start(t, ctrltest.Options{Restate: rs, Configure: withTLS})
	if l := env.Logs.String(); !strings.Contains(l, `"url":"https://127.0.0.1:`) && !strings.Contains(l, "url=https://127.0.0.1:") {
		t.Fatalf("ctrl with restate.endpoint.tls_cert did not serve an https:// endpoint URL:\n%s", l)
	}

	// The negative control: a Restate without the CA cannot discover it.
	untrusting := testenv.SharedRestate(t)
	cfg := ctrltest.Config(testenv.SharedMySQL(t).Database(t, t.Name()+"-untrusted"))
	cfg.Restate.AdminURL, cfg.Restate.IngressURL = untrusting.AdminURL(), untrusting.IngressURL()
	cfg.Restate.Endpoint.Listen = "127.0.0.1:0"
	cfg.Restate.IdentityKeys = untrusting.IdentityKey()
	cfg.Sentinel.DefaultImage = ctrltest.SentinelImage
	withTLS(&cfg)
	srv, err := serve.Start(context.Background(), cfg, serve.NewLogger(cfg.Log, &ctrltest.LogBuffer{}), serve.Deps{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if err := srv.WaitRestateRegistered(ctx); err == nil {
		t.Fatal("a Restate that does not trust the endpoint's CA registered it: the endpoint is not serving the private CA's certificate")
	}
}
