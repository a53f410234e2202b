package check_test

import (
	"strconv"
	"testing"

	"krane.dev/deploy/check"
	"krane.dev/internal/bench"
)

// TestHAOverlaySizedFromTheFigures: the HA overlay gives ctrl what the
// sizing table (computed from bench/results.json's fleet measurement)
// says for the fleet size its annotation names, so a new measurement
// that changes the table fails here until the overlay follows it.
func TestHAOverlaySizedFromTheFigures(t *testing.T) {
	objs, err := check.Render("../overlays/ha/control-plane")
	if err != nil {
		t.Fatal(err)
	}
	results, err := bench.ReadResults("../../bench/results.json")
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, o := range objs {
		if o.GetKind() != "Deployment" || o.GetLabels()["app.kubernetes.io/name"] != "ctrl" {
			continue
		}
		found = true
		n, err := strconv.Atoi(o.GetAnnotations()["krane.dev/sized-for-clusters"])
		if err != nil {
			t.Fatalf("Deployment %s: annotation krane.dev/sized-for-clusters: %v (ctrl-sizing.yaml sets it)", o.GetName(), err)
		}
		row, err := bench.SizingFor(results, n)
		if err != nil {
			t.Fatal(err)
		}
		parsed, err := check.Parse(objs)
		if err != nil {
			t.Fatal(err)
		}
		w, ok := parsed.WorkloadWith("ctrl")
		if !ok {
			t.Fatal("no workload runs a container named ctrl")
		}
		c, _ := w.Container("ctrl")
		got := map[string]string{
			"replicas":       strconv.Itoa(int(w.Replicas)),
			"cpu request":    c.Resources.Requests.Cpu().String(),
			"memory request": c.Resources.Requests.Memory().String(),
			"memory limit":   c.Resources.Limits.Memory().String(),
		}
		want := map[string]string{
			"replicas":       strconv.Itoa(row.Replicas),
			"cpu request":    row.CPURequest(),
			"memory request": row.MemoryRequest(),
			"memory limit":   row.MemoryLimit(),
		}
		for k, v := range want {
			if got[k] != v {
				t.Errorf("HA overlay, ctrl sized for %d clusters: %s %s, the sizing table says %s (docs/operating.md, Sizing; set it in deploy/overlays/ha/control-plane/ctrl-sizing.yaml)", n, k, got[k], v)
			}
		}
	}
	if !found {
		t.Fatal("the HA overlay renders no ctrl Deployment")
	}
}
