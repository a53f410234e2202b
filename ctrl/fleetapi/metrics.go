package fleetapi

import (
	"context"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"

	"krane.dev/ctrl/store"
	ctrlv1 "krane.dev/proto/krane/ctrl/v1"
	"krane.dev/shared/version"
)

// Collector exports the fleet view (Load) as gauges, read when Prometheus
// scrapes. Two sets:
//
//   - per region (and kind): the worst lag, parked objects, silent
//     clusters, the agents' versions. A few hundred series whatever the
//     fleet's size; the shipped alerts and dashboard read only these.
//   - per cluster (and kind): lag, parked objects, heartbeat age and agent
//     version, for drilling into one cluster. Every replica exports them,
//     so they cost (clusters x kinds x replicas) series: they are left out
//     when the fleet has more clusters than CollectorOptions.PerClusterMax.
//
// Both are computed from one read, so a cluster removed from the database
// leaves no stale series behind. Reads are shared between scrapes for
// cacheFor, so several scrapers cost one read.
type Collector struct {
	store *store.Store
	log   hclog.Logger
	now   func() time.Time
	opts  CollectorOptions

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

	regionClusters *prometheus.Desc
	regionSilent   *prometheus.Desc
	regionHBAge    *prometheus.Desc
	regionLagV     *prometheus.Desc
	regionLagS     *prometheus.Desc
	regionParked   *prometheus.Desc
	agentVersions  *prometheus.Desc
	perCluster     *prometheus.Desc

	failed bool
	warned bool
}

// CollectorOptions tunes the fleet collector.
type CollectorOptions struct {
	// PerClusterMax: the per-cluster series are exported while the fleet
	// has at most this many registered clusters; 0 never exports them.
	PerClusterMax int
	// SilentAfter is the heartbeat age past which a cluster counts as
	// silent in krane_ctrl_region_clusters_silent (ctrl's own liveness
	// rule, deploy.live_cluster_within); 0 means 2 minutes.
	SilentAfter time.Duration
}

const (
	cacheFor    = 5 * time.Second
	readTimeout = 10 * time.Second
)

