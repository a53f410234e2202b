package restateendpoint

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/mr-tron/base58"
	"github.com/prometheus/client_golang/prometheus"
	restate "github.com/restatedev/sdk-go"
	"github.com/restatedev/sdk-go/server"
)

// Endpoint is the HTTP endpoint Restate calls to run ctrl's services: the
// SDK's handler served with cleartext HTTP/2 (h2c), which is what Restate
// speaks to a deployment, or HTTP/2 over TLS (EndpointOptions.TLS; Restate
// then calls an https:// URL and must trust the certificate's CA). With identity keys it answers only requests
// Restate signed with one of them (Restate's request identity: a JWT signed
// with the server's request-identity private key); anyone else gets 401,
// registration included. Without keys it answers whoever reaches its port.
type Endpoint struct {
	services []restate.ServiceDefinition
	srv      *http.Server
}

// EndpointOptions shape an Endpoint.
type EndpointOptions struct {
	Log hclog.Logger
	// IdentityKeys check requests (publickeyv1_...; none: no check).
	IdentityKeys []string
	// Base is the path the services are served under (Base(version):
	// "/v0.2"); empty serves them at the root.
	Base string
	// Registerer receives krane_ctrl_restate_misrouted_total.
	Registerer prometheus.Registerer
	// TLS, when set, serves HTTP/2 over TLS with it (its GetCertificate or
	// Certificates); nil serves cleartext HTTP/2 (h2c).
	TLS *tls.Config
}

// NewEndpoint builds the endpoint for services (see Services).
func NewEndpoint(services []restate.ServiceDefinition, o EndpointOptions) (*Endpoint, error) {
	log, identityKeys := o.Log, o.IdentityKeys
	if log == nil {
		log = hclog.NewNullLogger()
	}
	for _, k := range identityKeys {
		if err := CheckIdentityKey(k); err != nil {
			return nil, err
		}
	}
	r := server.NewRestate().WithLogger(slogHandler{log: log.Named("restate-sdk")}, true)
	if len(identityKeys) > 0 {
		r = r.WithIdentityV1(identityKeys...)
	}
	for _, s := range services {
		r = r.Bind(s)
	}
	h, err := r.Handler()
	if err != nil {
		return nil, fmt.Errorf("build the Restate endpoint: %w", err)
	}
	misrouted := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "krane_ctrl_restate_misrouted_total",
		Help: "Requests Restate sent this ctrl for the deployment of another ctrl line (by the path it asked for), refused unrun: that line's replicas must stay reachable until it is drained.",
	}, []string{"base"})
	if o.Registerer != nil {
		o.Registerer.MustRegister(misrouted)
	}
	var lastLog atomic.Int64
	handler := mount(o.Base, h, func(got string) {
		misrouted.WithLabelValues(got).Inc()
		if now := time.Now().Unix(); lastLog.Swap(now) < now-10 {
			log.Error("Restate called this ctrl for another line's deployment; refused, unrun (keep that line's replicas until `ctrl restate drain` says it is drained)", "serves", o.Base, "asked_for", got)
		}
	})
	var protocols http.Protocols
	protocols.SetHTTP1(true) // health checks and `curl /discover`
	if o.TLS != nil {
		protocols.SetHTTP2(true)
	} else {
		protocols.SetUnencryptedHTTP2(true)
	}
	return &Endpoint{services: services, srv: &http.Server{Handler: handler, Protocols: &protocols, TLSConfig: o.TLS}}, nil
}

// identityKeyPrefix starts a v1 request identity public key; the rest is
// the Ed25519 public key in base58.
const identityKeyPrefix = "publickeyv1_"

// CheckIdentityKey checks a request identity public key: publickeyv1_
// and the base58 of a 32-byte Ed25519 public key.
func CheckIdentityKey(k string) error {
	rest, ok := strings.CutPrefix(k, identityKeyPrefix)
	if !ok {
		return fmt.Errorf("request identity key %q does not start with %s", k, identityKeyPrefix)
	}
	b, err := base58.Decode(rest)
	if err != nil || len(b) != ed25519.PublicKeySize {
		return fmt.Errorf("request identity key %q is not %s and the base58 of a %d-byte Ed25519 public key", k, identityKeyPrefix, ed25519.PublicKeySize)
	}
	return nil
}

// IdentityKey is the request identity public key (publickeyv1_...) of an
// Ed25519 key, the form restate.identity_keys takes.
func IdentityKey(pub ed25519.PublicKey) string { return identityKeyPrefix + base58.Encode(pub) }

