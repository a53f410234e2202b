package workflows

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"

	"github.com/hashicorp/go-hclog"
	restate "github.com/restatedev/sdk-go"
	"github.com/restatedev/sdk-go/server"
)

// Endpoint is the HTTP endpoint Restate calls to run ctrl's services: the
// SDK's handler served with cleartext HTTP/2 (h2c), which is what Restate
// speaks to a deployment. The SDK does not check who calls; keep the port
// on a network only Restate reaches.
type Endpoint struct {
	services []restate.ServiceDefinition
	srv      *http.Server
}

// NewEndpoint builds the endpoint for services (see Services).
func NewEndpoint(services []restate.ServiceDefinition, log hclog.Logger) (*Endpoint, error) {
	if log == nil {
		log = hclog.NewNullLogger()
	}
	r := server.NewRestate().WithLogger(slogHandler{log: log.Named("restate-sdk")}, true)
	for _, s := range services {
		r = r.Bind(s)
	}
	h, err := r.Handler()
	if err != nil {
		return nil, fmt.Errorf("build the Restate endpoint: %w", err)
	}
	var protocols http.Protocols
	protocols.SetUnencryptedHTTP2(true)
	protocols.SetHTTP1(true) // health checks and `curl /discover`
	return &Endpoint{services: services, srv: &http.Server{Handler: h, Protocols: &protocols}}, nil
}

// Handler is the endpoint's HTTP handler (to serve it elsewhere).
func (e *Endpoint) Handler() http.Handler { return e.srv.Handler }

// Services are the services the endpoint serves.
func (e *Endpoint) Services() []restate.ServiceDefinition { return e.services }

// Serve serves on lis until Shutdown.
func (e *Endpoint) Serve(lis net.Listener) error {
	if err := e.srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
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
