package serve_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/spf13/pflag"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"

	"krane.dev/ctrl/internal/ctrltest"
	"krane.dev/ctrl/restateendpoint"
	"krane.dev/ctrl/serve"
	"krane.dev/internal/testenv"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func TestConfigPrecedenceFileEnvFlags(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "ctrl.yaml")
	if err := os.WriteFile(file, []byte("db:\n  dsn: from-file\n  max_open_conns: 7\nwatch:\n  page_size: 100\n  keepalive: 3s\ngrpc:\n  addr: ':1111'\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("CTRL_CONFIG", file)
	t.Setenv("CTRL_WATCH_PAGE_SIZE", "200")
	t.Setenv("CTRL_GRPC_ADDR", ":2222")
	t.Setenv("CTRL_UNRELATED_THING", "ignored")
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	serve.AddConfigFlag(fs)
	serve.AddFlags(fs, nil)
	if err := fs.Parse([]string{"--grpc-addr", ":3333", "--watch-poll-interval", "20ms"}); err != nil {
		t.Fatal(err)
	}
	cfg, err := serve.LoadConfig(fs)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.DB.DSN != "from-file" || cfg.DB.MaxOpenConns != 7 || cfg.Watch.KeepAlive != 3*time.Second || // file over defaults
		cfg.Watch.PageSize != 200 || // env over file
		cfg.GRPC.Addr != ":3333" || cfg.Watch.PollInterval != 20*time.Millisecond || // flags over env
		cfg.HTTP.Addr != ":9090" || !cfg.Migrate.OnStart || cfg.DB.MaxIdleConns != 0 || cfg.DB.MaxWriteBatch != 64 { // defaults
		t.Fatalf("merged config %+v", cfg)
	}

	if err := os.WriteFile(file, []byte("db:\n  dsn: x\nwatch:\n  pagesize: 3\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := serve.LoadConfig(fs); err == nil || !strings.Contains(err.Error(), "unknown keys watch.pagesize") || !strings.Contains(err.Error(), file) {
		t.Fatalf("a typo in the file: %v; want an error naming the file and the key", err)
	}
	bad := serve.Config{Watch: serve.WatchConfig{PageSize: 1}, Log: serve.LogConfig{Level: "info", Format: "json"}, GRPC: serve.GRPCConfig{TLSCert: "c"}}
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "db.dsn is required") || !strings.Contains(err.Error(), "tls_key must be set together") {
		t.Fatalf("Validate = %v", err)
	}
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

func TestHealthReadinessAndMetrics(t *testing.T) {
	env := ctrltest.Start(t, ctrltest.Options{})
	base := "http://" + env.Server.HTTPAddr()
	if code, body := get(t, base+"/healthz"); code != 200 || body != "ok\n" {
		t.Fatalf("/healthz = %d %q", code, body)
	}
	if code, body := get(t, base+"/readyz"); code != 200 {
		t.Fatalf("/readyz = %d %q", code, body)
	}
	// Touch the metrics with one stream.
	cli := env.Cluster(t, env.ClusterToken(t, "eu", "eu-1"))
	s, err := cli.ListDesired(context.Background(), &clusterv1.ListDesiredRequest{Kind: "deployment"})
	if err != nil {
		t.Fatal(err)
	}
	if ev, err := s.Recv(); err != nil || ev.GetBootstrapComplete() == nil {
		t.Fatalf("ListDesired on an empty region: %v, %v", ev, err)
	}
	_, body := get(t, base+"/metrics")
	for _, want := range []string{`krane_ctrl_watch_query_seconds_count{kind="deployment",phase="bootstrap"} 1`, "krane_ctrl_watch_streams_active", "go_goroutines"} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}

	// Profiles are off unless http.pprof turns them on.
	if code, _ := get(t, base+"/debug/pprof/"); code != http.StatusNotFound {
		t.Fatalf("/debug/pprof/ with http.pprof off = %d, want 404", code)
	}
	profiled := ctrltest.Start(t, ctrltest.Options{Configure: func(c *serve.Config) { c.HTTP.Pprof = true }})
	pbase := "http://" + profiled.Server.HTTPAddr()
	if code, body := get(t, pbase+"/debug/pprof/goroutine?debug=1"); code != 200 || !strings.Contains(body, "goroutine profile: total") {
		t.Fatalf("/debug/pprof/goroutine with http.pprof on = %d %.80q", code, body)
	}
	if code, body := get(t, pbase+"/debug/pprof/mutex?debug=1"); code != 200 || !strings.Contains(body, "sampling period=100") {
		t.Fatalf("/debug/pprof/mutex with http.pprof on = %d %.80q; want mutex sampling on", code, body)
	}

	// A second ctrl on a database that was never migrated is alive but not ready.
	dsn := testenv.SharedMySQL(t).Database(t, t.Name()+"_empty")
	notMigrated := ctrltest.Start(t, ctrltest.Options{DSN: dsn, Configure: func(c *serve.Config) { c.Migrate.OnStart = false }})
	base = "http://" + notMigrated.Server.HTTPAddr()
	if code, _ := get(t, base+"/healthz"); code != 200 {
		t.Fatalf("/healthz of the unmigrated ctrl = %d", code)
	}
	if code, body := get(t, base+"/readyz"); code != 503 || !strings.Contains(body, "ctrl admin migrate") {
		t.Fatalf("/readyz of the unmigrated ctrl = %d %q; want 503 naming `ctrl admin migrate`", code, body)
	}
}

// pki writes a CA, a server certificate for 127.0.0.1 and a client
// certificate, and returns their paths and the CA pool.
type pki struct {
	caFile, serverCert, serverKey string
	client                        tls.Certificate
	pool                          *x509.CertPool
}

func newPKI(t *testing.T) pki {
	t.Helper()
	dir := t.TempDir()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test ca"}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), IsCA: true, KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	issue := func(name string, usage x509.ExtKeyUsage) ([]byte, []byte) {
		key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name}, NotBefore: time.Now().Add(-time.Hour),
			NotAfter: time.Now().Add(time.Hour), ExtKeyUsage: []x509.ExtKeyUsage{usage}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		keyDER, _ := x509.MarshalECPrivateKey(key)
		return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
	}
	p := pki{caFile: filepath.Join(dir, "ca.pem"), serverCert: filepath.Join(dir, "server.pem"), serverKey: filepath.Join(dir, "server-key.pem"), pool: x509.NewCertPool()}
	p.pool.AddCert(ca)
	os.WriteFile(p.caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o600)
	cert, key := issue("ctrl", x509.ExtKeyUsageServerAuth)
	os.WriteFile(p.serverCert, cert, 0o600)
	os.WriteFile(p.serverKey, key, 0o600)
	cc, ck := issue("krane-eu-1", x509.ExtKeyUsageClientAuth)
	p.client, err = tls.X509KeyPair(cc, ck)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestTLSAndMutualTLS(t *testing.T) {
	p := newPKI(t)
	env := ctrltest.Start(t, ctrltest.Options{Configure: func(c *serve.Config) {
		c.GRPC.TLSCert, c.GRPC.TLSKey, c.GRPC.ClientCA = p.serverCert, p.serverKey, p.caFile
	}})
	token := env.ClusterToken(t, "eu", "eu-1")
	call := func(conf *tls.Config) error {
		conn, err := grpc.NewClient(env.Server.GRPCAddr(), grpc.WithTransportCredentials(credentials.NewTLS(conf)))
		if err != nil {
			return err
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
		_, err = clusterv1.NewClusterServiceClient(conn).Heartbeat(ctx, &clusterv1.HeartbeatRequest{AgentVersion: "tls-test"})
		return err
	}
	if err := call(&tls.Config{RootCAs: p.pool, Certificates: []tls.Certificate{p.client}}); err != nil {
		t.Fatalf("mTLS call with a client certificate: %v", err)
	}
	if err := call(&tls.Config{RootCAs: p.pool}); err == nil {
		t.Fatal("mTLS server accepted a client without a certificate")
	}
	// Plaintext against a TLS server fails.
	conn := ctrltest.Dial(t, env.Server.GRPCAddr(), token)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if _, err := clusterv1.NewClusterServiceClient(conn).Heartbeat(ctx, &clusterv1.HeartbeatRequest{}); err == nil {
		t.Fatal("plaintext call to a TLS server succeeded")
	}
}

func TestStartRejectsBadTLSFilesClearly(t *testing.T) {
	dsn := testenv.SharedMySQL(t).Database(t, t.Name())
	cfg := ctrltest.Config(dsn)
	cfg.GRPC.TLSCert, cfg.GRPC.TLSKey = "/nonexistent/cert.pem", "/nonexistent/key.pem"
	_, err := serve.Start(context.Background(), cfg, hclog.NewNullLogger(), serve.Deps{})
	if err == nil || !strings.Contains(err.Error(), "/nonexistent/cert.pem") {
		t.Fatalf("Start with missing TLS files: %v; want an error naming the file", err)
	}
}

// identityKey is a well-formed request identity public key.
var identityKey = restateendpoint.IdentityKey(make([]byte, 32))

func TestRestateConfigKeysAndValidation(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "ctrl.yaml")
	yaml := "db:\n  dsn: x\nrestate:\n  ingress_url: http://restate:8080\n  admin_url: http://restate:9070\n  endpoint:\n    url: http://ctrl-0.ctrl:9080\n" +
		"  identity_keys: " + identityKey + "\nsentinel:\n  default_image: registry.example.com/sentinel:1\n"
	if err := os.WriteFile(file, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("CTRL_CONFIG", file)
	t.Setenv("CTRL_RESTATE_ENDPOINT_LISTEN", "127.0.0.1:9999")
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	serve.AddConfigFlag(fs)
	serve.AddFlags(fs, nil)
	if err := fs.Parse([]string{"--deploy-timeout", "90s", "--sentinel-default-replicas", "3"}); err != nil {
		t.Fatal(err)
	}
	cfg, err := serve.LoadConfig(fs)
	if err != nil {
		t.Fatal(err)
	}
	r := cfg.Restate
	if !r.Enabled() || r.IngressURL != "http://restate:8080" || r.AdminURL != "http://restate:9070" || r.Endpoint.URL != "http://ctrl-0.ctrl:9080" ||
		r.Endpoint.Listen != "127.0.0.1:9999" || !r.RegisterOnStart || cfg.Deploy.Timeout != 90*time.Second || cfg.Deploy.ResyncInterval != 30*time.Second ||
		cfg.Sentinel.DefaultImage != "registry.example.com/sentinel:1" || cfg.Sentinel.DefaultReplicas != 3 || cfg.Sentinel.DefaultCPUMillicores != 250 {
		t.Fatalf("restate config %+v deploy %+v sentinel %+v", r, cfg.Deploy, cfg.Sentinel)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	// Unset, the sentinel image is this build's krane-sentinel.
	if f := fs.Lookup("sentinel-default-image"); f == nil || f.DefValue != "krane-sentinel:dev" {
		t.Fatalf("flag --sentinel-default-image %+v, want the default krane-sentinel:dev for a development build", f)
	}
	cfg.Restate.AdminURL, cfg.Sentinel.DefaultImage, cfg.Restate.IngressURL = "", "", "restate:8080"
	err = cfg.Validate()
	for _, want := range []string{"restate.ingress_url \"restate:8080\" is not an http", "restate.register_on_start needs restate.admin_url", "sentinel.default_image is empty"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate = %v; want it to say %q", err, want)
		}
	}
	// Restate's request identity: required, and well formed.
	cfg.Restate.AdminURL, cfg.Sentinel.DefaultImage, cfg.Restate.IngressURL = "http://restate:9070", "registry.example.com/sentinel:1", "http://restate:8080"
	if got := cfg.Restate.IdentityKeyList(); len(got) != 1 || got[0] != identityKey {
		t.Fatalf("identity keys %v, want [%s]", got, identityKey)
	}
	cfg.Restate.IdentityKeys = ""
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "restate.identity_keys is required") {
		t.Errorf("Validate without identity keys = %v; want restate.identity_keys required", err)
	}
	cfg.Restate.AllowUnsigned = true
	if err := cfg.Validate(); err != nil {
		t.Errorf("Validate without identity keys but restate.allow_unsigned: %v", err)
	}
	cfg.Restate.IdentityKeys = identityKey + ", publickeyv1_nope"
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "publickeyv1_nope") {
		t.Errorf("Validate with a malformed identity key = %v; want it named", err)
	}
	// deploy.live_cluster_within: 2m by default, 0 (off) or 1m..24h.
	cfg.Restate.IdentityKeys = identityKey
	if cfg.Deploy.LiveClusterWithin != 2*time.Minute {
		t.Errorf("deploy.live_cluster_within defaults to %s, want 2m", cfg.Deploy.LiveClusterWithin)
	}
	for _, w := range []time.Duration{0, time.Minute, 24 * time.Hour} {
		cfg.Deploy.LiveClusterWithin = w
		if err := cfg.Validate(); err != nil {
			t.Errorf("deploy.live_cluster_within %s: %v", w, err)
		}
	}
	cfg.Deploy.LiveClusterWithin = 20 * time.Second
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "deploy.live_cluster_within 20s is out of range") {
		t.Errorf("Validate with deploy.live_cluster_within 20s = %v; want it refused", err)
	}
	cfg.Deploy.LiveClusterWithin = 2 * time.Minute
	// Without an ingress URL, Restate is off and needs nothing.
	cfg.Restate.IngressURL, cfg.Restate.AdminURL = "", ""
	if err := cfg.Validate(); err != nil {
		t.Fatalf("Restate off: %v", err)
	}
}