// NewCollector returns the fleet collector over st; register it with the
// server's registry.
func NewCollector(st *store.Store, log hclog.Logger, o CollectorOptions) *Collector {
	if log == nil {
		log = hclog.NewNullLogger()
	}
	if o.SilentAfter <= 0 {
		o.SilentAfter = 2 * time.Minute
	}
	kind := []string{"region", "cluster", "kind"}
	regionKind := []string{"region", "kind"}
	region := []string{"region"}
	return &Collector{
		store: st, log: log.Named("fleetmetrics"), now: time.Now, opts: o,
		lagV: prometheus.NewDesc("krane_ctrl_cluster_lag_versions",
			"Newest desired-state version of the kind in the cluster's region minus the cursor the cluster last reported (versions are global, so a distance, not a count). Left out beyond metrics.per_cluster_max clusters.", kind, nil),
		lagS: prometheus.NewDesc("krane_ctrl_cluster_lag_seconds",
			"How long the oldest change of the kind above the cluster's cursor had been committed at its last heartbeat (0: caught up then). Left out beyond metrics.per_cluster_max clusters.", kind, nil),
		parked: prometheus.NewDesc("krane_ctrl_cluster_parked_objects",
			"Objects of the kind the cluster's host holds parked (failed permanently), as of its last heartbeat. Left out beyond metrics.per_cluster_max clusters.", kind, nil),
		hbAge: prometheus.NewDesc("krane_ctrl_cluster_heartbeat_age_seconds",
			"Seconds since the cluster's last heartbeat (hosts send one every 30s). Left out beyond metrics.per_cluster_max clusters.", []string{"region", "cluster"}, nil),
		agent: prometheus.NewDesc("krane_ctrl_cluster_agent_info",
			"1 per cluster, labelled with the krane version its host last reported and where that stands against this ctrl's skew window (in-window, too-old: refused, newer-than-ctrl, unknown; docs/compatibility.md). Left out beyond metrics.per_cluster_max clusters.", []string{"region", "cluster", "version", "skew"}, nil),
		skew: prometheus.NewDesc("krane_ctrl_agents",
			"Registered clusters by where their host's krane version stands against this ctrl's skew window (in-window, too-old: refused, newer-than-ctrl, unknown).", []string{"skew"}, nil),
		readErr: prometheus.NewDesc("krane_ctrl_fleet_metrics_read_failed",
			"1 when the last read of the fleet view for these metrics failed (the cluster and region series are then missing).", nil, nil),
		regionClusters: prometheus.NewDesc("krane_ctrl_region_clusters",
			"Registered clusters of the region.", region, nil),
		regionSilent: prometheus.NewDesc("krane_ctrl_region_clusters_silent",
			"Registered clusters of the region whose last heartbeat is older than deploy.live_cluster_within, or that never sent one.", region, nil),
		regionHBAge: prometheus.NewDesc("krane_ctrl_region_heartbeat_age_seconds_max",
			"The oldest last heartbeat among the region's clusters that sent one, in seconds (hosts send one every 30s).", region, nil),
		regionLagV: prometheus.NewDesc("krane_ctrl_region_lag_versions_max",
			"The largest krane_ctrl_cluster_lag_versions among the region's clusters, by kind.", regionKind, nil),
		regionLagS: prometheus.NewDesc("krane_ctrl_region_lag_seconds_max",
			"The largest krane_ctrl_cluster_lag_seconds among the region's clusters, by kind: how long the oldest change not yet applied everywhere has waited.", regionKind, nil),
		regionParked: prometheus.NewDesc("krane_ctrl_region_parked_objects",
			"Objects of the kind parked (failed permanently) by the region's hosts, summed, as of their last heartbeats.", regionKind, nil),
		agentVersions: prometheus.NewDesc("krane_ctrl_agent_versions",
			"Registered clusters by the krane version their host last reported (\"\" before the first heartbeat) and its skew against this ctrl.", []string{"version", "skew"}, nil),
		perCluster: prometheus.NewDesc("krane_ctrl_fleet_metrics_per_cluster",
			"1 when this scrape carries the per-cluster series (the fleet has at most metrics.per_cluster_max clusters), 0 when only the per-region ones.", nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.lagV, c.lagS, c.parked, c.hbAge, c.agent, c.skew, c.readErr,
		c.regionClusters, c.regionSilent, c.regionHBAge, c.regionLagV, c.regionLagS, c.regionParked, c.agentVersions, c.perCluster} {
		ch <- d
	}
}

type regionKey struct{ region, kind string }

type versionKey struct{ version, skew string }

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	resp, failed := c.read()
	ch <- prometheus.MustNewConstMetric(c.readErr, prometheus.GaugeValue, b2f(failed))
	if failed {
		return
	}
	now := c.now()
	clusters := resp.GetClusters()
	perCluster := len(clusters) <= c.opts.PerClusterMax
	ch <- prometheus.MustNewConstMetric(c.perCluster, prometheus.GaugeValue, b2f(perCluster))
	skews := map[string]int{}
	for _, s := range []version.Skew{version.InWindow, version.Unknown, version.Newer, version.TooOld} {
		skews[s.String()] = 0
	}
	count, silent, hbMax := map[string]int{}, map[string]int{}, map[string]float64{}
	lagV, lagS, parked := map[regionKey]float64{}, map[regionKey]float64{}, map[regionKey]float64{}
	versions := map[versionKey]int{}
	for _, ci := range clusters {
		region := ci.GetRegion()
		skews[ci.GetAgentSkew()]++
		versions[versionKey{ci.GetAgentVersion(), ci.GetAgentSkew()}]++
		count[region]++
		if perCluster {
			ch <- prometheus.MustNewConstMetric(c.agent, prometheus.GaugeValue, 1, region, ci.GetId(), ci.GetAgentVersion(), ci.GetAgentSkew())
		}
		if hb := ci.GetLastHeartbeatAt(); hb != nil {
			age := now.Sub(hb.AsTime())
			hbMax[region] = max(hbMax[region], age.Seconds())
			if age > c.opts.SilentAfter {
				silent[region]++
			}
			if perCluster {
				ch <- prometheus.MustNewConstMetric(c.hbAge, prometheus.GaugeValue, age.Seconds(), region, ci.GetId())
			}
		} else {
			silent[region]++
		}
		for _, k := range ci.GetKinds() {
			rk := regionKey{region, k.GetKind()}
			labels := []string{region, ci.GetId(), k.GetKind()}
			if k.LagVersions != nil {
				lagV[rk] = max(lagV[rk], float64(k.GetLagVersions()))
				if perCluster {
					ch <- prometheus.MustNewConstMetric(c.lagV, prometheus.GaugeValue, float64(k.GetLagVersions()), labels...)
				}
			}
			if k.LagSeconds != nil {
				lagS[rk] = max(lagS[rk], k.GetLagSeconds())
				if perCluster {
					ch <- prometheus.MustNewConstMetric(c.lagS, prometheus.GaugeValue, k.GetLagSeconds(), labels...)
				}
			}
			if k.Parked != nil {
				parked[rk] += float64(k.GetParked())
				if perCluster {
					ch <- prometheus.MustNewConstMetric(c.parked, prometheus.GaugeValue, float64(k.GetParked()), labels...)
				}
			}
		}
	}
	for s, n := range skews {
		ch <- prometheus.MustNewConstMetric(c.skew, prometheus.GaugeValue, float64(n), s)
	}
	for v, n := range versions {
		ch <- prometheus.MustNewConstMetric(c.agentVersions, prometheus.GaugeValue, float64(n), v.version, v.skew)
	}
	for region, n := range count {
		ch <- prometheus.MustNewConstMetric(c.regionClusters, prometheus.GaugeValue, float64(n), region)
		ch <- prometheus.MustNewConstMetric(c.regionSilent, prometheus.GaugeValue, float64(silent[region]), region)
		if v, ok := hbMax[region]; ok {
			ch <- prometheus.MustNewConstMetric(c.regionHBAge, prometheus.GaugeValue, v, region)
		}
	}
	for rk, v := range lagV {
		ch <- prometheus.MustNewConstMetric(c.regionLagV, prometheus.GaugeValue, v, rk.region, rk.kind)
	}
	for rk, v := range lagS {
		ch <- prometheus.MustNewConstMetric(c.regionLagS, prometheus.GaugeValue, v, rk.region, rk.kind)
	}
	for rk, v := range parked {
		ch <- prometheus.MustNewConstMetric(c.regionParked, prometheus.GaugeValue, v, rk.region, rk.kind)
	}
	if !perCluster && !c.warnedOnce() {
		c.log.Info("the fleet is larger than metrics.per_cluster_max: /metrics carries the per-region series only (ctrl admin cluster list shows each cluster)",
			"clusters", len(clusters), "per_cluster_max", c.opts.PerClusterMax)
	}
}

func (c *Collector) warnedOnce() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	w := c.warned
	c.warned = true
	return w
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
