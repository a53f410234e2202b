package e2e

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"krane.dev/ctrl/auth"
	"krane.dev/ctrl/serve"
	"krane.dev/host/agent"
	"krane.dev/host/config"
	"krane.dev/internal/testenv"
	"krane.dev/internal/testenv/kubeenv"
)

type pki struct{ dir string }

// issue writes a key pair signed by ca (self-signed when ca is nil).
func (p pki) issue(t *testing.T, name string, ca *x509.Certificate, caKey *ecdsa.PrivateKey, server bool) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, BasicConstraintsValid: true,
	}
	if ca == nil {
		tmpl.IsCA = true
		ca, caKey = tmpl, key
	} else if server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
	} else {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	kb, _ := x509.MarshalECPrivateKey(key)
	os.WriteFile(filepath.Join(p.dir, name+".crt"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	os.WriteFile(filepath.Join(p.dir, name+".key"), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600)
	return cert, key
}

func (p pki) path(name string) string { return filepath.Join(p.dir, name) }

// TestHostOverTLSAndMTLS: krane reaches ctrl over TLS, then over mTLS; a
// krane without a client certificate is refused by an mTLS ctrl, and a
// krane that does not trust ctrl's CA refuses ctrl.
func TestHostOverTLSAndMTLS(t *testing.T) {
	p := pki{dir: t.TempDir()}
	ca, caKey := p.issue(t, "ca", nil, nil, false)
	p.issue(t, "server", ca, caKey, true)
	p.issue(t, "client", ca, caKey, false)
	other, otherKey := p.issue(t, "other-ca", nil, nil, false)
	_, _ = other, otherKey

	for _, tc := range []struct {
		name       string
		mtls       bool
		clientCert bool
		trustCA    string
		wantSync   bool
		wantInLogs string
	}{
		{name: "tls", trustCA: "ca.crt", wantSync: true},
		{name: "mtls", mtls: true, clientCert: true, trustCA: "ca.crt", wantSync: true},
		{name: "mtls-without-client-cert", mtls: true, trustCA: "ca.crt", wantSync: false, wantInLogs: "watch stream ended"},
		{name: "untrusted-server", trustCA: "other-ca.crt", wantSync: false, wantInLogs: "certificate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := serve.LoadConfig(nil)
			if err != nil {
				t.Fatal(err)
			}
			cfg.DB.DSN = testenv.SharedMySQL(t).Database(t, "tls-"+tc.name)
			cfg.GRPC.Addr, cfg.HTTP.Addr = "127.0.0.1:0", "127.0.0.1:0"
			cfg.GRPC.TLSCert, cfg.GRPC.TLSKey = p.path("server.crt"), p.path("server.key")
			if tc.mtls {
				cfg.GRPC.ClientCA = p.path("ca.crt")
			}
			cfg.Log.Level, cfg.Log.Format = "warn", "text"
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			srv, err := serve.Start(ctx, cfg, hclog.NewNullLogger(), serve.Deps{})
			if err != nil {
				t.Fatal(err)
			}
			token, err := auth.RegisterCluster(ctx, srv.Store(), "eu", "eu-1")
			if err != nil {
				t.Fatal(err)
			}
			ns := "tls-" + tc.name
			cluster := kubeenv.Shared(t)
			if err := cluster.EnsureNamespace(ctx, ns); err != nil {
				t.Fatal(err)
			}
			putConfigMap(t, srv.Store(), "eu", "r-"+tc.name, ns, "cm", "over-tls", false)

			plugin := testenv.Build(t, "krane.dev/sdk/examples/configmap", "krane-plugin-configmap")
			client := ""
			if tc.clientCert {
				client = fmt.Sprintf("client_cert_file = %q\n  client_key_file = %q", p.path("client.crt"), p.path("client.key"))
			}
			hcl := fmt.Sprintf(`region = "eu"
cluster_id = "eu-1"
control_plane {
  url = "https://%s"
  token = %q
  ca_file = %q
  %s
}
kubernetes {
  kubeconfig = %q
  # The test's admin credentials serve the plugins too.
  plugin_identities { enabled = false }
}
sync {
  reconnect_min = "100ms"
  reconnect_max = "200ms"
}
plugin_dir = %q
controller "configmap" {
  config { allowed_namespaces = [%q] }
}`, srv.GRPCAddr(), token, p.path(tc.trustCA), client, cluster.Kubeconfig, filepath.Dir(plugin), ns)
			path := filepath.Join(t.TempDir(), "krane.hcl")
			os.WriteFile(path, []byte(hcl), 0o600)
			kcfg, err := config.Load(path, []string{})
			if err != nil {
				t.Fatal(err)
			}
			logs := &lineWriter{t: t}
			a := agent.New(kcfg, hclog.New(&hclog.LoggerOptions{Level: hclog.Info, Output: logs}), agent.Options{})
			actx, acancel := context.WithCancel(ctx)
			done := make(chan struct{})
			go func() { defer close(done); _ = a.Run(actx) }()
			defer func() { acancel(); <-done }()

			synced := func() error {
				cm, err := cluster.Client.CoreV1().ConfigMaps(ns).Get(ctx, "cm", metav1.GetOptions{})
				if err != nil {
					return err
				}
				if cm.Data["v"] != "over-tls" {
					return fmt.Errorf("data %v", cm.Data)
				}
				return nil
			}
			if tc.wantSync {
				waitFor(t, 30*time.Second, "sync over "+tc.name, synced)
				return
			}
			// Wait for the refusal itself (a plugin starts first, slowly on a
			// loaded machine); by then a sync would have had to pass it.
			waitFor(t, 2*time.Minute, "the host's logs to explain the refusal", func() error {
				if !strings.Contains(logs.String(), tc.wantInLogs) {
					return fmt.Errorf("want %q in:\n%s", tc.wantInLogs, logs.String())
				}
				return nil
			})
			if synced() == nil {
				t.Fatalf("%s: krane synced although the connection should have been refused", tc.name)
			}
		})
	}
}
