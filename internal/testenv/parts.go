package testenv

import (
	"testing"

	"krane.dev/sdk/envtest"
)

// The process, work-directory and lifecycle machinery is the public test
// environment's (krane.dev/sdk/envtest), which plugin authors use too;
// this repository's own parts (MySQL, Restate, proxies) register with the
// same registry, so one Main stops everything.

// Process is a child process whose output goes to a log file and which
// dies with the test binary.
type Process = envtest.Process

// Shared is a part started once per test package on first use.
type Shared[T any] = envtest.Lazy[T]

// StartProcess starts bin with args and env (added to the test's own),
// appending its output to dir/<name>.log.
func StartProcess(dir, name, bin string, args, env []string) (*Process, error) {
	return envtest.StartProcess(dir, name, bin, args, env)
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort() (int, error) { return envtest.FreePort() }

// FreePorts returns n distinct free ports.
func FreePorts(n int) ([]int, error) { return envtest.FreePorts(n) }

// Main runs the package's tests, then stops every part started (see
// envtest.Main).
func Main(m *testing.M) { envtest.Main(m) }

// StopAll stops every part started and removes the work directory unless
// keep is set (see envtest.StopAll).
func StopAll(keep bool) { envtest.StopAll(keep) }

// OnStop registers f to run when Main finishes (in reverse order).
func OnStop(f func()) { envtest.OnStop(f) }

// WorkDir is the package-wide directory for data and process logs.
func WorkDir() (string, error) { return envtest.WorkDir() }

// SubDir makes a fresh directory under the work directory.
func SubDir(prefix string) (string, error) { return envtest.SubDir(prefix) }
