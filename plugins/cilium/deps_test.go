package main

import (
	"os/exec"
	"strings"
	"testing"

	"krane.dev/internal/testenv/kubeenv"
)

const ciliumModule = "github.com/cilium/cilium"

// TestCiliumStaysInThisPlugin keeps cilium's large module tree out of what
// plugin authors (sdk/...) and the host binary link: only this plugin (and
// the sentinel plugin) may depend on it.
func TestCiliumStaysInThisPlugin(t *testing.T) {
	t.Run("sdk", func(t *testing.T) {
		assertNoCilium(t, "krane.dev/sdk/...")
	})
	t.Run("host", func(t *testing.T) {
		assertNoCilium(t, "krane.dev/cmd/krane")
	})
	t.Run("this plugin does link it", func(t *testing.T) {
		// Guards the check itself: were go list's output misread, the
		// assertions above would pass vacuously.
		if !strings.Contains(goList(t, "list", "-deps", "krane.dev/plugins/cilium"), ciliumModule+"/") {
			t.Errorf("go list -deps krane.dev/plugins/cilium does not mention %s", ciliumModule)
		}
	})
}

// TestCiliumVersionMatchesTheTestClusters: the tests install the CRD of
// kubeenv.CiliumVersion, so the types compiled in here must be that release.
func TestCiliumVersionMatchesTheTestClusters(t *testing.T) {
	got := strings.TrimSpace(goList(t, "list", "-m", "-f", "{{.Version}}", ciliumModule))
	if got != kubeenv.CiliumVersion {
		t.Errorf("go.mod requires %s %s, the test clusters run the CRD of %s: keep them equal", ciliumModule, got, kubeenv.CiliumVersion)
	}
}

func assertNoCilium(t *testing.T, pattern string) {
	t.Helper()
	out := goList(t, "list", "-deps", pattern)
	if n := len(strings.Fields(out)); n == 0 {
		t.Fatalf("go list -deps %s listed nothing", pattern)
	}
	for _, dep := range strings.Fields(out) {
		if dep == ciliumModule || strings.HasPrefix(dep, ciliumModule+"/") {
			t.Errorf("%s links %s; cilium belongs to the cilium and sentinel plugins only", pattern, dep)
		}
	}
}

func goList(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("go", args...).Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, stderr)
	}
	return string(out)
}
