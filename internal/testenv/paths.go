package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

// Versions of the external parts; keep in step with the Makefile.
const (
	KubeVersion    = "1.36.3"
	RestateVersion = "1.7.12"
)

// CacheDir is where `make testenv` puts binaries:
// $KRANE_CACHE_DIR, else $XDG_CACHE_HOME/krane, else ~/.cache/krane.
func CacheDir() string {
	if d := os.Getenv("KRANE_CACHE_DIR"); d != "" {
		return d
	}
	if d := os.Getenv("XDG_CACHE_HOME"); d != "" {
		return filepath.Join(d, "krane")
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return filepath.Join(os.TempDir(), "krane-cache")
	}
	return filepath.Join(home, ".cache", "krane")
}

// KubeBinDir holds etcd, kube-apiserver, kube-controller-manager,
// kube-scheduler and kwok.
func KubeBinDir() string {
	if d := os.Getenv("KRANE_KUBE_BIN_DIR"); d != "" {
		return d
	}
	return filepath.Join(CacheDir(), "testenv", "k8s-v"+KubeVersion, "bin")
}

// RestateServerBin is the restate-server binary installed from npm.
func RestateServerBin() string {
	if b := os.Getenv("RESTATE_SERVER_BIN"); b != "" {
		return b
	}
	return filepath.Join(CacheDir(), "tools", "restate-"+RestateVersion,
		"node_modules", "@restatedev", "restate-server-linux-x64", "bin", "restate-server")
}

// MissingBinaryError says which binary is missing and how to get it.
type MissingBinaryError struct {
	Binary string
	Looked string
	Fix    string
}

func (e *MissingBinaryError) Error() string {
	return fmt.Sprintf("testenv: %s not found (looked in %s): %s", e.Binary, e.Looked, e.Fix)
}

// KubeBinary returns the path of one Kubernetes test binary.
func KubeBinary(name string) (string, error) {
	p := filepath.Join(KubeBinDir(), name)
	if isExecutable(p) {
		return p, nil
	}
	return "", &MissingBinaryError{Binary: name, Looked: KubeBinDir(), Fix: "run `make testenv` to build the Kubernetes test binaries through the Go module proxy"}
}

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

func isExecutable(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir() && st.Mode()&0o111 != 0
}

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
		cmd := exec.Command("go", "build", "-o", r.path, pkg)
		if out, err := cmd.CombinedOutput(); err != nil {
			r.err = fmt.Errorf("testenv: go build %s: %v\n%s", pkg, err, out)
		}
	})
	return r.path, r.err
}
