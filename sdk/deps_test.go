package sdk_test

import (
	"os/exec"
	"strings"
	"testing"
)

var forbidden = []string{"krane.dev/host", "krane.dev/ctrl", "krane.dev/internal", "krane.dev/plugins", "krane.dev/proto",
	"github.com/restatedev/", "github.com/go-sql-driver/mysql", "github.com/cilium/cilium"}

// TestSDKStaysLight keeps what a plugin author links small: the sdk's
// packages may not depend on the host, ctrl, the rest of this repository,
// Restate, MySQL or cilium.
func TestSDKStaysLight(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "krane.dev/sdk", "krane.dev/sdk/kube", "krane.dev/sdk/plugintest", "krane.dev/sdk/envtest").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, dep := range strings.Fields(string(out)) {
		for _, f := range forbidden {
			if strings.HasPrefix(dep, f) {
				t.Errorf("sdk depends on %s (forbidden prefix %s)", dep, f)
			}
		}
	}
}

// TestSDKModuleStaysLight: a plugin author's go.mod requires only the sdk
// module, so what it downloads is the sdk module's own requirements.
func TestSDKModuleStaysLight(t *testing.T) {
	out, err := exec.Command("go", "list", "-m", "all").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -m all: %v\n%s", err, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] == "krane.dev/sdk" {
			continue
		}
		mod := f[0]
		for _, bad := range forbidden {
			if strings.HasPrefix(mod, strings.TrimSuffix(bad, "/")) {
				t.Errorf("the sdk module requires %s (forbidden prefix %s)", mod, bad)
			}
		}
	}
}
