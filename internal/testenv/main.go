package testenv

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

var registry struct {
	mu      sync.Mutex
	workDir string
	stops   []func()
	stopped bool
}

// Main runs the package's tests, then stops every part started through this
// package. It keeps the work directory (process logs) when a test failed or
// KRANE_TESTENV_KEEP is set, and prints where it is.
func Main(m *testing.M) {
	code := m.Run()
	StopAll(code != 0)
	os.Exit(code)
}

// StopAll stops every part started through this package (in reverse
// order) and removes the work directory unless keep is set (or
// KRANE_TESTENV_KEEP), in which case it says where the logs are. Programs
// that use testenv outside tests (the demo) call it when they end.
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

// Shared is a part started once per test package on first use.
type Shared[T any] struct {
	once  sync.Once
	value T
	err   error
}

// Get starts the part with start on first use and returns it; a start error
// fails every test that asks for the part.
func (s *Shared[T]) Get(tb testing.TB, start func() (T, error)) T {
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
