package envtest

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// KubeVersion is the Kubernetes release whose binaries the clusters run.
const KubeVersion = "1.36.3"

var registry struct {
	mu      sync.Mutex
	workDir string
	stops   []func()
	stopped bool
}

// Main runs the package's tests, then stops every part started through
// this package. It keeps the work directory (process logs) when a test
// failed or KRANE_TESTENV_KEEP is set, and prints where it is. Call it from
// TestMain:
//
//	func TestMain(m *testing.M) { envtest.Main(m) }
func Main(m *testing.M) {
	code := m.Run()
	StopAll(code != 0)
	os.Exit(code)
}

// StopAll stops every part started through this package (in reverse
// order) and removes the work directory unless keep is set (or
// KRANE_TESTENV_KEEP), in which case it says where the logs are. Programs
// that use the parts outside tests call it when they end.
func StopAll(keep bool) {
	registry.mu.Lock()
	stops := registry.stops
	registry.stops = nil
	registry.stopped = true
	dir := registry.workDir
	registry.mu.Unlock()
	for i := len(stops) - 1; i >= 0; i-- {
		stops[i]()
	}
	if dir != "" {
		if keep || os.Getenv("KRANE_TESTENV_KEEP") != "" {
			fmt.Fprintf(os.Stderr, "testenv: process logs kept in %s\n", dir)
		} else {
			os.RemoveAll(dir)
		}
	}
}

// OnStop registers f to run when Main finishes (in reverse order).
func OnStop(f func()) {
	registry.mu.Lock()
	defer registry.mu.Unlock()
	registry.stops = append(registry.stops, f)
}

// WorkDir is the package-wide directory for data and process logs.
func WorkDir() (string, error) {
	registry.mu.Lock()
	defer registry.mu.Unlock()
	if registry.stopped {
		return "", errStopped
	}
	if registry.workDir == "" {
		name := strings.NewReplacer("/", "-", ".", "-").Replace(filepath.Base(os.Args[0]))
		dir, err := os.MkdirTemp("", "krane-testenv-"+strings.TrimSuffix(name, "-test")+"-")
		if err != nil {
			return "", err
		}
		registry.workDir = dir
	}
	return registry.workDir, nil
}

// SubDir makes a fresh directory under the work directory.
func SubDir(prefix string) (string, error) {
	root, err := WorkDir()
	if err != nil {
		return "", err
	}
	return os.MkdirTemp(root, prefix+"-")
}

// Lazy is a part started once per test package on first use.
type Lazy[T any] struct {
	once  sync.Once
	value T
	err   error
}

// Get starts the part with start on first use and returns it; a start error
// fails every test that asks for the part.
func (s *Lazy[T]) Get(tb testing.TB, start func() (T, error)) T {
	tb.Helper()
	s.once.Do(func() {
		begin := time.Now()
		s.value, s.err = start()
		if s.err == nil {
			tb.Logf("testenv: %T ready in %s", s.value, time.Since(begin).Round(time.Millisecond))
		}
	})
	if s.err != nil {
		tb.Fatal(s.err)
	}
	return s.value
}

// CacheDir is where the test binaries are installed:
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
// kube-scheduler and kwok: $KRANE_KUBE_BIN_DIR, else
// CacheDir()/testenv/k8s-v<KubeVersion>/bin.
func KubeBinDir() string {
	if d := os.Getenv("KRANE_KUBE_BIN_DIR"); d != "" {
		return d
	}
	return filepath.Join(CacheDir(), "testenv", "k8s-v"+KubeVersion, "bin")
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

// InstallHint is how the Kubernetes test binaries are installed.
const InstallHint = "install the Kubernetes test binaries: `go run krane.dev/sdk/envtest/setup` (or `make testenv` in the krane repository) builds them through the Go module proxy into the cache; or point KRANE_KUBE_BIN_DIR at a directory holding them"

// KubeBinary returns the path of one Kubernetes test binary.
func KubeBinary(name string) (string, error) {
	p := filepath.Join(KubeBinDir(), name)
	if IsExecutable(p) {
		return p, nil
	}
	return "", &MissingBinaryError{Binary: name, Looked: KubeBinDir(), Fix: InstallHint}
}

// IsExecutable reports whether p is an executable file.
func IsExecutable(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir() && st.Mode()&0o111 != 0
}
