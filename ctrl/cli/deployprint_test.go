package cli

//lint:file-ignore SA1019 legacy-workload: removed no earlier than v0.3.0 (docs/compatibility.md); this file builds or reads the deprecated top-level workload fields

import (
	"bytes"
	"strings"
	"testing"

	clusterv1 "krane.dev/proto/krane/cluster/v1"
	ctrlv1 "krane.dev/proto/krane/ctrl/v1"
)

// TestDeployGetPrintsTheWorkload: `deploy get` reads what runs from
// DeploymentInfo.workload, not from the deprecated top-level copies, so a
// ctrl that stops filling those copies shows the same output. The copies
// here say something else, and must not be printed.
func TestDeployGetPrintsTheWorkload(t *testing.T) {
	d := &ctrlv1.DeploymentInfo{Id: "d1", Replicas: 3,
		Image: "stale:1", CpuMillicores: 1, MemoryMib: 1, EnvVars: map[string]string{"STALE": "x"},
		Workload: &clusterv1.Workload{Image: "app:2", CpuMillicores: 250, MemoryMib: 512, EnvVars: map[string]string{"B": "2", "A": "1"}}}
	var out bytes.Buffer
	printDeployment(&out, d)
	got := out.String()
	for _, want := range []string{"app:2", "3 replicas per region, 250m CPU, 512 MiB", "A, B"} {
		if !strings.Contains(got, want) {
			t.Errorf("deploy get output lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "stale") || strings.Contains(got, "STALE") {
		t.Errorf("deploy get printed the deprecated top-level fields:\n%s", got)
	}
}
