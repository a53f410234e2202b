package monitoring_test

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"krane.dev/deploy/check"
	"krane.dev/deploy/monitoring"
)

var update = flag.Bool("update", false, "rewrite prometheusrule.yaml from rules.yaml")

// promtool finds the pinned promtool `make tools` installs.
func promtool(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("promtool"); err == nil {
		return p
	}
	p, err := filepath.Abs("../../.tools/bin/promtool")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("promtool not found in PATH or .tools/bin: run `make tools` (it installs the pinned version)")
	}
	return p
}

func run(t *testing.T, dir, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s (in %s): %v\n%s", filepath.Base(name), strings.Join(args, " "), dir, err, out)
	}
	return string(out)
}

// TestRulesPassPromtool: the rules parse and their unit tests
// (rules_test.yaml: each alert firing on what should page, silent on what
// should not) pass.
func TestRulesPassPromtool(t *testing.T) {
	p := promtool(t)
	run(t, ".", p, "check", "rules", "rules.yaml")
	out := run(t, ".", p, "test", "rules", "rules_test.yaml")
	t.Logf("promtool test rules:\n%s", out)
}

// TestPromtoolTestsCatchAWrongThreshold is the rule tests' negative
// control: the same tests over rules whose delivery-lag threshold was
// moved must fail.
func TestPromtoolTestsCatchAWrongThreshold(t *testing.T) {
	p := promtool(t)
	dir := t.TempDir()
	rules, err := os.ReadFile("rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	moved := bytes.Replace(rules, []byte("krane:delivery_lag_seconds:max > 300"), []byte("krane:delivery_lag_seconds:max > 500"), 1)
	if bytes.Equal(moved, rules) {
		t.Fatal("rules.yaml has no delivery-lag threshold of 300 to move: update this test with the rule")
	}
	tests, err := os.ReadFile("rules_test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{"rules.yaml": moved, "rules_test.yaml": tests} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(p, "test", "rules", "rules_test.yaml")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err == nil {
		t.Fatalf("promtool passed rules with the wrong threshold:\n%s", out)
	}
}

// TestDashboardQueriesParse: every panel's query is valid PromQL
// (promtool checks them as recording rules).
func TestDashboardQueriesParse(t *testing.T) {
	qs, err := monitoring.Queries(".")
	if err != nil {
		t.Fatal(err)
	}
	var g monitoring.RuleGroup
	g.Name = "dashboard"
	for i, q := range qs {
		if strings.HasPrefix(q.Where, "rules.yaml") {
			continue
		}
		if strings.TrimSpace(q.Expr) == "" {
			t.Errorf("%s: empty query", q.Where)
		}
		g.Rules = append(g.Rules, monitoring.Rule{Record: fmt.Sprintf("dashboard:query_%d", i), Expr: q.Expr})
	}
	if len(g.Rules) == 0 {
		t.Fatal("no dashboard queries found under dashboards/")
	}
	b, err := yaml.Marshal(monitoring.RuleGroups{Groups: []monitoring.RuleGroup{g}})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "dashboard-queries.yaml")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	run(t, ".", promtool(t), "check", "rules", path)
}

// prometheusRule is rules.yaml as a prometheus-operator PrometheusRule.
func prometheusRule(t *testing.T) []byte {
	t.Helper()
	rg, err := monitoring.LoadRules(".")
	if err != nil {
		t.Fatal(err)
	}
	obj := map[string]any{
		"apiVersion": "monitoring.coreos.com/v1",
		"kind":       "PrometheusRule",
		"metadata": map[string]any{
			"name": "krane", "namespace": "krane-ctrl",
			"labels": map[string]string{"app.kubernetes.io/part-of": "krane"},
		},
		"spec": rg,
	}
	b, err := yaml.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	header := "# Generated from rules.yaml by `go test ./deploy/monitoring -update`: edit\n# rules.yaml, not this file.\n"
	return append([]byte(header), b...)
}

// TestPrometheusRuleMatchesRules: the PrometheusRule carries exactly
// rules.yaml's groups.
func TestPrometheusRuleMatchesRules(t *testing.T) {
	want := prometheusRule(t)
	if *update {
		if err := os.WriteFile("prometheusrule.yaml", want, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile("prometheusrule.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("prometheusrule.yaml differs from rules.yaml: run `go test ./deploy/monitoring -run TestPrometheusRuleMatchesRules -update`")
	}
}

// TestEveryAlertHasItsProcedure: each alert says what it pages for, how
// bad it is, and links a section of docs/operating.md that exists.
func TestEveryAlertHasItsProcedure(t *testing.T) {
	rg, err := monitoring.LoadRules(".")
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile("../../docs/operating.md")
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^#+ (.+)$`).FindAllStringSubmatch(string(doc), -1) {
		a := strings.ToLower(strings.TrimSpace(m[1]))
		a = regexp.MustCompile(`[^a-z0-9 _-]`).ReplaceAllString(a, "")
		anchors[strings.ReplaceAll(a, " ", "-")] = true
	}
	alerts := 0
	for _, g := range rg.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			alerts++
			if s := r.Labels["severity"]; s != "critical" && s != "warning" {
				t.Errorf("alert %s: severity %q, want critical or warning", r.Alert, s)
			}
			for _, a := range []string{"summary", "description"} {
				if r.Annotations[a] == "" {
					t.Errorf("alert %s: no %s annotation", r.Alert, a)
				}
			}
			anchor, ok := strings.CutPrefix(r.Annotations["runbook_url"], "docs/operating.md#")
			if !ok || !anchors[anchor] {
				t.Errorf("alert %s: runbook_url %q is not a section of docs/operating.md", r.Alert, r.Annotations["runbook_url"])
			}
		}
	}
	if alerts == 0 {
		t.Fatal("rules.yaml has no alerts")
	}
}

