package syncer

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the sync loops' Prometheus metrics.
type Metrics struct {
	Cursor        *prometheus.GaugeVec
	Head          *prometheus.GaugeVec
	Applies       *prometheus.CounterVec
	ApplySeconds  *prometheus.HistogramVec
	Parked        *prometheus.GaugeVec
	Reconnects    *prometheus.CounterVec
	Rebootstraps  *prometheus.CounterVec
	ResyncSeconds *prometheus.HistogramVec
	ResyncWrites  *prometheus.CounterVec
	GCDeletions   *prometheus.CounterVec
	GCBrakeTrips  *prometheus.CounterVec
}

// NewMetrics registers the metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Cursor:        prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "krane_host_cursor", Help: "Committed cursor per kind: every change at or below it is applied or parked."}, []string{"kind"}),
		Head:          prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "krane_host_head_version", Help: "ctrl's head version as last seen on the stream; head - cursor is the lag."}, []string{"kind"}),
		Applies:       prometheus.NewCounterVec(prometheus.CounterOpts{Name: "krane_host_applies_total", Help: "Plugin applies by source (stream, resync, gc) and result."}, []string{"kind", "source", "result"}),
		ApplySeconds:  prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "krane_host_apply_seconds", Help: "Latency of one plugin apply.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)}, []string{"kind", "result"}),
		Parked:        prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "krane_host_parked_objects", Help: "Objects whose latest change failed permanently (parked), as of the last apply."}, []string{"kind"}),
		Reconnects:    prometheus.NewCounterVec(prometheus.CounterOpts{Name: "krane_host_stream_reconnects_total", Help: "Watch stream reconnects."}, []string{"kind"}),
		Rebootstraps:  prometheus.NewCounterVec(prometheus.CounterOpts{Name: "krane_host_rebootstraps_total", Help: "Bootstraps again because ctrl refused the cursor: its database was restored or failed over."}, []string{"kind"}),
		ResyncSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "krane_host_resync_seconds", Help: "Duration of a resync pass (listing; applies run on the workers).", Buckets: prometheus.ExponentialBuckets(0.005, 2, 14)}, []string{"kind"}),
		ResyncWrites:  prometheus.NewCounterVec(prometheus.CounterOpts{Name: "krane_host_resync_writes_total", Help: "Objects a resync had to write (drift repaired)."}, []string{"kind"}),
		GCDeletions:   prometheus.NewCounterVec(prometheus.CounterOpts{Name: "krane_host_gc_deletions_total", Help: "Objects queued for deletion by garbage collection."}, []string{"kind"}),
		GCBrakeTrips:  prometheus.NewCounterVec(prometheus.CounterOpts{Name: "krane_host_gc_brake_trips_total", Help: "Garbage collection passes refused by the deletion brake."}, []string{"kind"}),
	}
	reg.MustRegister(m.Cursor, m.Head, m.Applies, m.ApplySeconds, m.Parked, m.Reconnects, m.Rebootstraps, m.ResyncSeconds, m.ResyncWrites, m.GCDeletions, m.GCBrakeTrips)
	return m
}