// IdentityKeyOfPEM is the request identity public key of the Ed25519
// private key in pemData (PKCS#8 PEM, the file restate-server's
// worker.invoker.request-identity-private-key-pem-file names).
func IdentityKeyOfPEM(pemData []byte) (string, error) {
	block, _ := pem.Decode(pemData)
	if block == nil || block.Type != "PRIVATE KEY" {
		return "", errors.New("not a PEM \"PRIVATE KEY\" block (PKCS#8), as `openssl genpkey -algorithm ed25519` writes")
	}
	key, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return "", fmt.Errorf("parse the PKCS#8 private key: %w", err)
	}
	priv, ok := key.(ed25519.PrivateKey)
	if !ok {
		return "", fmt.Errorf("the private key is a %T; Restate's request identity needs Ed25519", key)
	}
	return IdentityKey(priv.Public().(ed25519.PublicKey)), nil
}

// NewIdentityKeyPEM makes a new Ed25519 private key for Restate's request
// identity and returns it as PKCS#8 PEM, with its public key.
func NewIdentityKeyPEM() (pemData []byte, public string, err error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, "", err
	}
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return nil, "", err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), IdentityKey(pub), nil
}

// Handler is the endpoint's HTTP handler (to serve it elsewhere).
func (e *Endpoint) Handler() http.Handler { return e.srv.Handler }

// Services are the services the endpoint serves.
func (e *Endpoint) Services() []restate.ServiceDefinition { return e.services }

// Serve serves on lis until Shutdown.
func (e *Endpoint) Serve(lis net.Listener) error {
	serve := e.srv.Serve
	if e.srv.TLSConfig != nil {
		// The certificate comes from TLSConfig (GetCertificate), not files.
		serve = func(lis net.Listener) error { return e.srv.ServeTLS(lis, "", "") }
	}
	if err := serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("the Restate endpoint: %w", err)
	}
	return nil
}

// Shutdown stops the endpoint. Invocations in flight lose their stream;
// Restate retries them (at the same URL) once an endpoint serves again.
func (e *Endpoint) Shutdown(ctx context.Context) error {
	err := e.srv.Shutdown(ctx)
	if err != nil {
		_ = e.srv.Close()
	}
	return err
}

// EndpointURL is the URL Restate should call for an endpoint listening on
// addr (a "host:port"): its host, or this machine's hostname when it
// listens on every interface.
func EndpointURL(addr string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("endpoint address %q is not host:port: %w", addr, err)
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		h, err := os.Hostname()
		if err != nil {
			return "", fmt.Errorf("endpoint listens on every interface and the hostname is unknown (%v): set restate.endpoint.url", err)
		}
		host = h
	}
	return "http://" + net.JoinHostPort(host, port), nil
}

// slogHandler sends the SDK's slog records to ctrl's hclog logger.
type slogHandler struct {
	log   hclog.Logger
	attrs []any
}

func (h slogHandler) Enabled(_ context.Context, l slog.Level) bool {
	switch { // the levels Handle maps to
	case l >= slog.LevelWarn:
		return h.log.IsWarn()
	case l >= slog.LevelInfo:
		return h.log.IsDebug()
	}
	return h.log.IsTrace()
}

func (h slogHandler) Handle(_ context.Context, r slog.Record) error {
	args := append([]any(nil), h.attrs...)
	r.Attrs(func(a slog.Attr) bool {
		args = append(args, a.Key, a.Value.Any())
		return true
	})
	msg := r.Message
	switch {
	case r.Level >= slog.LevelError:
		// The SDK logs every retryable failure and every stream Restate
		// drops (a restart) as an error; Restate retries them, so they
		// are warnings here. Terminal problems surface in ctrl's own logs.
		h.log.Warn(msg, args...)
	case r.Level >= slog.LevelWarn:
		h.log.Warn(msg, args...)
	case r.Level >= slog.LevelInfo:
		h.log.Debug(msg, args...) // one line per invocation: debug
	default:
		h.log.Trace(msg, args...)
	}
	return nil
}

func (h slogHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	n := slogHandler{log: h.log, attrs: append([]any(nil), h.attrs...)}
	for _, a := range attrs {
		n.attrs = append(n.attrs, a.Key, a.Value.Any())
	}
	return n
}

func (h slogHandler) WithGroup(name string) slog.Handler {
	return slogHandler{log: h.log.Named(strings.ToLower(name)), attrs: h.attrs}
}
