// Package monitoring holds and proves what deploy/monitoring ships for
// Prometheus and Grafana: the alert and recording rules (rules.yaml, and
// the same groups as a PrometheusRule), the scrape targets
// (servicemonitor.yaml, scrape-config.yaml) and the dashboard
// (dashboards/krane.json).
//
// Its tests run promtool on the rules (syntax and the unit tests in
// rules_test.yaml, promtool's format), check every dashboard query with
// promtool too, and keep prometheusrule.yaml equal to rules.yaml
// (`go test ./deploy/monitoring -update` rewrites it). That every metric
// the rules and panels name exists is proven against a real scrape of
// ctrl and krane: e2e's TestMonitoringNamesRealMetrics reads the names
// with Referenced.
package monitoring
