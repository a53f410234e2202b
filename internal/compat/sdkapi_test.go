package compat_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"krane.dev/internal/compat"
)

// TestSDKAPIStaysCompatible: no exported API of the sdk that the baseline
// release offered changed incompatibly (golang.org/x/exp/apidiff), so a
// plugin author's code built on the baseline sdk still compiles. An
// incompatible change needs a new major version (module
// krane.dev/sdk/v2) and a migration note in sdk/CHANGELOG.md
// (docs/compatibility.md).
func TestSDKAPIStaysCompatible(t *testing.T) {
	root, src, r := baseline(t)
	old, err := compat.LoadSDK(filepath.Join(src, "sdk"))
	if err != nil {
		t.Fatal(err)
	}
	cur, err := compat.LoadSDK(filepath.Join(root, "sdk"))
	if err != nil {
		t.Fatal(err)
	}
	incompatible, compatible := compat.SDKChanges(old, cur)
	for _, c := range incompatible {
		t.Errorf("the sdk's API changed incompatibly since %s: %s (keep the old form beside the new, or release krane.dev/sdk/v2 with a note in sdk/CHANGELOG.md)", r.Version, c)
	}
	t.Logf("compatible changes since %s: %d", r.Version, len(compatible))
	for _, c := range compatible {
		t.Log("  " + c)
	}
}

// TestSDKAPIGateNegativeControl: a changed exported signature in a copy
// of the sdk fails the gate, naming it.
func TestSDKAPIGateNegativeControl(t *testing.T) {
	root, _, _ := baseline(t)
	dir := filepath.Join(t.TempDir(), "sdk")
	if err := os.CopyFS(dir, os.DirFS(filepath.Join(root, "sdk"))); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "errors.go")
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	const from = "func Permanent(err error) error {"
	if !strings.Contains(string(b), from) {
		t.Fatalf("%s no longer declares %q: pick another signature to change", p, from)
	}
	// A variadic parameter more: every call still compiles, but the
	// function's type changed (a plugin holding it as a value breaks).
	if err := os.WriteFile(p, []byte(strings.Replace(string(b), from, "func Permanent(err error, _ ...int) error {", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	cur, err := compat.LoadSDK(filepath.Join(root, "sdk"))
	if err != nil {
		t.Fatal(err)
	}
	changed, err := compat.LoadSDK(dir)
	if err != nil {
		t.Fatal(err)
	}
	incompatible, _ := compat.SDKChanges(cur, changed)
	if !strings.Contains(strings.Join(incompatible, "\n"), "Permanent") {
		t.Errorf("a changed exported signature: the gate found %v", incompatible)
	}
}

// TestBaselineExampleBuildsOnThisSDK: the baseline's example plugin,
// copied into a module of its own as a plugin author's would be, builds
// and its tests compile against this tree's sdk.
func TestBaselineExampleBuildsOnThisSDK(t *testing.T) {
	root, src, r := baseline(t)
	dir := t.TempDir()
	if err := os.CopyFS(dir, os.DirFS(filepath.Join(src, "sdk", "examples", "configmap"))); err != nil {
		t.Fatal(err)
	}
	mod := "module example.com/configmap\n\ngo 1.26.0\n\nrequire krane.dev/sdk v0.0.0\n\nreplace krane.dev/sdk => " + filepath.Join(root, "sdk") + "\n"
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte(mod), 0o644); err != nil {
		t.Fatal(err)
	}
	sum, err := os.ReadFile(filepath.Join(root, "sdk", "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "go.sum"), sum, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"mod", "tidy"}, {"build", "./..."}, {"vet", "./..."}} {
		cmd := exec.Command("go", args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("the example plugin of %s against this sdk: go %s: %v\n%s", r.Version, strings.Join(args, " "), err, out)
		}
	}
}
