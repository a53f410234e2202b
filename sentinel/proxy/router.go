package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"

	"krane.dev/sentinel/routes"
)

// Options configure a Router. Zero values take the defaults below.
type Options struct {
	SentinelID    string
	EnvironmentID string
	Region        string

	// MaxBodyBytes bounds a request body (413 beyond it). Default 32 MiB.
	MaxBodyBytes int64
	// DialTimeout bounds a connect to an instance. Default 2s: instances
	// are in the same cluster, a slower connect means a sick instance.
	DialTimeout time.Duration
	// ResponseHeaderTimeout bounds the wait for an instance's response
	// headers after the request was written. Default 60s.
	ResponseHeaderTimeout time.Duration
	// IdleConnTimeout closes idle upstream connections. Default 90s.
	IdleConnTimeout time.Duration
	// MaxIdleConnsPerHost is the keep-alive pool per instance. Default 256.
	MaxIdleConnsPerHost int
	// TrustedProxies are the peers whose X-Forwarded-* headers are kept.
	TrustedProxies []netip.Prefix
	// AccessLog writes one line per request.
	AccessLog bool

	Logger   hclog.Logger
	Registry prometheus.Registerer
}

func (o *Options) defaults() {
	if o.MaxBodyBytes == 0 {
		o.MaxBodyBytes = 32 << 20
	}
	if o.DialTimeout == 0 {
		o.DialTimeout = 2 * time.Second
	}
	if o.ResponseHeaderTimeout == 0 {
		o.ResponseHeaderTimeout = 60 * time.Second
	}
	if o.IdleConnTimeout == 0 {
		o.IdleConnTimeout = 90 * time.Second
	}
	if o.MaxIdleConnsPerHost == 0 {
		o.MaxIdleConnsPerHost = 256
	}
	if o.Logger == nil {
		o.Logger = hclog.NewNullLogger()
	}
	if o.Registry == nil {
		o.Registry = prometheus.NewRegistry()
	}
}

// Router routes requests by the current table. It is an http.Handler.
type Router struct {
	opts      Options
	log       hclog.Logger
	transport *http.Transport
	metrics   *metrics
	errLog    *log.Logger
	buffers   bufferPool

	table    atomic.Pointer[table]
	draining atomic.Bool
	// none are the series of requests no deployment served (421, 503
	// without routes).
	none *backendMetrics
}

// table is one version of the routes, immutable once published.
type table struct {
	routes  *routes.Routes
	hosts   map[string]struct{}
	backend *Backend
}

// NewRouter returns a router without routes: it answers 503 until Apply.
func NewRouter(opts Options) (*Router, error) {
	opts.defaults()
	m, err := newMetrics(opts.Registry, opts.EnvironmentID)
	if err != nil {
		return nil, fmt.Errorf("sentinel: register metrics: %w", err)
	}
	dialer := &net.Dialer{Timeout: opts.DialTimeout, KeepAlive: 30 * time.Second}
	rt := &Router{opts: opts, log: opts.Logger, metrics: m}
	rt.transport = &http.Transport{
		// Never an environment proxy: instances are reached directly.
		Proxy: nil,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := dialer.DialContext(ctx, network, addr)
			if err != nil {
				return nil, &dialError{addr: addr, err: err}
			}
			return c, nil
		},
		MaxIdleConns:          opts.MaxIdleConnsPerHost * 4,
		MaxIdleConnsPerHost:   opts.MaxIdleConnsPerHost,
		IdleConnTimeout:       opts.IdleConnTimeout,
		ResponseHeaderTimeout: opts.ResponseHeaderTimeout,
		ExpectContinueTimeout: time.Second,
		// Pass the client's Accept-Encoding through untouched.
		DisableCompression: true,
	}
	rt.errLog = opts.Logger.Named("reverseproxy").StandardLogger(&hclog.StandardLoggerOptions{InferLevels: true})
	rt.none = m.forDeployment("")
	m.ready.Set(0)
	return rt, nil
}

// Close releases idle upstream connections.
func (rt *Router) Close() { rt.transport.CloseIdleConnections() }

