package serve_test

import (
	"context"
	"crypto/x509"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"

	"krane.dev/ctrl/internal/ctrltest"
	"krane.dev/ctrl/serve"
	"krane.dev/internal/testenv"
)

// TestDatabaseOverTLSWithAPrivateCA: a private MariaDB serving TLS with a
// certificate from a private CA. ctrl with db.tls_ca naming that CA
// connects encrypted (Ssl_cipher is set on its connections); without it
// the same server is reached in plaintext (the check means something);
// with another CA ctrl refuses to start, saying why.
func TestDatabaseOverTLSWithAPrivateCA(t *testing.T) {
	dir := t.TempDir()
	path := func(n string) string { return filepath.Join(dir, n) }
	ca, other := newTestCA(t, "db ca"), newTestCA(t, "another ca")
	cert, key := ca.valid(t, 301, x509.ExtKeyUsageServerAuth)
	writeInPlace(t, path("ca.pem"), ca.pem)
	writeInPlace(t, path("other-ca.pem"), other.pem)
	writeInPlace(t, path("server.crt"), cert)
	writeInPlace(t, path("server.key"), key)
	db := testenv.StartTLSMySQL(t, testenv.MySQLTLS{CA: path("ca.pem"), Cert: path("server.crt"), Key: path("server.key")})
	dsn := db.Database(t, t.Name())

	cipher := func(env *ctrltest.Env) string {
		t.Helper()
		var name, value string
		if err := env.Store.DB().QueryRowContext(context.Background(), "SHOW SESSION STATUS LIKE 'Ssl_cipher'").Scan(&name, &value); err != nil {
			t.Fatal(err)
		}
		return value
	}
	tlsEnv := ctrltest.Start(t, ctrltest.Options{DSN: dsn, Configure: func(c *serve.Config) { c.DB.TLSCA = path("ca.pem") }})
	if c := cipher(tlsEnv); c == "" {
		t.Fatal("ctrl with db.tls_ca: Ssl_cipher is empty, the database connection is not encrypted")
	} else {
		t.Logf("ctrl's database connection: Ssl_cipher %s", c)
	}
	plainEnv := ctrltest.Start(t, ctrltest.Options{DSN: dsn})
	if c := cipher(plainEnv); c != "" {
		t.Fatalf("ctrl without db.tls_ca: Ssl_cipher %q; want plaintext (otherwise this test cannot tell)", c)
	}

	cfg := ctrltest.Config(dsn)
	cfg.DB.TLSCA = path("other-ca.pem")
	srv, err := serve.Start(context.Background(), cfg, hclog.NewNullLogger(), serve.Deps{})
	if err == nil {
		_ = srv.Stop()
		t.Fatal("ctrl started with a db.tls_ca that did not sign the database's certificate")
	}
	if msg := err.Error(); !strings.Contains(msg, "db.tls_ca") || !strings.Contains(msg, "unknown authority") {
		t.Fatalf("ctrl with the wrong db.tls_ca: %v; want an error naming db.tls_ca and the unknown authority", err)
	}
	t.Logf("ctrl with the wrong db.tls_ca: %v", err)
}
