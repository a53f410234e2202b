package kubeenv

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// CiliumVersion is the cilium release whose CiliumNetworkPolicy CRD the
// test clusters run; the cilium plugin's tests check that go.mod requires
// the same version, so the CRD and the plugin's types never drift apart.
const CiliumVersion = "v1.18.6"

// CiliumCRDPath fetches the cilium module (module proxy, cached) and returns
// the path of its CiliumNetworkPolicy CRD manifest.
func CiliumCRDPath() (string, error) {
	cmd := exec.Command("go", "mod", "download", "-json", "github.com/cilium/cilium@"+CiliumVersion)
	cmd.Dir = os.TempDir() // outside any module: no go.mod is read or changed
	cmd.Env = append(os.Environ(), "GOFLAGS=", "GOWORK=off")
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			err = fmt.Errorf("%v: %s", err, ee.Stderr)
		}
		return "", fmt.Errorf("testenv: fetch github.com/cilium/cilium@%s through the Go module proxy: %w", CiliumVersion, err)
	}
	var mod struct{ Dir string }
	if err := json.Unmarshal(out, &mod); err != nil || mod.Dir == "" {
		return "", fmt.Errorf("testenv: go mod download returned no directory for cilium: %s", out)
	}
	p := filepath.Join(mod.Dir, "pkg", "k8s", "apis", "cilium.io", "client", "crds", "v2", "ciliumnetworkpolicies.yaml")
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("testenv: CiliumNetworkPolicy CRD not found in the cilium module: %w", err)
	}
	return p, nil
}