func TestAuthRevocationPollIntervalIsValidated(t *testing.T) {
	cfg, err := serve.LoadConfig(nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Auth.RevocationPollInterval != 250*time.Millisecond || cfg.Auth.RecheckInterval != time.Minute {
		t.Fatalf("auth defaults: poll %s, recheck %s; want 250ms and 1m", cfg.Auth.RevocationPollInterval, cfg.Auth.RecheckInterval)
	}
	cfg.DB.DSN = "x"
	if err := cfg.Validate(); err != nil {
		t.Fatalf("defaults do not validate: %v", err)
	}
	for _, v := range []string{"5ms", "2m", "0s"} {
		t.Setenv("CTRL_AUTH_REVOCATION_POLL_INTERVAL", v)
		cfg, err := serve.LoadConfig(nil)
		if err != nil {
			t.Fatal(err)
		}
		cfg.DB.DSN = "x"
		err = cfg.Validate()
		if err == nil || !strings.Contains(err.Error(), "auth.revocation_poll_interval") || !strings.Contains(err.Error(), "out of range 10ms..1m") {
			t.Errorf("revocation poll interval %s: %v; want an error naming the key and its range", v, err)
		}
	}
	t.Setenv("CTRL_AUTH_REVOCATION_POLL_INTERVAL", "10ms")
	cfg, _ = serve.LoadConfig(nil)
	cfg.DB.DSN = "x"
	if err := cfg.Validate(); err != nil || cfg.Auth.RevocationPollInterval != 10*time.Millisecond {
		t.Fatalf("10ms: %s, %v", cfg.Auth.RevocationPollInterval, err)
	}
	cfg.Auth.RecheckInterval = 500 * time.Millisecond
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "auth.recheck_interval") {
		t.Fatalf("recheck 500ms: %v; want an error", err)
	}
}

