package bench

import (
	"context"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"krane.dev/ctrl/auth"
	"krane.dev/ctrl/fleetapi"
	"krane.dev/ctrl/store"
	"krane.dev/shared/kinds"
)

// seriesRegions spreads the series measurement's clusters as the fleet
// measurement does.
const seriesRegions = 20

// MetricSeries counts the series one ctrl replica's /metrics carries for
// the fleet at 1,000 and 10,000 registered, heartbeating clusters: a real
// scrape of ctrl with its defaults (per-cluster series up to
// http.metrics_per_cluster_max, 1,000), against the same collector with
// the per-cluster series forced on, measured in the same run. Every
// replica exports as many, so a Prometheus scraping R replicas stores R
// times the figure.
func MetricSeries(ctx context.Context, e *Env) ([]Figure, error) {
	var figs []Figure
	registered := 0
	defer func() { removeSeriesClusters(context.WithoutCancel(ctx), e) }()
	for _, n := range []int{e.size(1000, 20), e.size(10000, 200)} {
		if err := seedSeriesClusters(ctx, e, registered, n); err != nil {
			return nil, err
		}
		registered = n
		scraped, err := scrapedFleetSeries(ctx, e, n)
		if err != nil {
			return nil, err
		}
		forced, err := collectedFleetSeries(e.Store, n)
		if err != nil {
			return nil, err
		}
		e.logf("series: %d clusters: %.0f fleet series in ctrl's scrape, %.0f with every cluster's own", n, scraped, forced)
		size := fmt.Sprintf("%d", n)
		figs = append(figs,
			Figure{Key: "scraped_" + size, Name: fmt.Sprintf("fleet series per ctrl replica, %s clusters (defaults)", thousands(fmt.Sprint(n))), Value: scraped, Unit: "series"},
			Figure{Key: "per_cluster_" + size, Name: fmt.Sprintf("the same with per-cluster series at any size, %s clusters", thousands(fmt.Sprint(n))), Value: forced, Unit: "series"},
			Figure{Key: "ratio_" + size, Name: fmt.Sprintf("defaults / per-cluster, %s clusters", thousands(fmt.Sprint(n))), Value: round2(scraped / forced), Unit: "ratio"},
		)
	}
	return figs, nil
}

// seedSeriesClusters registers clusters from..n-1 and records a heartbeat
// for each, as a host running the three built-in kinds sends it.
func seedSeriesClusters(ctx context.Context, e *Env, from, n int) error {
	refs := make([]auth.ClusterRef, 0, n-from)
	for i := from; i < n; i++ {
		refs = append(refs, auth.ClusterRef{Region: fmt.Sprintf("series-r%02d", i%seriesRegions), ClusterID: fmt.Sprintf("series-c%05d", i)})
	}
	if _, err := auth.RegisterClusters(ctx, e.Store, refs); err != nil {
		return fmt.Errorf("series: register %d clusters: %w", len(refs), err)
	}
	var hbs []store.ClusterHeartbeat
	for _, r := range refs {
		hbs = append(hbs, store.ClusterHeartbeat{ClusterID: r.ClusterID, Region: r.Region, Data: store.HeartbeatData{
			AgentVersion: "1.0.0",
			Cursors:      map[string]uint64{kinds.Deployment: 1, kinds.Sentinel: 1, kinds.CiliumNetworkPolicy: 1},
			Host: &store.HostReport{Parked: map[string]int{kinds.Deployment: 0, kinds.Sentinel: 0, kinds.CiliumNetworkPolicy: 0},
				Controllers: []store.ControllerStatus{{Name: "deployment", Kinds: []string{kinds.Deployment}, Running: true}}},
		}})
	}
	for len(hbs) > 0 {
		batch := hbs[:min(500, len(hbs))]
		hbs = hbs[len(batch):]
		errs, err := e.Store.Heartbeats(ctx, batch)
		if err != nil {
			return fmt.Errorf("series: record heartbeats: %w", err)
		}
		for i, err := range errs {
			if err != nil {
				return fmt.Errorf("series: heartbeat of %s: %w", batch[i].ClusterID, err)
			}
		}
	}
	return nil
}

// isFleetSeries: the series the fleet collector exports.
func isFleetSeries(name string) bool {
	for _, p := range []string{"krane_ctrl_cluster_", "krane_ctrl_region_", "krane_ctrl_agent", "krane_ctrl_fleet_metrics_"} {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// scrapedFleetSeries scrapes ctrl until its fleet view holds n series
// clusters (the collector caches a read for a few seconds) and counts
// the fleet series.
func scrapedFleetSeries(ctx context.Context, e *Env, n int) (float64, error) {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		m, err := scrape(ctx, e.St.CtrlHTTP+"/metrics")
		if err != nil {
			return 0, err
		}
		if got := sum(m, "krane_ctrl_region_clusters{", `region="series-`); int(got) == n {
			count := 0
			for k := range m {
				if isFleetSeries(k) {
					count++
				}
			}
			return float64(count), nil
		} else if time.Now().After(deadline) {
			return 0, fmt.Errorf("series: ctrl's /metrics counts %.0f of the %d registered series clusters after 2 minutes", got, n)
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// collectedFleetSeries counts the fleet series of a collector over the
// same database with the per-cluster series on at any size.
func collectedFleetSeries(st *store.Store, n int) (float64, error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(fleetapi.NewCollector(st, nil, fleetapi.CollectorOptions{PerClusterMax: math.MaxInt}))
	mfs, err := reg.Gather()
	if err != nil {
		return 0, err
	}
	count := 0
	for _, mf := range mfs {
		if isFleetSeries(mf.GetName()) {
			count += len(mf.GetMetric())
		}
	}
	return float64(count), nil
}

// removeSeriesClusters deletes the measurement's clusters, so the fleet
// measurement after it starts from its own.
func removeSeriesClusters(ctx context.Context, e *Env) {
	for _, q := range []string{
		"DELETE FROM api_tokens WHERE kind = 'cluster' AND cluster_id LIKE 'series-c%'",
		"DELETE FROM clusters WHERE id LIKE 'series-c%'",
	} {
		if _, err := e.Store.DB().ExecContext(ctx, q); err != nil {
			e.logf("series: cleaning up: %v", err)
		}
	}
}