// Backend is one deployment requests can go to: its pool of instances and
// the reverse proxy bound to it.
type Backend struct {
	spec    routes.Backend
	pool    *Pool
	proxy   *httputil.ReverseProxy
	m       *backendMetrics
	reason  string // the 503 body when no instance is ready
	retired atomic.Bool
}

// NewBackend prepares a backend; it serves nothing until Apply publishes it.
// Feed it instances with SetInstances before (readiness waits for that).
func (rt *Router) NewBackend(spec routes.Backend) *Backend {
	b := &Backend{spec: spec, pool: NewPool(), m: rt.metrics.forDeployment(spec.DeploymentID)}
	b.reason = fmt.Sprintf("no ready instance of deployment %s in region %s\n", spec.DeploymentID, rt.opts.Region)
	b.proxy = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme = "http"
			// The transport sets the instance; Host stays the client's.
			pr.Out.URL.Host = spec.Service
			forwarded(pr, rt.opts.TrustedProxies)
		},
		Transport:    &backendTransport{rt: rt, b: b},
		BufferPool:   &rt.buffers,
		ErrorHandler: rt.errorHandler(b),
		ErrorLog:     rt.errLog,
	}
	return b
}

// Spec is the backend as the routes named it.
func (b *Backend) Spec() routes.Backend { return b.spec }

// Pool is the backend's instances.
func (b *Backend) Pool() *Pool { return b.pool }

// SetInstances replaces the backend's ready instances (host:port each).
func (b *Backend) SetInstances(addrs []string) {
	b.pool.SetInstances(addrs)
	if !b.retired.Load() {
		b.m.instancesReady.Set(float64(b.pool.Ready()))
	}
}

// Apply publishes routes served by backend b (nil when the routes have no
// backend). Requests that already picked the previous backend finish on it.
func (rt *Router) Apply(r *routes.Routes, b *Backend) error {
	if (r.Backend == nil) != (b == nil) {
		return errors.New("sentinel: routes and backend disagree on whether there is a backend")
	}
	t := &table{routes: r, hosts: make(map[string]struct{}, len(r.Hosts)), backend: b}
	for _, h := range r.Hosts {
		t.hosts[h] = struct{}{}
	}
	rt.table.Store(t)
	rt.metrics.routeVersion.Set(float64(r.Version))
	rt.updateReady()
	return nil
}

// Retire is called once a backend that Apply replaced has no request left
// in flight: its gauge goes away.
func (rt *Router) Retire(b *Backend) {
	if t := rt.table.Load(); t != nil && t.backend == b {
		return
	}
	b.retired.Store(true)
	rt.metrics.forget(b.spec.DeploymentID)
}

// Current returns the published routes and backend (nil, nil before Apply).
func (rt *Router) Current() (*routes.Routes, *Backend) {
	t := rt.table.Load()
	if t == nil {
		return nil, nil
	}
	return t.routes, t.backend
}

// Drain makes the router report not ready, first step of a shutdown.
func (rt *Router) Drain() {
	rt.draining.Store(true)
	rt.updateReady()
}

// Ready reports whether the sentinel can route, and why not.
func (rt *Router) Ready() (bool, string) {
	if rt.draining.Load() {
		return false, "draining: shutting down"
	}
	t := rt.table.Load()
	if t == nil {
		return false, "routes not loaded yet"
	}
	if t.backend != nil && !t.backend.pool.Synced() {
		return false, "instances of deployment " + t.backend.spec.DeploymentID + " not synced yet"
	}
	return true, "ok"
}

func (rt *Router) updateReady() {
	if ok, _ := rt.Ready(); ok {
		rt.metrics.ready.Set(1)
	} else {
		rt.metrics.ready.Set(0)
	}
}

// UpdateReadyMetric refreshes the ready gauge (after a pool synced).
func (rt *Router) UpdateReadyMetric() { rt.updateReady() }

// bufferPool recycles the 32 KiB copy buffers of the reverse proxy.
type bufferPool struct{ p sync.Pool }

func (b *bufferPool) Get() []byte {
	if v, ok := b.p.Get().(*[]byte); ok {
		return *v
	}
	return make([]byte, 32<<10)
}

func (b *bufferPool) Put(buf []byte) { b.p.Put(&buf) }

var _ io.Closer = (*countedBody)(nil)
