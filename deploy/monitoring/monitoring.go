package monitoring

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"sigs.k8s.io/yaml"
)

// RuleGroups is a Prometheus rule file.
type RuleGroups struct {
	Groups []RuleGroup `json:"groups"`
}

// RuleGroup is one group of a rule file.
type RuleGroup struct {
	Name     string `json:"name"`
	Interval string `json:"interval,omitempty"`
	Rules    []Rule `json:"rules"`
}

// Rule is a recording rule (Record) or an alert (Alert).
type Rule struct {
	Record      string            `json:"record,omitempty"`
	Alert       string            `json:"alert,omitempty"`
	Expr        string            `json:"expr"`
	For         string            `json:"for,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// Query is one PromQL expression the shipped files run, and where.
type Query struct {
	Where string // "rules.yaml: alert KraneDeliveryLagging", "dashboard: panel Applies"
	Expr  string
}

// LoadRules reads dir/rules.yaml.
func LoadRules(dir string) (RuleGroups, error) {
	var rg RuleGroups
	b, err := os.ReadFile(filepath.Join(dir, "rules.yaml"))
	if err != nil {
		return rg, err
	}
	if err := yaml.UnmarshalStrict(b, &rg); err != nil {
		return rg, fmt.Errorf("%s: %w", filepath.Join(dir, "rules.yaml"), err)
	}
	return rg, nil
}

// Queries returns every expression of dir's rules and dashboards.
func Queries(dir string) ([]Query, error) {
	rg, err := LoadRules(dir)
	if err != nil {
		return nil, err
	}
	var qs []Query
	for _, g := range rg.Groups {
		for _, r := range g.Rules {
			what := "record " + r.Record
			if r.Alert != "" {
				what = "alert " + r.Alert
			}
			qs = append(qs, Query{Where: "rules.yaml: " + what, Expr: r.Expr})
		}
	}
	dashboards, err := filepath.Glob(filepath.Join(dir, "dashboards", "*.json"))
	if err != nil {
		return nil, err
	}
	for _, path := range dashboards {
		var d struct {
			Panels []struct {
				Title   string `json:"title"`
				Targets []struct {
					Expr string `json:"expr"`
				} `json:"targets"`
			} `json:"panels"`
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		if err := json.Unmarshal(b, &d); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		for _, p := range d.Panels {
			for _, t := range p.Targets {
				qs = append(qs, Query{Where: filepath.Base(path) + ": panel " + p.Title, Expr: t.Expr})
			}
		}
	}
	return qs, nil
}

var (
	quoted = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	ident  = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*`)
	// Words PromQL itself defines, and the series Prometheus makes up (up).
	promqlWords = map[string]bool{"up": true}
)

// Metrics returns the metric names an expression reads: identifiers
// that look like exported metrics (krane_, go_, process_), with a
// histogram's _bucket, _count and _sum folded into its name. Recorded
// series (with a ':') and labels are not metrics of ctrl or krane, so
// they are left out; so is `up`, which Prometheus makes.
func Metrics(expr string) []string {
	expr = quoted.ReplaceAllString(expr, `""`)
	var out []string
	for _, w := range ident.FindAllString(expr, -1) {
		if strings.Contains(w, ":") || promqlWords[w] {
			continue
		}
		if !strings.HasPrefix(w, "krane_") && !strings.HasPrefix(w, "go_") && !strings.HasPrefix(w, "process_") {
			continue
		}
		if !slices.Contains(out, w) {
			out = append(out, w)
		}
	}
	return out
}

// Referenced maps each metric dir's rules and dashboards read to where.
func Referenced(dir string) (map[string][]string, error) {
	qs, err := Queries(dir)
	if err != nil {
		return nil, err
	}
	out := map[string][]string{}
	for _, q := range qs {
		for _, m := range Metrics(q.Expr) {
			out[m] = append(out[m], q.Where)
		}
	}
	return out, nil
}

// Family returns the metric family a scraped name belongs to when it is
// one of a histogram's or summary's series (name_bucket of name), else
// name itself; candidates are the families a scrape holds.
func Family(name string, families map[string]bool) string {
	if families[name] {
		return name
	}
	for _, suffix := range []string{"_bucket", "_count", "_sum"} {
		if base, ok := strings.CutSuffix(name, suffix); ok && families[base] {
			return base
		}
	}
	return name
}
