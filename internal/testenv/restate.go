package testenv

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mr-tron/base58"
	"krane.dev/sdk/envtest"
)

// Restate is a restate-server with its own base dir and ports. It signs
// its requests to the endpoints it calls with a key of its own (Restate's
// request identity): IdentityKey is the public key an endpoint checks.
type Restate struct {
	bin string
	dir string
	// identity is the request identity public key, publickeyv1_...
	identity string

	adminPort, ingressPort, nodePort int
	// name is the node name; config, when set, is the node's configuration
	// file (a node of a RestateCluster).
	name, config string
	keyFile      string
	// env is added to the server's environment (StartRestateTrusting).
	env []string

	mu   sync.Mutex
	proc *Process
}

var sharedRestate Shared[*Restate]

// SharedRestate returns the package's Restate server, starting it on first use.
func SharedRestate(tb testing.TB) *Restate {
	return sharedRestate.Get(tb, StartRestate)
}

// StartRestate starts a Restate server for this test package. Main stops it.
func StartRestate() (*Restate, error) { return startRestate(nil) }

// StartRestateTrusting starts a Restate server of its own that trusts the
// CA certificates in caFile (PEM) besides the system's, for endpoints
// served over TLS with a private CA: restate-server reads them from
// SSL_CERT_FILE. Main stops it.
func StartRestateTrusting(caFile string) (*Restate, error) {
	return startRestate([]string{"SSL_CERT_FILE=" + caFile})
}

func startRestate(env []string) (*Restate, error) {
	bin := RestateServerBin()
	if !isExecutable(bin) {
		return nil, &MissingBinaryError{Binary: "restate-server", Looked: bin, Fix: "run `make testenv` (installs @restatedev/restate-server@" + RestateVersion + " from the npm registry), or set RESTATE_SERVER_BIN"}
	}
	dir, err := SubDir("restate")
	if err != nil {
		return nil, err
	}
	ports, err := FreePorts(3)
	if err != nil {
		return nil, err
	}
	r := &Restate{bin: bin, dir: dir, adminPort: ports[0], ingressPort: ports[1], nodePort: ports[2], name: "n1", keyFile: filepath.Join(dir, identityKeyFile), env: env}
	if r.identity, err = writeIdentityKey(r.keyFile); err != nil {
		return nil, err
	}
	if err := r.Start(); err != nil {
		return nil, err
	}
	OnStop(r.Stop)
	return r, nil
}

// Start (re)starts the server on its base dir and ports; state survives.
func (r *Restate) Start() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.proc != nil && !r.proc.Exited() {
		return nil
	}
	if r.config != "" {
		return r.startNode()
	}
	env := []string{
		"RESTATE_LISTEN_MODE=tcp",
		fmt.Sprintf("RESTATE_ADMIN__BIND_ADDRESS=127.0.0.1:%d", r.adminPort),
		fmt.Sprintf("RESTATE_INGRESS__BIND_ADDRESS=127.0.0.1:%d", r.ingressPort),
		fmt.Sprintf("RESTATE_BIND_ADDRESS=127.0.0.1:%d", r.nodePort),
		fmt.Sprintf("RESTATE_ADVERTISED_ADDRESS=http://127.0.0.1:%d/", r.nodePort),
		"RESTATE_DEFAULT_NUM_PARTITIONS=4",
		"RESTATE_ROCKSDB_TOTAL_MEMORY_SIZE=256MB",
		"RESTATE_DISABLE_TELEMETRY=true",
		"RESTATE_LOG_DISABLE_ANSI_CODES=true",
		"RESTATE_WORKER__INVOKER__REQUEST_IDENTITY_PRIVATE_KEY_PEM_FILE=" + r.keyFile,
	}
	env = append(env, r.env...)
	p, err := StartProcess(r.dir, "restate-server", r.bin, []string{"--base-dir", r.dir, "--node-name", "n1", "--no-logo"}, env)
	if err != nil {
		return err
	}
	r.proc = p
	return p.WaitReady(60*time.Second, func(ctx context.Context) error {
		if err := httpOK(ctx, r.AdminURL()+"/health"); err != nil {
			return err
		}
		return httpOK(ctx, r.IngressURL()+"/restate/health")
	})
}

// Stop shuts the server down gracefully.
func (r *Restate) Stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.proc != nil {
		r.proc.Stop(10 * time.Second)
	}
}

// Kill stops the server with SIGKILL (a crash).
func (r *Restate) Kill() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.proc != nil {
		r.proc.Kill()
	}
}

// Pid is the server's process id.
func (r *Restate) Pid() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.proc == nil {
		return 0
	}
	return r.proc.Pid()
}

// IdentityKey is the public key (publickeyv1_...) the server signs its
// requests to endpoints with.
func (r *Restate) IdentityKey() string { return r.identity }

// identityKeyFile holds a server's request identity private key.
const identityKeyFile = "request-identity.pem"

// writeIdentityKey writes a new Ed25519 private key (PKCS#8 PEM, what
// restate-server reads) to path and returns its public key in the form an
// endpoint checks: publickeyv1_ and the key in base58.
func writeIdentityKey(path string) (string, error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return "", err
	}
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return "", err
	}
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		return "", fmt.Errorf("testenv: write Restate's request identity key: %w", err)
	}
	return "publickeyv1_" + base58.Encode(pub), nil
}

// AdminURL is the admin API's base URL.
func (r *Restate) AdminURL() string { return fmt.Sprintf("http://127.0.0.1:%d", r.adminPort) }

// IngressURL is the ingress base URL.
func (r *Restate) IngressURL() string { return fmt.Sprintf("http://127.0.0.1:%d", r.ingressPort) }

// Register registers (or, with force, re-discovers) an SDK endpoint.
func (r *Restate) Register(ctx context.Context, endpointURL string, force bool) error {
	body, _ := json.Marshal(map[string]any{"uri": endpointURL, "force": force})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.AdminURL()+"/deployments", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("content-type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("register %s with restate: %w", endpointURL, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		msg, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("register %s with restate: %s: %s", endpointURL, resp.Status, msg)
	}
	return nil
}

// Call invokes a handler through the ingress: path is "Service/handler" or
// "Object/key/handler". in and out are JSON-encoded.
func (r *Restate) Call(ctx context.Context, path string, in, out any, headers map[string]string) error {
	body, err := json.Marshal(in)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.IngressURL()+"/"+strings.TrimPrefix(path, "/"), bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("content-type", "application/json")
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("call %s: %s: %s", path, resp.Status, data)
	}
	if out != nil && len(data) > 0 {
		return json.Unmarshal(data, out)
	}
	return nil
}

// ServeH2C serves handler (e.g. a Restate SDK endpoint) with cleartext
// HTTP/2 on a free port until the test ends, and returns its URL.
func ServeH2C(tb testing.TB, handler http.Handler) string {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	var protocols http.Protocols
	protocols.SetUnencryptedHTTP2(true)
	protocols.SetHTTP1(true)
	srv := &http.Server{Handler: handler, Protocols: &protocols}
	go func() { _ = srv.Serve(l) }()
	tb.Cleanup(func() { _ = srv.Close() })
	return "http://" + l.Addr().String()
}

func httpOK(ctx context.Context, url string) error {
	return envtest.Probe(ctx, http.DefaultClient, url, "")
}
