package supervisor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"krane.dev/host/config"
	"krane.dev/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// These tests run the real noop plugin binary under the supervisor, and
// make it crash (SIGKILL), hang (SIGSTOP) or mismatch its pin.

// noopBinary is a copy of the noop plugin named krane-plugin-<name>.
func noopBinary(t *testing.T, name string) string {
	t.Helper()
	src := testenv.Build(t, "krane.dev/internal/testplugins/noop/plugin", "krane-plugin-noop")
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "krane-plugin-"+name)
	if err := os.WriteFile(p, b, 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// fastTimings shortens the supervisor's timings for the test.
func fastTimings(t *testing.T) {
	saved := []time.Duration{RestartMin, RestartMax, StableAfter, ShutdownTimeout}
	RestartMin, RestartMax, StableAfter, ShutdownTimeout = 20*time.Millisecond, 160*time.Millisecond, time.Hour, time.Second
	t.Cleanup(func() {
		RestartMin, RestartMax, StableAfter, ShutdownTimeout = saved[0], saved[1], saved[2], saved[3]
	})
}

type supervised struct {
	t       *testing.T
	p       *Plugin
	metrics *Metrics
	cancel  context.CancelFunc
}

// supervise runs a supervisor for the binary at path until the test ends.
func supervise(t *testing.T, ctl config.Controller) *supervised {
	t.Helper()
	if ctl.Name == "" {
		ctl.Name = strings.TrimPrefix(filepath.Base(ctl.Path), "krane-plugin-")
	}
	ctl.Enabled = true
	if ctl.Config == nil {
		ctl.Config = map[string]any{}
	}
	log := hclog.New(&hclog.LoggerOptions{Level: hclog.Debug, Output: io.Discard})
	if testing.Verbose() {
		log = hclog.New(&hclog.LoggerOptions{Level: hclog.Debug, Output: os.Stderr})
	}
	m := NewMetrics(prometheus.NewRegistry())
	p := New(ctl, Host{Region: "r1", ClusterID: "c1"}, Hooks{}, log, m)
	ctx, cancel := context.WithCancel(context.Background())
	go p.Run(ctx)
	s := &supervised{t: t, p: p, metrics: m, cancel: cancel}
	t.Cleanup(func() {
		cancel()
		select {
		case <-p.Done():
		case <-time.After(time.Minute):
			t.Errorf("the supervisor did not stop within a minute")
		}
	})
	return s
}

// waitPid waits until a plugin process other than not runs and returns it.
func (s *supervised) waitPid(not int) int {
	s.t.Helper()
	var pid int
	waitFor(s.t, "a plugin process running", func() error {
		pid = s.p.Pid()
		if pid == 0 || pid == not || !s.p.Running() {
			return fmt.Errorf("pid %d (not %d), running %v, last error %v", pid, not, s.p.Running(), s.p.LastError())
		}
		return nil
	})
	return pid
}

func waitFor(t *testing.T, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	var err error
	for time.Now().Before(deadline) {
		if err = cond(); err == nil {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s: %v", what, err)
}

// gone reports whether pid no longer runs (a zombie counts as gone).
func gone(pid int) bool {
	if err := syscall.Kill(pid, 0); err != nil {
		return true
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	fields := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	return len(fields) > 0 && fields[0] == "Z"
}

// TestRestartsACrashedPlugin: a plugin killed with SIGKILL is started
// again, and the restart is counted.
func TestRestartsACrashedPlugin(t *testing.T) {
	fastTimings(t)
	s := supervise(t, config.Controller{Path: noopBinary(t, "crashy")})
	pid := s.waitPid(0)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	s.waitPid(pid)
	if n := testutil.ToFloat64(s.metrics.Restarts.WithLabelValues("crashy")); n != 1 {
		t.Errorf("restarts = %v, want 1", n)
	}
	if err := s.p.LastError(); err != nil {
		t.Errorf("last error %v after a successful restart", err)
	}
}

// TestRestartBackoffGrows: a plugin that keeps failing to start is
// retried after delays doubling from RestartMin up to RestartMax.
func TestRestartBackoffGrows(t *testing.T) {
	fastTimings(t)
	script := filepath.Join(t.TempDir(), "krane-plugin-broken")
	if err := os.WriteFile(script, []byte("#!/bin/sh\necho 'not a plugin' >&2\nexit 3\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var delays []time.Duration
	s := supervise(t, config.Controller{Path: script})
	s.p.mu.Lock()
	s.p.onRestart = func(d time.Duration) {
		mu.Lock()
		delays = append(delays, d)
		mu.Unlock()
	}
	s.p.mu.Unlock()
	waitFor(t, "six restarts", func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(delays) < 6 {
			return fmt.Errorf("%d restarts", len(delays))
		}
		return nil
	})
	mu.Lock()
	defer mu.Unlock()
	// The hook may have missed the first failures: look for the doubling.
	for i := 1; i < len(delays); i++ {
		want := min(2*delays[i-1], RestartMax)
		if delays[i] != want {
			t.Fatalf("restart delays %v: %s after %s, want %s", delays, delays[i], delays[i-1], want)
		}
	}
	if last := delays[len(delays)-1]; last != RestartMax {
		t.Errorf("restart delays %v never reach RestartMax %s", delays, RestartMax)
	}
	if err := s.p.LastError(); err == nil {
		t.Errorf("no last error for a plugin that cannot start")
	}
}

// TestRestartsAHungPlugin: a plugin that is alive but answers nothing
// (stopped with SIGSTOP) fails its liveness checks, is killed and is
// started again, like a crashed one.
func TestRestartsAHungPlugin(t *testing.T) {
	fastTimings(t)
	fastLiveness(t)
	s := supervise(t, config.Controller{Path: noopBinary(t, "hangs")})
	pid := s.waitPid(0)
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGCONT) })
	s.waitPid(pid)
	waitFor(t, "the hung process killed", func() error {
		if !gone(pid) {
			return fmt.Errorf("process %d still there", pid)
		}
		return nil
	})
	if n := testutil.ToFloat64(s.metrics.Restarts.WithLabelValues("hangs")); n != 1 {
		t.Errorf("restarts = %v, want 1", n)
	}
}

// TestRefusesABinaryThatDoesNotMatchItsPin: a sha256 pin that does not
// match the binary keeps the plugin from running, with an error that says
// so and how to fix it.
func TestRefusesABinaryThatDoesNotMatchItsPin(t *testing.T) {
	fastTimings(t)
	bin := noopBinary(t, "pinned")
	digest, err := config.FileSHA256(bin)
	if err != nil {
		t.Fatal(err)
	}
	s := supervise(t, config.Controller{Path: bin, SHA256: []string{strings.Repeat("0", 64)}})
	waitFor(t, "the pin refused", func() error {
		err := s.p.LastError()
		if err == nil || !strings.Contains(err.Error(), "has sha256 "+digest+", which its pin does not list") || !strings.Contains(err.Error(), "update sha256 in krane.hcl") {
			return fmt.Errorf("last error %v", err)
		}
		return nil
	})
	if s.p.Running() {
		t.Errorf("a plugin whose binary does not match its pin is running")
	}
}

// TestShutdownDeadlineThenKill: a plugin that does not answer its
// Shutdown within ShutdownTimeout is killed, and the supervisor stops.
func TestShutdownDeadlineThenKill(t *testing.T) {
	fastTimings(t)
	ShutdownTimeout = 300 * time.Millisecond
	s := supervise(t, config.Controller{Path: noopBinary(t, "stuck")})
	pid := s.waitPid(0)
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGCONT) })
	s.cancel()
	waitFor(t, "the supervisor stopped", func() error {
		select {
		case <-s.p.Done():
			return nil
		default:
			return errors.New("still stopping")
		}
	})
	waitFor(t, "the process killed", func() error {
		if !gone(pid) {
			return fmt.Errorf("process %d still there", pid)
		}
		return nil
	})
}

// fastLiveness checks every 100ms, each check given 200ms.
func fastLiveness(t *testing.T) {
	interval, timeout, failures := LivenessInterval, LivenessTimeout, LivenessFailures
	LivenessInterval, LivenessTimeout, LivenessFailures = 100*time.Millisecond, 200*time.Millisecond, 3
	t.Cleanup(func() { LivenessInterval, LivenessTimeout, LivenessFailures = interval, timeout, failures })
}
