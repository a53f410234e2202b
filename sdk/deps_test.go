package sdk_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestSDKStaysLight keeps what a plugin author links small: sdk/ and its
// subpackages may not depend on the host, ctrl, Restate, MySQL or cilium.
func TestSDKStaysLight(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "krane.dev/sdk", "krane.dev/sdk/kube", "krane.dev/sdk/plugintest").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	forbidden := []string{"krane.dev/host", "krane.dev/ctrl", "github.com/restatedev/", "github.com/go-sql-driver/mysql", "github.com/cilium/cilium"}
	for _, dep := range strings.Fields(string(out)) {
		for _, f := range forbidden {
			if strings.HasPrefix(dep, f) {
				t.Errorf("sdk depends on %s (forbidden prefix %s)", dep, f)
			}
		}
	}
}
