// Package examples_test proves the example plugins are what their READMEs
// say: a folder a plugin author copies out of this repository and builds
// as a module of their own.
package examples_test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestConfigmapExampleBuildsAndPassesAsItsOwnModule copies
// sdk/examples/configmap into a temporary directory, makes it a module
// that requires krane.dev/sdk (replaced by this checkout's sdk, as an
// author would point at a release), and builds, vets and tests it there:
// an import of anything but the sdk (this repository's internal packages,
// say) fails the build.
func TestConfigmapExampleBuildsAndPassesAsItsOwnModule(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a module and starts a cluster")
	}
	sdkDir, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "krane-plugin-configmap")
	if err := os.CopyFS(dir, os.DirFS("configmap")); err != nil {
		t.Fatal(err)
	}
	gomod := fmt.Sprintf("module example.com/krane-plugin-configmap\n\ngo 1.26.0\n\nrequire krane.dev/sdk v0.0.0\n\nreplace krane.dev/sdk => %s\n", sdkDir)
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte(gomod), 0o644); err != nil {
		t.Fatal(err)
	}
	// The sdk's checksums cover everything the example needs: tidy then
	// resolves from the module cache, not the network.
	sums, err := os.ReadFile(filepath.Join(sdkDir, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "go.sum"), sums, 0o644); err != nil {
		t.Fatal(err)
	}
	run(t, dir, "go", "mod", "tidy")
	run(t, dir, "go", "vet", "./...")
	run(t, dir, "go", "build", "-o", filepath.Join(dir, "bin", "krane-plugin-configmap"), ".")
	out := run(t, dir, "go", "list", "-deps", ".")
	for _, dep := range strings.Fields(out) {
		if strings.HasPrefix(dep, "krane.dev/") && !strings.HasPrefix(dep, "krane.dev/sdk") {
			t.Errorf("the copied example depends on %s: it may import only krane.dev/sdk/...", dep)
		}
	}
	describe := run(t, dir, filepath.Join(dir, "bin", "krane-plugin-configmap"), "--describe")
	if !strings.Contains(describe, `"configmap.example.krane.dev"`) {
		t.Errorf("--describe of the copied build does not name the kind:\n%s", describe)
	}
	run(t, dir, "go", "test", "-count=1", "./...")
}

func run(t *testing.T, dir string, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	// Outside this repository's module settings: as an author's checkout.
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s (in the copied module): %v\n%s", name, strings.Join(args, " "), err, out.String())
	}
	return out.String()
}
