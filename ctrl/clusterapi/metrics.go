package clusterapi

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	activeStreams   *prometheus.GaugeVec
	rowsStreamed    *prometheus.CounterVec
	skippedRows     *prometheus.CounterVec
	headVersion     *prometheus.GaugeVec
	watchQuery      *prometheus.HistogramVec
	reports         *prometheus.CounterVec
	headPollErrors  prometheus.Counter
	bootstrapStream *prometheus.HistogramVec
	decrypts        *prometheus.CounterVec
	delivered       *prometheus.CounterVec
	headPolls       prometheus.Counter
	startup         prometheus.Histogram
	batches         *prometheus.HistogramVec
	batchItems      *prometheus.CounterVec
	queueDepth      *prometheus.GaugeVec
	inFlight        *prometheus.GaugeVec
	refused         *prometheus.CounterVec
	cursorRefused   *prometheus.CounterVec
	beatsDeferred   prometheus.Counter
	bootstraps      prometheus.Gauge
	bootstrapRefuse prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	const ns, sub = "krane", "ctrl"
	m := &metrics{
		activeStreams: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "watch_streams_active",
			Help: "Open desired-state streams (Watch, ListDesired and the typed watches), by region and kind.",
		}, []string{"region", "kind"}),
		rowsStreamed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "watch_rows_streamed_total",
			Help: "Desired-state rows sent to agents, by region, kind and phase (bootstrap or stream).",
		}, []string{"region", "kind", "phase"}),
		skippedRows: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "watch_rows_skipped_total",
			Help: "Rows that could not be converted and were not sent (each one is logged with kind, id and version).",
		}, []string{"kind"}),
		headVersion: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "head_version",
			Help: "Newest committed version per region and kind, as seen by this process's head poller.",
		}, []string{"region", "kind"}),
		watchQuery: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: sub, Name: "watch_query_seconds",
			Help:    "Latency of one page query of desired-state streams, by kind and phase (bootstrap; stream: one stream's own read; feed: one read shared by the streams of a (region, kind)).",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
		}, []string{"kind", "phase"}),
		reports: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "status_reports_total",
			Help: "Status reports by kind and result (accepted, stale, not_found, invalid, error).",
		}, []string{"kind", "result"}),
		headPollErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "head_poll_errors_total",
			Help: "Failed reads of change_heads by the head poller.",
		}),
		bootstrapStream: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: sub, Name: "bootstrap_seconds",
			Help:    "Duration of a whole snapshot (bootstrap or ListDesired), by kind.",
			Buckets: prometheus.ExponentialBuckets(0.01, 4, 9),
		}, []string{"kind"}),
		decrypts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "vault_decrypts_total",
			Help: "DecryptEnv requests by outcome: allowed, denied, failed (each in the vault_audit table) and limited (past vault.decrypt_per_minute, not audited).",
		}, []string{"outcome"}),
		delivered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "watch_changes_read_total",
			Help: "Changes streams took after their bootstrap, by source: feed (read once per (region, kind) and shared by its streams) or database (a stream behind the shared window reading for itself).",
		}, []string{"source"}),
		headPolls: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "head_polls_total",
			Help: "Reads of change_heads by the head poller.",
		}),
		// The deploy workflow's instance metric (see ctrl/workflows): named
		// as the design notes name it, with the krane_ prefix.
		startup: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: ns, Name: "deployment_instance_startup_time_seconds",
			Help:    "Time from an instance's creation (its pod's creation time) to the first report that shows it running, once per instance and cluster.",
			Buckets: prometheus.ExponentialBuckets(0.25, 2, 12),
		}),
		batches: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: sub, Name: "ingest_batch_seconds",
			Help:    "Transactions that stored what clusters sent (one batch of many clusters' items), by what (reports, heartbeats) and result (ok, error).",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 10},
		}, []string{"what", "result"}),
		batchItems: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "ingest_items_total",
			Help: "Items (status reports, heartbeats) stored in batches, by what.",
		}, []string{"what"}),
		queueDepth: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "ingest_queue_depth",
			Help: "Items (status reports, heartbeats) waiting for their batch, by what.",
		}, []string{"what"}),
		inFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "ingest_in_flight",
			Help: "Items in the batch being written, by what (0 between batches).",
		}, []string{"what"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "ingest_refused_total",
			Help: "Calls refused with RESOURCE_EXHAUSTED because the queue was full, by what (the caller retries after the hint).",
		}, []string{"what"}),
		cursorRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "cursor_refused_total",
			Help: "Streams refused because their cursor belongs to another history of the database (ahead-of-head: a claim that it went back in time; other-generation), by region; the host bootstraps that kind again.",
		}, []string{"region", "why"}),
		beatsDeferred: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "heartbeats_deferred_total",
			Help: "Heartbeats answered without being written because a report batch of their cluster held its row; each waits for the next heartbeat write.",
		}),
		bootstraps: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "bootstraps_admitted",
			Help: "Watch streams sending a bootstrap (a full snapshot of a kind) now; at most Options.MaxBootstraps.",
		}),
		bootstrapRefuse: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "bootstraps_refused_total",
			Help: "Watch streams refused with RESOURCE_EXHAUSTED and a retry hint because MaxBootstraps bootstraps were running.",
		}),
	}
	// At 0 from the start, so the shipped alerts (deploy/monitoring) see
	// a series before the first refusal.
	for _, what := range []string{"reports", "reports-share"} {
		m.refused.WithLabelValues(what)
	}
	if reg != nil {
		reg.MustRegister(m.activeStreams, m.rowsStreamed, m.skippedRows, m.headVersion, m.watchQuery, m.reports,
			m.headPollErrors, m.bootstrapStream, m.decrypts, m.delivered, m.headPolls, m.startup, m.batches, m.batchItems, m.queueDepth, m.inFlight, m.refused, m.cursorRefused,
			m.beatsDeferred, m.bootstraps, m.bootstrapRefuse)
	}
	return m
}

// observeBatch returns the observer of a batcher's transactions.
func (m *metrics) observeBatch(what string) func(int, time.Duration, error) {
	return func(n int, took time.Duration, err error) {
		result := "ok"
		if err != nil {
			result = "error"
		}
		m.batches.WithLabelValues(what, result).Observe(took.Seconds())
		m.batchItems.WithLabelValues(what).Add(float64(n))
	}
}

// gaugeBatch returns the gauge callback of a batcher.
func (m *metrics) gaugeBatch(what string) func(queued, inFlight int) {
	return func(queued, inFlight int) {
		if queued >= 0 {
			m.queueDepth.WithLabelValues(what).Set(float64(queued))
		}
		if inFlight >= 0 {
			m.inFlight.WithLabelValues(what).Set(float64(inFlight))
		}
	}
}

// observeStarted records the startup times of instances a report showed
// running for the first time. The store decides "first" under the lock of
// the cluster's report row, so a report sent twice counts once.
func (m *metrics) observeStarted(ds []time.Duration) {
	for _, d := range ds {
		m.startup.Observe(d.Seconds())
	}
}
