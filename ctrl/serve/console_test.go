package serve_test

import (
	"crypto/tls"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"krane.dev/ctrl/internal/ctrltest"
	"krane.dev/ctrl/serve"
)

func TestConsoleConfigKeysAndValidation(t *testing.T) {
	t.Setenv("CTRL_CONSOLE_ADDR", "127.0.0.1:8080")
	cfg, err := serve.LoadConfig(nil)
	if err != nil {
		t.Fatal(err)
	}
	if !cfg.Console.Enabled() || cfg.Console.SessionTTL != 12*time.Hour || cfg.Console.SecureCookie {
		t.Fatalf("console config from CTRL_CONSOLE_ADDR: %+v", cfg.Console)
	}
	cfg.DB.DSN = "x"
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	cfg.Console.Addr, cfg.Console.TLSCert, cfg.Console.SessionTTL = "8080", "cert.pem", time.Second
	err = cfg.Validate()
	for _, want := range []string{`console.addr "8080" is not host:port`, "console.tls_cert and console.tls_key must be set together", "console.session_ttl 1s is out of range"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate = %v; want it to say %q", err, want)
		}
	}
	t.Setenv("CTRL_CONSOLE_ADDR", "")
	if cfg, err = serve.LoadConfig(nil); err != nil || cfg.Console.Enabled() {
		t.Fatalf("the console is on by default: %+v, %v", cfg.Console, err)
	}
}

// TestConsoleReachesTheAPIWhenGRPCNeedsMutualTLS: the console's calls go
// to ctrl's own gRPC server in process, so it works when the network
// listener demands client certificates it does not have; and the console
// itself can serve TLS (its cookie is then Secure).
func TestConsoleReachesTheAPIWhenGRPCNeedsMutualTLS(t *testing.T) {
	p := newPKI(t)
	env := ctrltest.Start(t, ctrltest.Options{Configure: func(c *serve.Config) {
		c.GRPC.TLSCert, c.GRPC.TLSKey, c.GRPC.ClientCA = p.serverCert, p.serverKey, p.caFile
		c.Console.Addr, c.Console.TLSCert, c.Console.TLSKey = "127.0.0.1:0", p.serverCert, p.serverKey
	}})
	base := env.Server.ConsoleURL()
	if !strings.HasPrefix(base, "https://") {
		t.Fatalf("console URL %q with console.tls_cert: want https", base)
	}
	jar, _ := cookiejar.New(nil)
	client := &http.Client{Jar: jar, Timeout: 30 * time.Second,
		Transport:     &http.Transport{TLSClientConfig: &tls.Config{RootCAs: p.pool}},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Get(base + "/login")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	m := regexp.MustCompile(`name="csrf" value="([^"]+)"`).FindSubmatch(body)
	if m == nil {
		t.Fatalf("/login: %s\n%s", resp.Status, body)
	}
	resp, err = client.PostForm(base+"/login", url.Values{"csrf": {string(m[1])}, "token": {env.OperatorToken(t, "tls")}})
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("sign-in through the console with mTLS on gRPC: %s\n%s", resp.Status, body)
	}
	var session *http.Cookie
	for _, c := range resp.Cookies() {
		if c.Name == "krane_console" {
			session = c
		}
	}
	if session == nil || !session.Secure {
		t.Fatalf("session cookie over TLS: %+v, want Secure", session)
	}
	resp, err = client.Get(base + "/fleet")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/fleet: %s", resp.Status)
	}
}
