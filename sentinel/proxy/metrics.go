package proxy

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metric names. Labels are at most environment and deployment: one
// environment per sentinel, and the deployments a sentinel routes to in its
// lifetime (a retired backend's gauges are deleted), so the series count
// stays bounded.
const (
	MetricRequests       = "krane_sentinel_requests_total"
	MetricDuration       = "krane_sentinel_request_duration_seconds"
	MetricUpstreamErrors = "krane_sentinel_upstream_errors_total"
	MetricInstancesReady = "krane_sentinel_instances_ready"
	MetricEjections      = "krane_sentinel_instance_ejections_total"
	MetricRouteVersion   = "krane_sentinel_route_version"
	MetricReady          = "krane_sentinel_ready"
)

// Upstream error reasons (label "reason").
const (
	ReasonNoInstance = "no_instance"
	ReasonConnect    = "connect"
	ReasonTimeout    = "timeout"
	ReasonOther      = "other"
)

type metrics struct {
	requests       *prometheus.CounterVec
	duration       prometheus.Observer
	upstreamErrors *prometheus.CounterVec
	instancesReady *prometheus.GaugeVec
	ejections      *prometheus.CounterVec
	routeVersion   prometheus.Gauge
	ready          prometheus.Gauge
	env            string
}

func newMetrics(reg prometheus.Registerer, env string) (*metrics, error) {
	m := &metrics{env: env}
	m.requests = prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricRequests,
		Help: "Requests the sentinel answered, by status class (1xx..5xx) and the deployment that served them (empty when none did)."},
		[]string{"environment", "deployment", "code"})
	dur := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: MetricDuration,
		Help:    "Time from a request's headers read to its response written, in seconds.",
		Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}},
		[]string{"environment"})
	m.upstreamErrors = prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricUpstreamErrors,
		Help: "Failures on the way to an instance, by reason: no_instance, connect (an attempt; the request may have succeeded on another instance), timeout, other."},
		[]string{"environment", "deployment", "reason"})
	m.instancesReady = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: MetricInstancesReady,
		Help: "Ready instances of the deployment the sentinel routes to."}, []string{"environment", "deployment"})
	m.ejections = prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricEjections,
		Help: "Instances taken out of rotation after a failed connect."}, []string{"environment", "deployment"})
	rv := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: MetricRouteVersion,
		Help: "Version of the routes the sentinel serves."}, []string{"environment"})
	rd := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: MetricReady,
		Help: "1 while the sentinel can route (routes read, instances synced, not draining)."}, []string{"environment"})
	for _, c := range []prometheus.Collector{m.requests, dur, m.upstreamErrors, m.instancesReady, m.ejections, rv, rd} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	m.duration = dur.WithLabelValues(env)
	m.routeVersion = rv.WithLabelValues(env)
	m.ready = rd.WithLabelValues(env)
	return m, nil
}

// backendMetrics are a deployment's series, resolved once so a request does
// no label lookups.
type backendMetrics struct {
	codes          [6]prometheus.Counter // index status/100; 0 for anything odd
	instancesReady prometheus.Gauge
	ejections      prometheus.Counter
	noInstance     prometheus.Counter
	connect        prometheus.Counter
	timeout        prometheus.Counter
	other          prometheus.Counter
}

var codeClasses = [6]string{"other", "1xx", "2xx", "3xx", "4xx", "5xx"}

func (m *metrics) forDeployment(dep string) *backendMetrics {
	b := &backendMetrics{
		instancesReady: m.instancesReady.WithLabelValues(m.env, dep),
		ejections:      m.ejections.WithLabelValues(m.env, dep),
		noInstance:     m.upstreamErrors.WithLabelValues(m.env, dep, ReasonNoInstance),
		connect:        m.upstreamErrors.WithLabelValues(m.env, dep, ReasonConnect),
		timeout:        m.upstreamErrors.WithLabelValues(m.env, dep, ReasonTimeout),
		other:          m.upstreamErrors.WithLabelValues(m.env, dep, ReasonOther),
	}
	for i, c := range codeClasses {
		b.codes[i] = m.requests.WithLabelValues(m.env, dep, c)
	}
	return b
}

// forget drops a retired deployment's gauge, so it does not report
// instances the sentinel no longer routes to. Counters stay: they are
// history.
func (m *metrics) forget(dep string) {
	m.instancesReady.DeleteLabelValues(m.env, dep)
}

func (b *backendMetrics) code(status int) prometheus.Counter {
	if c := status / 100; c >= 1 && c <= 5 {
		return b.codes[c]
	}
	return b.codes[0]
}
