package workflows

import (
	"context"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"

	"krane.dev/ctrl/store"
)

// deployMetrics are the deploy workflow's metrics under the design notes'
// names, with the krane_ prefix.
//
// Restate runs a workflow's code again on every replay, so nothing here is
// counted in handler code. The counter and the duration are counted inside
// the Run body of a status change, and only when its compare-and-set moved
// the row: a body that runs twice finds the row at its target already and
// counts nothing, so each deploy counts once per status in every ctrl
// replica together (a crash between the commit and the count loses that
// one count, never doubles it). The fleet gauges are not kept by workflows
// at all: fleetapi.DeploymentCollector reads them from MySQL on every
// scrape.
type deployMetrics struct {
	store    *store.Store
	log      hclog.Logger
	duration *prometheus.HistogramVec
	status   *prometheus.CounterVec
}

func newDeployMetrics(st *store.Store, log hclog.Logger) *deployMetrics {
	if log == nil {
		log = hclog.NewNullLogger()
	}
	m := &deployMetrics{
		store: st, log: log,
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "krane_deployment_workflow_duration_seconds",
			Help:    "Time from a deployment's creation to the deploy workflow deciding it, by outcome (ready or failed).",
			Buckets: []float64{1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1200},
		}, []string{"outcome"}),
		status: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "krane_deployment_workflow_status",
			Help: "Status changes the deploy workflow made, by the status a deployment entered (deploying, network, ready, failed).",
		}, []string{"status"}),
	}
	for _, s := range []string{store.StatusDeploying, store.StatusNetwork, store.StatusReady, store.StatusFailed} {
		m.status.WithLabelValues(s)
	}
	return m
}

func (m *deployMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.duration, m.status}
}

// entered counts a status change the workflow made (call it only when the
// compare-and-set changed the row, inside that step's Run body); at ready
// or failed it also records how long the deploy took since its deployment
// was created, and the deploy's root and wait spans (tracing.go). msg is
// the change's message (the failure's reason). A failure to read the
// deployment loses the duration and the spans, not the step.
func (m *deployMetrics) entered(ctx context.Context, id, status, msg string) {
	if m == nil {
		return
	}
	m.status.WithLabelValues(status).Inc()
	if status != store.StatusReady && status != store.StatusFailed {
		return
	}
	d, err := m.store.GetDeployment(ctx, id)
	if err == nil {
		m.duration.WithLabelValues(status).Observe(time.Since(d.CreatedAt).Seconds())
		err = traceDecided(ctx, m.store, d, status, msg)
	}
	if err != nil {
		m.log.Warn("cannot read the deployment to record the deploy's duration and trace", "deployment_id", id, "error", err)
	}
}