// TestScrapeTargetsMatchTheManifests: the ServiceMonitor and PodMonitor
// select the base manifests' ctrl Service and krane pods by their labels
// and name ports those have.
func TestScrapeTargetsMatchTheManifests(t *testing.T) {
	mon, err := check.Render(".")
	if err != nil {
		t.Fatal(err)
	}
	var base []string
	for _, dir := range []string{"../base/control-plane", "../base/krane"} {
		objs, err := check.Render(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range objs {
			base = append(base, describe(o.GetKind(), o.GetNamespace(), o.GetLabels(), o.Object))
		}
	}
	for _, m := range mon {
		switch m.GetKind() {
		case "ServiceMonitor", "PodMonitor":
		default:
			continue
		}
		sel := m.Object["spec"].(map[string]any)["selector"].(map[string]any)["matchLabels"].(map[string]any)
		target := "Service"
		endpointsKey := "endpoints"
		if m.GetKind() == "PodMonitor" {
			target, endpointsKey = "Deployment", "podMetricsEndpoints"
		}
		for _, ep := range m.Object["spec"].(map[string]any)[endpointsKey].([]any) {
			port := ep.(map[string]any)["port"].(string)
			want := fmt.Sprintf("%s %s %v port %s", target, m.GetNamespace(), sel, port)
			if !slices.ContainsFunc(base, func(s string) bool { return matches(s, target, m.GetNamespace(), sel, port) }) {
				t.Errorf("%s %s: nothing in deploy/base is a %s", m.GetKind(), m.GetName(), want)
			}
		}
	}
}

// describe flattens an object to "Kind namespace labels ports" for
// matches (ports of a Service, or of a Deployment's pod template).
func describe(kind, ns string, labels map[string]string, obj map[string]any) string {
	var ports []string
	collect := func(list []any) {
		for _, p := range list {
			if n, ok := p.(map[string]any)["name"].(string); ok {
				ports = append(ports, n)
			}
		}
	}
	spec, _ := obj["spec"].(map[string]any)
	switch kind {
	case "Service":
		l, _ := spec["ports"].([]any)
		collect(l)
	case "Deployment":
		tmpl, _ := spec["template"].(map[string]any)
		meta, _ := tmpl["metadata"].(map[string]any)
		if pl, ok := meta["labels"].(map[string]any); ok {
			labels = map[string]string{}
			for k, v := range pl {
				labels[k], _ = v.(string)
			}
		}
		ps, _ := tmpl["spec"].(map[string]any)
		cs, _ := ps["containers"].([]any)
		for _, c := range cs {
			l, _ := c.(map[string]any)["ports"].([]any)
			collect(l)
		}
	}
	var ls []string
	for k, v := range labels {
		ls = append(ls, k+"="+v)
	}
	return fmt.Sprintf("%s|%s|%s|%s", kind, ns, strings.Join(ls, ","), strings.Join(ports, ","))
}

func matches(desc, kind, ns string, sel map[string]any, port string) bool {
	f := strings.Split(desc, "|")
	if f[0] != kind || f[1] != ns || !slices.Contains(strings.Split(f[3], ","), port) {
		return false
	}
	labels := strings.Split(f[2], ",")
	for k, v := range sel {
		if !slices.Contains(labels, k+"="+fmt.Sprint(v)) {
			return false
		}
	}
	return true
}

// TestMetricsReadsNamesNotLabels: the name extraction the metric
// existence test relies on.
func TestMetricsReadsNamesNotLabels(t *testing.T) {
	got := monitoring.Metrics(`sum by (kind) (rate(krane_host_applies_total{result="krane_fake"}[5m])) / on (instance) krane:recorded:rate5m + up{job="ctrl"} + go_sql_wait_count_total`)
	want := []string{"krane_host_applies_total", "go_sql_wait_count_total"}
	if !slices.Equal(got, want) {
		t.Fatalf("Metrics = %v, want %v", got, want)
	}
}

// TestScrapeConfigIsValid: the scrape jobs for a Prometheus without the
// operator load.
func TestScrapeConfigIsValid(t *testing.T) {
	b, err := os.ReadFile("scrape-config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "prometheus.yml")
	if err := os.WriteFile(path, append([]byte("global: {}\n"), b...), 0o644); err != nil {
		t.Fatal(err)
	}
	run(t, ".", promtool(t), "check", "config", path)
}
