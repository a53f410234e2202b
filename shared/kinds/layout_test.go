package kinds_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestShippedBinariesLinkNoTestRig: what ctrl, krane, the sentinel and
// the built-in plugins share lives under shared/; internal/ holds the
// test rigs, benchmarks and tooling, and no shipped binary links any of
// it. A production package moved back beside the rigs fails here.
func TestShippedBinariesLinkNoTestRig(t *testing.T) {
	shipped := []string{"krane.dev/cmd/ctrl", "krane.dev/cmd/krane", "krane.dev/cmd/krane-sentinel",
		"krane.dev/plugins/deployment", "krane.dev/plugins/sentinel", "krane.dev/plugins/cilium"}
	out, err := exec.Command("go", append([]string{"list", "-deps", "-f", "{{.ImportPath}}"}, shipped...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	var rigs []string
	for _, p := range strings.Fields(string(out)) {
		if strings.HasPrefix(p, "krane.dev/internal/") {
			rigs = append(rigs, p)
		}
	}
	if len(rigs) > 0 {
		t.Fatalf("shipped binaries link packages of internal/ (test rigs and tooling): %v; move what production code needs under shared/", rigs)
	}
}
