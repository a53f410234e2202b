package agent_test

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"krane.dev/host/config"
	"krane.dev/internal/testenv"
)

// noopPlugins is a plugin directory of the test's own holding a copy (not
// a link: a test may replace one) of the noop plugin under each name.
func noopPlugins(t *testing.T, names ...string) string {
	t.Helper()
	src := testenv.Build(t, "krane.dev/internal/testplugins/noop/plugin", "krane-plugin-noop")
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for _, n := range names {
		if err := os.WriteFile(filepath.Join(dir, "krane-plugin-"+n), b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// startNoop runs a host with one controller, noop-a, until it is ready
// and returns its plugin's process id.
func startNoop(t *testing.T) (*harness, int) {
	t.Helper()
	h := newHostHarness(t, `controller "noop-a" {}`, noopPlugins(t, "noop-a"))
	h.start()
	h.waitReady()
	return h, h.agent.Plugin("noop-a").Pid()
}

func (h *harness) waitReady() {
	h.t.Helper()
	eventually(h.t, 60*time.Second, "ready", func() error {
		if ok, why := h.agent.Ready(); !ok {
			return fmt.Errorf("%v", why)
		}
		return nil
	})
}

// TestFailedReloadKeepsTheRunningHost: a reload whose new ctrl connection
// cannot be built (its CA file is not there yet) changes nothing: the
// running controllers keep running on the old connection, the host stays
// ready, and the same reload tried again fails again instead of being
// taken for "no change".
func TestFailedReloadKeepsTheRunningHost(t *testing.T) {
	h, pid := startNoop(t)

	bad := h.load()
	bad.ControlPlane.URL = "https://127.0.0.1:1"
	bad.ControlPlane.CAFile = filepath.Join(h.dir, "ca-not-there-yet.pem")
	for attempt := range 2 {
		err := h.agent.Reload(bad)
		if err == nil || !strings.Contains(err.Error(), "ca_file") {
			t.Fatalf("reload %d with a missing CA file: err = %v, want one naming ca_file", attempt+1, err)
		}
		p := h.agent.Plugin("noop-a")
		if p == nil || p.Pid() != pid {
			t.Fatalf("reload %d failed, yet the running controller was stopped or restarted", attempt+1)
		}
		if ok, why := h.agent.Ready(); !ok {
			t.Fatalf("not ready after a failed reload: %v", why)
		}
	}
	// Still syncing on the old connection.
	h.ctrl.PutJSON("noop-a.test.krane.dev", "after", map[string]any{"x": 1.0})
	loop := h.agent.Loop("noop-a.test.krane.dev")
	eventually(t, 30*time.Second, "a change after the failed reload", func() error {
		if c, head := loop.Cursor(), h.ctrl.Head(); c < head {
			return fmt.Errorf("cursor %d, head %d", c, head)
		}
		return nil
	})
	if err := syscall.Kill(pid, 0); err != nil {
		t.Errorf("plugin process %d gone: %v", pid, err)
	}
}

// TestShutdownSendsQueuedReports: status reports held back while ctrl was
// refusing them go out when the host stops gracefully, instead of dying
// with the process.
func TestShutdownSendsQueuedReports(t *testing.T) {
	h, _ := startNoop(t)
	h.ctrl.RefuseReports(true)
	const kind = "noop-a.test.krane.dev"
	for i := range 20 {
		h.ctrl.PutJSON(kind, fmt.Sprintf("o%d", i), map[string]any{"x": float64(i)})
	}
	eventually(t, 60*time.Second, "reports queued while ctrl refuses them", func() error {
		if d := h.metric("krane_host_report_queue_depth"); d < 20 {
			return fmt.Errorf("queue depth %v", d)
		}
		return nil
	})
	h.ctrl.RefuseReports(false)
	h.stop()
	for i := range 20 {
		if h.ctrl.LatestReport(kind, fmt.Sprintf("o%d", i)) == nil {
			t.Fatalf("o%d: its report was lost at shutdown", i)
		}
	}
}

// TestReloadAppliesTheLogLevelAndNamesWhatItCannot: a reload changes the
// host's own log level at once, without restarting a plugin, and says
// which settings only a restart applies instead of ignoring them.
func TestReloadAppliesTheLogLevelAndNamesWhatItCannot(t *testing.T) {
	h, pid := startNoop(t)
	cfg := h.load()
	cfg.Log.Level = "warn"
	cfg.Server.Listen = "127.0.0.1:1"
	if err := h.agent.Reload(cfg); err != nil {
		t.Fatal(err)
	}
	if got := h.logger.GetLevel(); got != hclog.Warn {
		t.Errorf("host log level after reload = %s, want warn", got)
	}
	if p := h.agent.Plugin("noop-a"); p == nil || p.Pid() != pid {
		t.Errorf("a log level change restarted the plugin")
	}
	logs := h.logs.String()
	if !strings.Contains(logs, "a reload cannot change this setting") || !strings.Contains(logs, "server.listen") {
		t.Errorf("the log does not name server.listen as needing a restart:\n%s", logs)
	}
}

// replaceBinary replaces a plugin binary in place the way an upgrade does
// (a new file renamed over the old one): same path, new content.
func replaceBinary(t *testing.T, path string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	tmp := path + ".new"
	if err := os.WriteFile(tmp, append(b, []byte("\x00a newer build")...), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// TestReloadRestartsAPluginWhoseBinaryChanged: a plugin binary replaced
// in place, with its controller block unchanged, is restarted by the next
// reload, and only it; a reload with nothing changed restarts nothing.
func TestReloadRestartsAPluginWhoseBinaryChanged(t *testing.T) {
	plugins := noopPlugins(t, "noop-a", "noop-b")
	h := newHostHarness(t, `controller "noop-a" {}
controller "noop-b" {}`, plugins)
	h.start()
	h.waitReady()
	pidA, pidB := h.agent.Plugin("noop-a").Pid(), h.agent.Plugin("noop-b").Pid()

	h.reload()
	if h.agent.Plugin("noop-a").Pid() != pidA || h.agent.Plugin("noop-b").Pid() != pidB {
		t.Fatalf("a reload with nothing changed restarted a plugin")
	}
	replaceBinary(t, filepath.Join(plugins, "krane-plugin-noop-a"))
	h.reload()
	eventually(t, 60*time.Second, "noop-a restarted from its new binary", func() error {
		p := h.agent.Plugin("noop-a")
		if p == nil || p.Pid() == 0 || p.Pid() == pidA {
			return fmt.Errorf("noop-a not restarted")
		}
		return nil
	})
	if h.agent.Plugin("noop-b").Pid() != pidB {
		t.Errorf("noop-b was restarted, though only noop-a's binary changed")
	}
	h.waitReady()
	if !strings.Contains(h.logs.String(), "plugin binary changed on disk") {
		t.Errorf("the log does not say why noop-a restarted")
	}
}

// TestNoLeakAfterResyncsAndReloads: a host's goroutines and its open
// streams to ctrl after 100 resyncs and 20 reloads (controllers restarted,
// the ctrl connection rebuilt) are what they were after the first
// bootstrap, give or take a small constant.
func TestNoLeakAfterResyncsAndReloads(t *testing.T) {
	controllers := func(label string) string {
		return fmt.Sprintf(`controller "noop-a" {
  config { label = %q }
}
controller "noop-b" {}`, label)
	}
	h := newHostHarness(t, controllers("0"), noopPlugins(t, "noop-a", "noop-b"))
	for i := range 20 {
		h.ctrl.PutJSON("noop-a.test.krane.dev", fmt.Sprintf("a%d", i), map[string]any{"i": float64(i)})
		h.ctrl.PutJSON("noop-b.test.krane.dev", fmt.Sprintf("b%d", i), map[string]any{"i": float64(i)})
	}
	h.start()
	h.waitReady()
	settle := func() (goroutines, streams int) {
		// Between passes goroutines come and go (a resync's listing, a
		// report batch): take the lowest of a few samples.
		goroutines = runtime.NumGoroutine()
		for range 20 {
			time.Sleep(10 * time.Millisecond)
			goroutines = min(goroutines, runtime.NumGoroutine())
		}
		return goroutines, h.ctrl.OpenStreams()
	}
	baseG, baseS := settle()
	check := func(after string) {
		t.Helper()
		var g, s int
		eventually(t, 60*time.Second, "goroutines and streams back to where they were after the first bootstrap", func() error {
			g, s = settle()
			if g > baseG+25 || s != baseS {
				return fmt.Errorf("after %s: %d goroutines and %d open streams; after the first bootstrap %d and %d", after, g, s, baseG, baseS)
			}
			return nil
		})
		t.Logf("goroutines %d -> %d, open streams %d -> %d after %s", baseG, g, baseS, s, after)
	}

	const kind = "noop-b.test.krane.dev"
	resyncs := func() float64 { return h.metric(`krane_host_resync_seconds_count{kind="` + kind + `"}`) }
	for range 100 {
		before := resyncs()
		h.agent.Loop(kind).Resync()
		eventually(t, 30*time.Second, "a resync pass", func() error {
			if resyncs() <= before {
				return fmt.Errorf("resync not done")
			}
			return nil
		})
	}
	check("100 resyncs")
	url := h.ctrl.URL()
	for i := range 20 {
		cfg := func() *config.Config {
			h.writeConfig(controllers(fmt.Sprint(i)), "")
			return h.load()
		}()
		if i%2 == 1 { // every other reload rebuilds the ctrl connection
			cfg.ControlPlane.URL = strings.Replace(url, "127.0.0.1", "localhost", 1)
			url = cfg.ControlPlane.URL
		} else {
			cfg.ControlPlane.URL = url
		}
		if err := h.agent.Reload(cfg); err != nil {
			t.Fatal(err)
		}
		h.waitReady()
		url = strings.Replace(url, "localhost", "127.0.0.1", 1)
	}
	check("100 resyncs and 20 reloads")
}
