package fleetapi

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"

	"krane.dev/ctrl/store"
)

// NewDeploymentCollector returns the collector of the deployments' fleet
// gauges (krane_deployment_topology_*, krane_deployment_instances_*). ctrl
// serve registers it with the deploy workflow's own metrics.
func NewDeploymentCollector(st *store.Store, log hclog.Logger) *DeploymentCollector {
	if log == nil {
		log = hclog.NewNullLogger()
	}
	return &DeploymentCollector{store: st, log: log}
}

// DeploymentCollector reports the deployments' topology and instance gauges from MySQL on
// every scrape: two grouped queries, bounded by deploymentScrapeTimeout. When they
// fail, the scrape carries the other metrics and
// krane_deployment_fleet_metrics_errors_total counts the failure (a
// failing collector would fail the whole scrape).
type DeploymentCollector struct {
	store  *store.Store
	log    hclog.Logger
	errors atomic.Uint64
}

const deploymentScrapeTimeout = 5 * time.Second

var (
	topologyRegionsDesc = prometheus.NewDesc("krane_deployment_topology_regions",
		"Regions with at least one deployment desired running.", nil, nil)
	topologyStatusDesc = prometheus.NewDesc("krane_deployment_topology_status",
		"Deployment topology rows (one per deployment and region) by region and state: starting (desired running, not every replica ready), started, stopping (desired stopped, not yet reported deleted), stopped.",
		[]string{"region", "status"}, nil)
	instancesTotalDesc = prometheus.NewDesc("krane_deployment_instances_total",
		"Instances the clusters reported, by region.", []string{"region"}, nil)
	instancesByStatusDesc = prometheus.NewDesc("krane_deployment_instances_by_status",
		"Instances the clusters reported, by region and status (pending, running, failed, inactive).", []string{"region", "status"}, nil)
	fleetErrorsDesc = prometheus.NewDesc("krane_deployment_fleet_metrics_errors_total",
		"Scrapes whose topology or instance gauges could not be read from MySQL (the log says why).", nil, nil)
)

func (c *DeploymentCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{topologyRegionsDesc, topologyStatusDesc, instancesTotalDesc, instancesByStatusDesc, fleetErrorsDesc} {
		ch <- d
	}
}

func (c *DeploymentCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), deploymentScrapeTimeout)
	defer cancel()
	failed := false
	if topo, err := c.store.TopologyStates(ctx); err != nil {
		c.log.Warn("cannot read deployment topology for /metrics", "error", err)
		failed = true
	} else {
		regions := map[string]bool{}
		for _, r := range topo {
			ch <- prometheus.MustNewConstMetric(topologyStatusDesc, prometheus.GaugeValue, float64(r.N), r.Region, r.State)
			if r.State == store.TopologyStarting || r.State == store.TopologyStarted {
				regions[r.Region] = true
			}
		}
		ch <- prometheus.MustNewConstMetric(topologyRegionsDesc, prometheus.GaugeValue, float64(len(regions)))
	}
	if inst, err := c.store.InstanceStates(ctx); err != nil {
		c.log.Warn("cannot read instances for /metrics", "error", err)
		failed = true
	} else {
		total := map[string]int64{}
		var order []string
		for _, r := range inst {
			ch <- prometheus.MustNewConstMetric(instancesByStatusDesc, prometheus.GaugeValue, float64(r.N), r.Region, r.State)
			if _, ok := total[r.Region]; !ok {
				order = append(order, r.Region)
			}
			total[r.Region] += r.N
		}
		for _, region := range order {
			ch <- prometheus.MustNewConstMetric(instancesTotalDesc, prometheus.GaugeValue, float64(total[region]), region)
		}
	}
	if failed {
		c.errors.Add(1)
	}
	ch <- prometheus.MustNewConstMetric(fleetErrorsDesc, prometheus.CounterValue, float64(c.errors.Load()))
}
