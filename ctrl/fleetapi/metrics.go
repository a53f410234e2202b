package fleetapi

import (
	"context"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"

	"krane.dev/ctrl/store"
	"krane.dev/internal/version"
	ctrlv1 "krane.dev/proto/krane/ctrl/v1"
)

// Collector exports the fleet view (Load) as gauges, read when Prometheus
// scrapes: one series per cluster and kind, so a cluster removed from the
// database leaves no stale series behind. Reads are shared between
// scrapes for cacheFor, so several scrapers cost one read.
type Collector struct {
	store *store.Store
	log   hclog.Logger
	now   func() time.Time

	mu      sync.Mutex
	at      time.Time
	cached  *ctrlv1.ListClustersResponse
	lagV    *prometheus.Desc
	lagS    *prometheus.Desc
	parked  *prometheus.Desc
	hbAge   *prometheus.Desc
	agent   *prometheus.Desc
	skew    *prometheus.Desc
	readErr *prometheus.Desc
	failed  bool
}

const (
	cacheFor    = 5 * time.Second
	readTimeout = 10 * time.Second
)

// NewCollector returns the fleet collector over st; register it with the
// server's registry.
func NewCollector(st *store.Store, log hclog.Logger) *Collector {
	if log == nil {
		log = hclog.NewNullLogger()
	}
	kind := []string{"region", "cluster", "kind"}
	return &Collector{
		store: st, log: log.Named("fleetmetrics"), now: time.Now,
		lagV: prometheus.NewDesc("krane_ctrl_cluster_lag_versions",
			"Newest desired-state version of the kind in the cluster's region minus the cursor the cluster last reported (versions are global, so a distance, not a count).", kind, nil),
		lagS: prometheus.NewDesc("krane_ctrl_cluster_lag_seconds",
			"How long the oldest change of the kind above the cluster's cursor had been committed at its last heartbeat (0: caught up then).", kind, nil),
		parked: prometheus.NewDesc("krane_ctrl_cluster_parked_objects",
			"Objects of the kind the cluster's host holds parked (failed permanently), as of its last heartbeat.", kind, nil),
		hbAge: prometheus.NewDesc("krane_ctrl_cluster_heartbeat_age_seconds",
			"Seconds since the cluster's last heartbeat (hosts send one every 30s).", []string{"region", "cluster"}, nil),
		agent: prometheus.NewDesc("krane_ctrl_cluster_agent_info",
			"1 per cluster, labelled with the krane version its host last reported and where that stands against this ctrl's skew window (in-window, too-old: refused, newer-than-ctrl, unknown; docs/compatibility.md).", []string{"region", "cluster", "version", "skew"}, nil),
		skew: prometheus.NewDesc("krane_ctrl_agents",
			"Registered clusters by where their host's krane version stands against this ctrl's skew window (in-window, too-old: refused, newer-than-ctrl, unknown).", []string{"skew"}, nil),
		readErr: prometheus.NewDesc("krane_ctrl_fleet_metrics_read_failed",
			"1 when the last read of the fleet view for these metrics failed (the cluster series are then missing).", nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.lagV
	ch <- c.lagS
	ch <- c.parked
	ch <- c.hbAge
	ch <- c.agent
	ch <- c.skew
	ch <- c.readErr
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	resp, failed := c.read()
	ch <- prometheus.MustNewConstMetric(c.readErr, prometheus.GaugeValue, b2f(failed))
	now := c.now()
	skews := map[string]int{}
	for _, s := range []version.Skew{version.InWindow, version.Unknown, version.Newer, version.TooOld} {
		skews[s.String()] = 0
	}
	for _, ci := range resp.GetClusters() {
		skews[ci.GetAgentSkew()]++
		ch <- prometheus.MustNewConstMetric(c.agent, prometheus.GaugeValue, 1, ci.GetRegion(), ci.GetId(), ci.GetAgentVersion(), ci.GetAgentSkew())
		if hb := ci.GetLastHeartbeatAt(); hb != nil {
			ch <- prometheus.MustNewConstMetric(c.hbAge, prometheus.GaugeValue, now.Sub(hb.AsTime()).Seconds(), ci.GetRegion(), ci.GetId())
		}
		for _, k := range ci.GetKinds() {
			labels := []string{ci.GetRegion(), ci.GetId(), k.GetKind()}
			if k.LagVersions != nil {
				ch <- prometheus.MustNewConstMetric(c.lagV, prometheus.GaugeValue, float64(k.GetLagVersions()), labels...)
			}
			if k.LagSeconds != nil {
				ch <- prometheus.MustNewConstMetric(c.lagS, prometheus.GaugeValue, k.GetLagSeconds(), labels...)
			}
			if k.Parked != nil {
				ch <- prometheus.MustNewConstMetric(c.parked, prometheus.GaugeValue, float64(k.GetParked()), labels...)
			}
		}
	}
	if !failed {
		for s, n := range skews {
			ch <- prometheus.MustNewConstMetric(c.skew, prometheus.GaugeValue, float64(n), s)
		}
	}
}

// read returns the fleet view, re-read when older than cacheFor. A failed
// read exports no cluster series (stale values would look current).
func (c *Collector) read() (*ctrlv1.ListClustersResponse, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.at.IsZero() && c.now().Sub(c.at) < cacheFor {
		return c.cached, c.failed
	}
	ctx, cancel := context.WithTimeout(context.Background(), readTimeout)
	defer cancel()
	resp, err := Load(ctx, c.store, "")
	c.at = c.now()
	if err != nil {
		c.log.Warn("cannot read the fleet view for /metrics; the cluster lag series are left out of this scrape", "error", err)
		c.cached, c.failed = nil, true
		return nil, true
	}
	c.cached, c.failed = resp, false
	return resp, false
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
