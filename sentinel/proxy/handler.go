package proxy

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strings"
	"time"
)

// Probe paths on the data port. They answer for any Host (a kubelet probes
// by pod IP), so they shadow these two paths of every routed host.
const (
	PathLive  = "/_krane/sentinel/live"
	PathReady = "/_krane/sentinel/ready"
	// PathHealth is the design notes' health path, which the sentinel
	// plugin probes by default (liveness_path, readiness_path): the same
	// as PathReady, so an install that never set the paths keeps working.
	PathHealth = "/_unkey/internal/health"
)

// StatusClientClosed is logged (never sent) when the client went away
// before a response, as nginx does.
const StatusClientClosed = 499

func (rt *Router) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	if (strings.HasPrefix(r.URL.Path, "/_krane/sentinel/") || r.URL.Path == PathHealth) && rt.probe(w, r) {
		return
	}
	sw := &statusWriter{ResponseWriter: w}
	t := rt.table.Load()
	var bm *backendMetrics = rt.none
	dep := ""
	switch host, ok := NormalizeHost(r.Host); {
	case t == nil:
		plain(sw, http.StatusServiceUnavailable, "routes not loaded yet\n")
	case !ok || !t.hasHost(host):
		plain(sw, http.StatusMisdirectedRequest, "this sentinel does not serve host "+quoteHost(r.Host)+"\n")
	case t.backend == nil:
		plain(sw, http.StatusServiceUnavailable, "environment "+rt.opts.EnvironmentID+" has no live deployment\n")
	default:
		b := t.backend
		bm, dep = b.m, b.spec.DeploymentID
		if r.ContentLength > rt.opts.MaxBodyBytes {
			plain(sw, http.StatusRequestEntityTooLarge, "request body larger than the limit of this sentinel\n")
			break
		}
		if r.Body != nil && r.Body != http.NoBody {
			r.Body = http.MaxBytesReader(w, r.Body, rt.opts.MaxBodyBytes)
		}
		b.pool.active.Add(1)
		b.proxy.ServeHTTP(sw, r)
		b.pool.active.Add(-1)
	}
	status := sw.status
	if status == 0 {
		status = http.StatusOK
	}
	d := time.Since(start)
	bm.code(status).Inc()
	rt.metrics.duration.Observe(d.Seconds())
	if rt.opts.AccessLog {
		rt.log.Info("request", "method", r.Method, "host", r.Host, "path", r.URL.Path, "status", status,
			"bytes", sw.bytes, "duration", d, "remote", r.RemoteAddr, "deployment", dep)
	}
}

func (t *table) hasHost(h string) bool {
	_, ok := t.hosts[h]
	return ok
}

// probe answers the liveness and readiness paths; false means the path is
// none of them and the request is routed as any other.
func (rt *Router) probe(w http.ResponseWriter, r *http.Request) bool {
	switch r.URL.Path {
	case PathLive:
		plain(w, http.StatusOK, "ok\n")
	case PathReady, PathHealth:
		if ok, why := rt.Ready(); ok {
			plain(w, http.StatusOK, "ok\n")
		} else {
			plain(w, http.StatusServiceUnavailable, why+"\n")
		}
	default:
		return false
	}
	return true
}

// errorHandler turns a failure on the way to an instance into a response
// with a plain-text reason, and counts it.
func (rt *Router) errorHandler(b *Backend) func(http.ResponseWriter, *http.Request, error) {
	return func(w http.ResponseWriter, r *http.Request, err error) {
		var (
			ni *noInstanceError
			de *dialError
			mb *http.MaxBytesError
			ne net.Error
		)
		switch {
		case errors.As(err, &mb):
			plain(w, http.StatusRequestEntityTooLarge, "request body larger than the limit of this sentinel\n")
		case r.Context().Err() != nil:
			// The client is gone; nobody reads this.
			if sw, ok := w.(*statusWriter); ok {
				sw.status = StatusClientClosed
			}
		case errors.As(err, &ni):
			b.m.noInstance.Inc()
			plain(w, http.StatusServiceUnavailable, ni.reason)
		case errors.As(err, &de):
			// Connect failures were counted per attempt by the transport.
			plain(w, http.StatusBadGateway, "could not connect to any instance of deployment "+b.spec.DeploymentID+": "+de.Error()+"\n")
		case errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()):
			b.m.timeout.Inc()
			plain(w, http.StatusGatewayTimeout, "instance of deployment "+b.spec.DeploymentID+" did not answer in time\n")
		default:
			b.m.other.Inc()
			rt.log.Warn("upstream error", "deployment", b.spec.DeploymentID, "error", err)
			plain(w, http.StatusBadGateway, "error from instance of deployment "+b.spec.DeploymentID+"\n")
		}
	}
}

func plain(w http.ResponseWriter, code int, msg string) {
	h := w.Header()
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	_, _ = w.Write([]byte(msg))
}

// quoteHost bounds and sanitizes a client-supplied host for an error body.
func quoteHost(h string) string {
	if len(h) > 64 {
		h = h[:64] + "..."
	}
	b := make([]byte, 0, len(h)+2)
	b = append(b, '"')
	for i := 0; i < len(h); i++ {
		if c := h[i]; c >= 0x20 && c < 0x7f && c != '"' && c != '\\' {
			b = append(b, c)
		} else {
			b = append(b, '?')
		}
	}
	return string(append(b, '"'))
}

// statusWriter records the status and size of a response. Unwrap lets
// http.ResponseController (used by the reverse proxy to flush and to hijack
// for upgrades) reach the server's writer.
type statusWriter struct {
	http.ResponseWriter
	status int
	bytes  int64
}

func (s *statusWriter) WriteHeader(code int) {
	if s.status == 0 || s.status < 200 {
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusWriter) Write(p []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	n, err := s.ResponseWriter.Write(p)
	s.bytes += int64(n)
	return n, err
}

func (s *statusWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }
