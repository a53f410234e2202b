package agent_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"krane.dev/host/agent"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
)

// lastHeartbeat is the newest heartbeat the test ctrl received, or nil.
func (h *harness) lastHeartbeat() *clusterv1.HeartbeatRequest {
	hbs := h.ctrl.Heartbeats()
	if len(hbs) == 0 {
		return nil
	}
	return hbs[len(hbs)-1]
}

// TestHeartbeatSaysWhatTheHostRuns: the host's heartbeat names every
// enabled controller with its plugin version, its kinds and whether it
// runs (and why not), its cursor and parked objects per kind. A heartbeat
// goes out as soon as a controller starts, not at the next interval (set
// to an hour here, so only that can send it), and the host is not ready
// until ctrl has accepted one naming its controllers.
func TestHeartbeatSaysWhatTheHostRuns(t *testing.T) {
	h := newHarness(t, configmapController+`
controller "missing" {
  path = "krane-plugin-does-not-exist"
}`)
	restore := agent.SetHeartbeatInterval(time.Hour)
	t.Cleanup(restore) // after the agent stopped: cleanups run last first
	poison := h.ctrl.PutJSON(cmKind, "poison", map[string]any{"namespace": "kube-system", "name": "evil", "data": map[string]any{}})
	h.ctrl.PutJSON(cmKind, "good", h.cm(1, "ok"))
	h.start()

	eventually(t, time.Minute, "a heartbeat naming the running configmap controller", func() error {
		hb := h.lastHeartbeat()
		if hb == nil || !hb.GetHostReport() || len(hb.GetControllers()) != 2 {
			return fmt.Errorf("last heartbeat %v", hb)
		}
		cm, missing := hb.GetControllers()[0], hb.GetControllers()[1]
		if cm.GetName() != "configmap" || !cm.GetRunning() || cm.GetPluginVersion() == "" || len(cm.GetKinds()) != 1 || cm.GetKinds()[0] != cmKind {
			return fmt.Errorf("configmap controller: %v", cm)
		}
		if missing.GetName() != "missing" || missing.GetRunning() || !strings.Contains(missing.GetLastError(), "krane-plugin-does-not-exist") {
			return fmt.Errorf("missing controller: %v", missing)
		}
		return nil
	})
	first := h.ctrl.Heartbeats()[0]
	for _, c := range first.GetControllers() {
		if c.GetName() == "configmap" && c.GetRunning() {
			t.Logf("the first heartbeat already named the running controller (the plugin started before it was sent)")
		}
	}

	// The poison change is parked; the next heartbeat says so, with the
	// cursor past it.
	loop := h.agent.Loop(cmKind)
	eventually(t, time.Minute, "the poison change parked and the cursor past it", func() error {
		if loop.Parked() != 1 || loop.Cursor() < poison {
			return fmt.Errorf("parked %d, cursor %d (poison at %d)", loop.Parked(), loop.Cursor(), poison)
		}
		return nil
	})
	h.agent.KickHeartbeat()
	eventually(t, time.Minute, "a heartbeat with the parked object and the cursor", func() error {
		hb := h.lastHeartbeat()
		if hb.GetParked()[cmKind] != 1 || hb.GetCursors()[cmKind] < poison || hb.GetAgentVersion() == "" {
			return fmt.Errorf("last heartbeat %v", hb)
		}
		return nil
	})
}

// TestNotReadyUntilCtrlKnowsTheControllers: with the controllers running
// and bootstrapped, a host whose heartbeats ctrl refuses says it is not
// ready, and why; once ctrl accepts one it is.
func TestNotReadyUntilCtrlKnowsTheControllers(t *testing.T) {
	h := newHostHarness(t, `controller "noop-a" {}`, pluginDir(t))
	h.ctrl.RefuseHeartbeats(true)
	h.start()
	eventually(t, time.Minute, "bootstrapped, but not ready for want of a heartbeat", func() error {
		ok, why := h.agent.Ready()
		text := strings.Join(why, "\n")
		if ok || len(why) != 1 || !strings.Contains(text, "heartbeat naming the controllers") {
			return fmt.Errorf("ready %v: %s", ok, text)
		}
		return nil
	})
	h.ctrl.RefuseHeartbeats(false)
	eventually(t, time.Minute, "ready once ctrl accepts a heartbeat", func() error {
		if ok, why := h.agent.Ready(); !ok {
			return fmt.Errorf("%v", why)
		}
		return nil
	})
}