// TestSchemaPastThisReleaseIsNotServed: a replica of an older release
// that finds the schema past what it can serve (a newer release applied a
// contract step that needs ctrl v0.3 or later, and migrations it does not
// know) goes unready with a reason naming both versions, logs it once,
// and serves again when the requirement is one it meets. Migrations of a
// newer release alone (expand steps) leave it ready.
func TestSchemaPastThisReleaseIsNotServed(t *testing.T) {
	env := ctrltest.Start(t, ctrltest.Options{Deps: serve.Deps{Version: "v0.2.4"}})
	base := "http://" + env.Server.HTTPAddr()
	db := env.Store.DB()
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, "INSERT INTO goose_db_version (version_id, is_applied) VALUES (99001, 1)"); err != nil {
		t.Fatal(err)
	}
	if code, body := get(t, base+"/readyz"); code != 200 {
		t.Fatalf("/readyz with an expand step of a newer release applied = %d %q; want ready", code, body)
	}
	if _, err := db.ExecContext(ctx, "INSERT INTO goose_db_version (version_id, is_applied) VALUES (99002, 1)"); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, "INSERT INTO schema_requirements (migration, min_ctrl, recorded_at) VALUES (99002, 'v0.3', 1)"); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		code, body := get(t, base+"/readyz")
		if code != 503 {
			t.Fatalf("/readyz past what v0.2.4 serves = %d %q; want 503", code, body)
		}
		for _, want := range []string{"v0.2.4", "99002", "v0.3 or later"} {
			if !strings.Contains(body, want) {
				t.Errorf("/readyz says %q, which does not name %q", body, want)
			}
		}
	}
	if n := strings.Count(env.Logs.String(), "the database schema is past what this ctrl (v0.2.4) can serve"); n != 1 {
		t.Errorf("the reason was logged %d times over two probes; want once", n)
	}
	if _, err := db.ExecContext(ctx, "UPDATE schema_requirements SET min_ctrl = 'v0.2' WHERE migration = 99002"); err != nil {
		t.Fatal(err)
	}
	if code, body := get(t, base+"/readyz"); code != 200 {
		t.Fatalf("/readyz once the requirement is v0.2 = %d %q; want ready", code, body)
	}
	if !strings.Contains(env.Logs.String(), "serves the database schema again") {
		t.Error("serving again was not logged")
	}
}
