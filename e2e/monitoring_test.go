package e2e

import (
	"fmt"
	"io"
	"net/http"
	"slices"
	"sort"
	"strings"
	"testing"

	"krane.dev/deploy/monitoring"
)

// families returns the metric families a /metrics endpoint exports (one
// "# TYPE" line each in the text format).
func families(t *testing.T, url string) map[string]bool {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s/metrics: %d, %v", url, resp.StatusCode, err)
	}
	out := map[string]bool{}
	for _, line := range strings.Split(string(body), "\n") {
		if rest, ok := strings.CutPrefix(line, "# TYPE "); ok {
			out[strings.Fields(rest)[0]] = true
		}
	}
	return out
}

// missingMetrics lists the referenced metrics no family in have holds.
func missingMetrics(referenced map[string][]string, have map[string]bool) []string {
	var missing []string
	for name, where := range referenced {
		if !have[monitoring.Family(name, have)] {
			missing = append(missing, fmt.Sprintf("%s (read by %s)", name, strings.Join(where, "; ")))
		}
	}
	sort.Strings(missing)
	return missing
}

// TestMonitoringNamesRealMetrics: every metric the shipped alerts,
// recording rules and dashboard panels read (deploy/monitoring) is
// exported by a running ctrl or krane, after a deploy, so a renamed
// metric fails here rather than leaving an alert that can never fire.
// Its negative control: a name with one letter changed is reported.
func TestMonitoringNamesRealMetrics(t *testing.T) {
	st := sharedStack(t)
	deployJSON(t, st, "e2e-monitoring", "registry.local/e2e/monitoring:1", 1)
	referenced, err := monitoring.Referenced("../deploy/monitoring")
	if err != nil {
		t.Fatal(err)
	}
	if len(referenced) < 20 {
		t.Fatalf("deploy/monitoring reads %d metrics; expected the rules and dashboard to read more: is the extraction broken?", len(referenced))
	}
	have := families(t, st.CtrlHTTP)
	for _, url := range st.KraneHTTP {
		for name := range families(t, url) {
			have[name] = true
		}
	}
	if missing := missingMetrics(referenced, have); len(missing) > 0 {
		t.Fatalf("deploy/monitoring reads metrics neither ctrl nor krane exports:\n  %s", strings.Join(missing, "\n  "))
	}
	names := make([]string, 0, len(referenced))
	for n := range referenced {
		names = append(names, n)
	}
	slices.Sort(names)
	t.Logf("all %d metrics the rules and dashboard read are exported: %s", len(names), strings.Join(names, ", "))

	renamed := map[string][]string{"krane_ctrl_region_lag_seconds_maxx": {"a renamed metric"}}
	if missing := missingMetrics(renamed, have); len(missing) != 1 {
		t.Fatalf("negative control: a renamed metric was not reported missing (%v)", missing)
	}
}
