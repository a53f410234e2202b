package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"krane.dev/sdk/envtest"
)

// Versions of the external parts; keep in step with the Makefile.
const (
	KubeVersion    = envtest.KubeVersion
	RestateVersion = "1.7.12"
)

// CacheDir is where `make testenv` puts binaries (see envtest.CacheDir).
func CacheDir() string { return envtest.CacheDir() }

// KubeBinDir holds etcd, kube-apiserver, kube-controller-manager,
// kube-scheduler and kwok.
func KubeBinDir() string { return envtest.KubeBinDir() }

// RestateServerBin is the restate-server binary installed from npm.
func RestateServerBin() string {
	if b := os.Getenv("RESTATE_SERVER_BIN"); b != "" {
		return b
	}
	return filepath.Join(CacheDir(), "tools", "restate-"+RestateVersion,
		"node_modules", "@restatedev", "restate-server-linux-x64", "bin", "restate-server")
}

// MissingBinaryError says which binary is missing and how to get it.
type MissingBinaryError = envtest.MissingBinaryError

// KubeBinary returns the path of one Kubernetes test binary.
func KubeBinary(name string) (string, error) { return envtest.KubeBinary(name) }

// lookPath finds the first of names in PATH or in the sbin directories that
// Debian's server packages use.
func lookPath(names ...string) (string, error) {
	for _, n := range names {
		if p, err := exec.LookPath(n); err == nil {
			return p, nil
		}
		for _, dir := range []string{"/usr/sbin", "/usr/local/sbin", "/usr/local/mysql/bin"} {
			if p := filepath.Join(dir, n); isExecutable(p) {
				return p, nil
			}
		}
	}
	return "", exec.ErrNotFound
}

func isExecutable(p string) bool { return envtest.IsExecutable(p) }

var builds sync.Map // package path + name -> *buildResult

type buildResult struct {
	once sync.Once
	path string
	err  error
}

// Build compiles a main package of this module (an import path such as
// "krane.dev/cmd/krane") once per test binary and returns the path of the
// binary, named name.
func Build(tb testing.TB, pkg, name string) string {
	tb.Helper()
	p, err := BuildBinary(pkg, name)
	if err != nil {
		tb.Fatal(err)
	}
	return p
}

// BuildBinary is Build for programs (the demo): it returns the error.
func BuildBinary(pkg, name string) (string, error) {
	v, _ := builds.LoadOrStore(pkg+"\x00"+name, &buildResult{})
	r := v.(*buildResult)
	r.once.Do(func() {
		dir, err := SubDir("bin")
		if err != nil {
			r.err = err
			return
		}
		r.path = filepath.Join(dir, name)
		// Stamped like `make build`, so the binaries place themselves in
		// the skew window (shared/version) as a release's would.
		cmd := exec.Command("go", "build", "-ldflags", "-X krane.dev/shared/version.Version="+BuildVersion(), "-o", r.path, pkg)
		if out, err := cmd.CombinedOutput(); err != nil {
			r.err = fmt.Errorf("testenv: go build %s: %v\n%s", pkg, err, out)
		}
	})
	return r.path, r.err
}

var buildVersion = sync.OnceValue(func() string {
	root, err := RepoRoot()
	if err != nil {
		return "dev"
	}
	out, err := exec.Command(filepath.Join(root, "scripts", "version.sh")).Output()
	if err != nil {
		return "dev"
	}
	return strings.TrimSpace(string(out))
})

// BuildVersion is the version `make build` stamps into the binaries of
// this checkout (scripts/version.sh), "dev" outside a git checkout.
func BuildVersion() string { return buildVersion() }

// RepoRoot is the directory of the repository's go.mod, found from the
// working directory up (a test's working directory is its package's).
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && strings.HasPrefix(string(b), "module krane.dev\n") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("not inside the krane repository (no go.mod of module krane.dev above the working directory)")
		}
		dir = parent
	}
}
