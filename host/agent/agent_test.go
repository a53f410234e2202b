package agent_test

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"krane.dev/host/agent"
	"krane.dev/internal/testplugins/noop"
	"krane.dev/sdk/plugintest"
)

const configmapController = `
controller "configmap" {
  config { allowed_namespaces = ["%NS%"] }
}`

// TestSyncEndToEnd: bootstrap, incremental changes, deletes, GC after
// bootstrap, resync repairing a hand-deleted and a hand-edited object,
// status reports, and the cursor across a ctrl stream drop.
func TestSyncEndToEnd(t *testing.T) {
	h := newHarness(t, configmapController)
	ctx := context.Background()
	const n = 40
	for i := range n {
		h.ctrl.PutJSON(cmKind, fmt.Sprintf("obj-%d", i), h.cm(i, "1"))
	}
	// Leftovers of an earlier life: managed objects desired state does not
	// name (collected after the bootstrap), and a look-alike without
	// Krane's label (never touched).
	for i := range 3 {
		h.managedConfigMap(fmt.Sprintf("orphan-%d", i), fmt.Sprintf("orphan-%d", i))
	}
	lookalike := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "orphan-9", Namespace: h.ns, Labels: map[string]string{"app.kubernetes.io/component": "configmap-example", "krane.dev/id": "orphan-9"}}}
	if _, err := h.cluster.Client.CoreV1().ConfigMaps(h.ns).Create(ctx, lookalike, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	begin := time.Now()
	h.start()
	eventually(t, 60*time.Second, "bootstrap applied and orphans collected", func() error {
		cms := h.configMaps()
		if len(cms) != n {
			return fmt.Errorf("%d managed ConfigMaps, want %d", len(cms), n)
		}
		if cms["cm-7"].Data["v"] != "1" {
			return fmt.Errorf("cm-7 data = %v", cms["cm-7"].Data)
		}
		return nil
	})
	t.Logf("bootstrap of %d objects applied in %s", n, time.Since(begin).Round(time.Millisecond))
	eventually(t, 10*time.Second, "ready", func() error {
		if ok, why := h.agent.Ready(); !ok {
			return fmt.Errorf("%v", why)
		}
		return nil
	})
	if _, err := h.cluster.Client.CoreV1().ConfigMaps(h.ns).Get(ctx, "orphan-9", metav1.GetOptions{}); err != nil {
		t.Errorf("look-alike ConfigMap without Krane's label was touched: %v", err)
	}

	// Incremental: update 5, delete 5, add 5.
	for i := range 5 {
		h.ctrl.PutJSON(cmKind, fmt.Sprintf("obj-%d", i), h.cm(i, "2"))
		h.ctrl.Delete(cmKind, fmt.Sprintf("obj-%d", 10+i))
		h.ctrl.PutJSON(cmKind, fmt.Sprintf("obj-%d", n+i), h.cm(n+i, "new"))
	}
	eventually(t, 30*time.Second, "incremental changes", func() error {
		cms := h.configMaps()
		if len(cms) != n {
			return fmt.Errorf("%d ConfigMaps, want %d", len(cms), n)
		}
		if cms["cm-3"].Data["v"] != "2" {
			return fmt.Errorf("cm-3 not updated: %v", cms["cm-3"].Data)
		}
		if _, ok := cms["cm-12"]; ok {
			return fmt.Errorf("cm-12 not deleted")
		}
		if cms[fmt.Sprintf("cm-%d", n+2)].Data["v"] != "new" {
			return fmt.Errorf("new object missing")
		}
		return nil
	})
	loop := h.agent.Loop(cmKind)
	eventually(t, 10*time.Second, "cursor at head", func() error {
		if c, head := loop.Cursor(), h.ctrl.Head(); c != head {
			return fmt.Errorf("cursor %d, head %d", c, head)
		}
		return nil
	})

	// Status reports reach ctrl.
	eventually(t, 10*time.Second, "status report", func() error {
		r := h.ctrl.LatestReport(cmKind, "obj-3")
		if r == nil || !strings.Contains(r.GetStatus().String(), "present") {
			return fmt.Errorf("latest report %v", r)
		}
		return nil
	})

	// Resync repairs a hand-deleted and a hand-edited object.
	if err := h.cluster.Client.CoreV1().ConfigMaps(h.ns).Delete(ctx, "cm-20", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	edited := h.configMaps()["cm-21"]
	edited.Data["v"] = "edited by hand"
	edited.Data["extra"] = "x"
	if _, err := h.cluster.Client.CoreV1().ConfigMaps(h.ns).Update(ctx, &edited, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	loop.Resync()
	eventually(t, 20*time.Second, "resync repairs", func() error {
		cms := h.configMaps()
		if _, ok := cms["cm-20"]; !ok {
			return fmt.Errorf("hand-deleted cm-20 not restored")
		}
		if cms["cm-21"].Data["v"] != "1" {
			return fmt.Errorf("hand-edited cm-21 = %v", cms["cm-21"].Data)
		}
		return nil
	})
	if w := h.metric(`krane_host_resync_writes_total{kind="` + cmKind + `"}`); w < 2 {
		t.Errorf("resync writes = %v, want >= 2", w)
	}

	// ctrl drops the stream: the host resumes from its committed cursor.
	cursor := loop.Cursor()
	before := len(h.ctrl.Watches())
	h.ctrl.DropStreams()
	h.ctrl.PutJSON(cmKind, "obj-after-drop", h.cm(99, "after"))
	eventually(t, 20*time.Second, "change after reconnect", func() error {
		if h.configMaps()["cm-99"].Data["v"] != "after" {
			return fmt.Errorf("not applied yet")
		}
		return nil
	})
	watches := h.ctrl.Watches()
	if len(watches) <= before {
		t.Fatalf("no reconnect recorded")
	}
	if got := watches[before].GetAfterVersion(); got != cursor {
		t.Errorf("reconnected after version %d, want the committed cursor %d", got, cursor)
	}
}

// TestPoisonChangeDoesNotBlock: a permanently failing change is parked and
// reported upstream; later changes apply and the cursor moves past it.
func TestPoisonChangeDoesNotBlock(t *testing.T) {
	h := newHarness(t, configmapController)
	h.start()
	poison := h.ctrl.PutJSON(cmKind, "poison", map[string]any{"namespace": "kube-system", "name": "evil", "data": map[string]any{}})
	for i := range 5 {
		h.ctrl.PutJSON(cmKind, fmt.Sprintf("good-%d", i), h.cm(i, "ok"))
	}
	eventually(t, 30*time.Second, "later changes applied", func() error {
		if n := len(h.configMaps()); n != 5 {
			return fmt.Errorf("%d ConfigMaps", n)
		}
		return nil
	})
	eventually(t, 10*time.Second, "failure reported upstream", func() error {
		r := h.ctrl.LatestReport(cmKind, "poison")
		ae := r.GetApplyError()
		if ae == nil || !ae.GetPermanent() || ae.GetVersion() != poison || !strings.Contains(ae.GetMessage(), "kube-system") || ae.GetField() != "namespace" {
			return fmt.Errorf("report %v", r)
		}
		return nil
	})
	loop := h.agent.Loop(cmKind)
	eventually(t, 10*time.Second, "cursor past the poison", func() error {
		if c := loop.Cursor(); c != h.ctrl.Head() {
			return fmt.Errorf("cursor %d, head %d", c, h.ctrl.Head())
		}
		return nil
	})
	loop.Resync() // resync refreshes the parked gauge
	eventually(t, 10*time.Second, "parked gauge", func() error {
		if v := h.metric(`krane_host_parked_objects{kind="` + cmKind + `"}`); v != 1 {
			return fmt.Errorf("parked = %v", v)
		}
		return nil
	})
	// A newer version of the parked object replaces it and clears the error.
	h.ctrl.PutJSON(cmKind, "poison", h.cm(50, "fixed"))
	eventually(t, 20*time.Second, "fixed version applied and error cleared", func() error {
		if h.configMaps()["cm-50"].Data["v"] != "fixed" {
			return fmt.Errorf("not applied")
		}
		// Some report after the failure clears it (an empty ApplyError);
		// plain status reports carry none.
		reports := h.ctrl.Reports(cmKind, "poison")
		failedAt := -1
		for i, r := range reports {
			if ae := r.GetApplyError(); ae != nil && ae.GetMessage() != "" {
				failedAt = i
			}
		}
		for _, r := range reports[failedAt+1:] {
			if ae := r.GetApplyError(); ae != nil && ae.GetMessage() == "" {
				return nil
			}
		}
		return fmt.Errorf("no report clears the failure (%d reports)", len(reports))
	})
}

// TestGCBrake: an empty desired state against a cluster full of managed
// objects deletes nothing past the threshold, and says so; the override
// lets a deliberate mass deletion through.
func TestGCBrake(t *testing.T) {
	h := newHarness(t, configmapController)
	for i := range 20 {
		h.managedConfigMap(fmt.Sprintf("keep-%d", i), fmt.Sprintf("keep-%d", i))
	}
	h.start()
	eventually(t, 30*time.Second, "bootstrap", func() error {
		if ok, why := h.agent.Ready(); !ok {
			return fmt.Errorf("%v", why)
		}
		return nil
	})
	time.Sleep(500 * time.Millisecond) // give a wrongful deletion a chance to show
	if n := len(h.configMaps()); n != 20 {
		t.Fatalf("%d of 20 managed ConfigMaps left after an empty bootstrap: the brake did not hold", n)
	}
	if v := h.metric(`krane_host_gc_brake_trips_total{kind="` + cmKind + `"}`); v != 1 {
		t.Errorf("brake trips = %v, want 1", v)
	}
	if !strings.Contains(h.logs.String(), "garbage collection brake tripped") || !strings.Contains(h.logs.String(), "allow_mass_delete") {
		t.Errorf("the log does not explain the brake and its override")
	}
	h.writeConfig(configmapController, `gc {
  max_delete_fraction = 0.25
  min_deletes = 5
  allow_mass_delete = true
}`)
	// The file above defines gc twice; keep one block.
	h.writeConfig(configmapController, "")
	cfg := h.load()
	cfg.GC.AllowMassDelete = true
	if err := h.agent.Reload(cfg); err != nil {
		t.Fatal(err)
	}
	h.agent.Loop(cmKind).Resync()
	eventually(t, 30*time.Second, "mass deletion with the override", func() error {
		if n := len(h.configMaps()); n != 0 {
			return fmt.Errorf("%d left", n)
		}
		return nil
	})
}

// TestPluginKill9 restarts a crashed plugin, which re-bootstraps and
// converges, including a change made while it was down.
func TestPluginKill9(t *testing.T) {
	h := newHarness(t, configmapController)
	for i := range 5 {
		h.ctrl.PutJSON(cmKind, fmt.Sprintf("obj-%d", i), h.cm(i, "1"))
	}
	h.start()
	eventually(t, 30*time.Second, "bootstrap", func() error {
		if n := len(h.configMaps()); n != 5 {
			return fmt.Errorf("%d", n)
		}
		return nil
	})
	p := h.agent.Plugin("configmap")
	pid := p.Pid()
	if pid == 0 {
		t.Fatal("no plugin pid")
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	h.ctrl.PutJSON(cmKind, "obj-1", h.cm(1, "while-down"))
	h.ctrl.Delete(cmKind, "obj-2")
	eventually(t, 30*time.Second, "restarted plugin converged", func() error {
		if np := p.Pid(); np == 0 || np == pid {
			return fmt.Errorf("plugin not restarted (pid %d)", np)
		}
		cms := h.configMaps()
		if cms["cm-1"].Data["v"] != "while-down" {
			return fmt.Errorf("change made while down not applied")
		}
		if _, ok := cms["cm-2"]; ok {
			return fmt.Errorf("delete made while down not applied")
		}
		return nil
	})
	if v := h.metric(`krane_host_plugin_restarts_total{controller="configmap"}`); v != 1 {
		t.Errorf("restarts = %v, want 1", v)
	}
}

// TestControllerFailuresAreIsolated: a sha256 mismatch, an unknown key in
// a plugin's config, a config value of the wrong type and a missing binary
// each fail only their own controller, with an error naming it; the good
// controller keeps syncing.
func TestControllerFailuresAreIsolated(t *testing.T) {
	h := newHarness(t, configmapController+`
controller "pinned" {
  path = "krane-plugin-noop-a"
  sha256 = "0000000000000000000000000000000000000000000000000000000000000000"
}
controller "unknownkey" {
  path = "krane-plugin-noop-b"
  config { lable = "typo" }
}
controller "wrongtype" {
  path = "krane-plugin-noop-c"
  config { label = 5 }
}
controller "missing" {
  path = "krane-plugin-does-not-exist"
}`)
	h.ctrl.PutJSON(cmKind, "obj-1", h.cm(1, "1"))
	h.start()
	eventually(t, 30*time.Second, "the good controller syncs", func() error {
		if h.configMaps()["cm-1"].Data["v"] != "1" {
			return fmt.Errorf("not applied")
		}
		return nil
	})
	want := map[string]string{
		"pinned":     "which its pin does not list",
		"unknownkey": `config key "lable": unknown key`,
		"wrongtype":  `config key "label"`,
		"missing":    "krane-plugin-does-not-exist: no such file",
	}
	eventually(t, 20*time.Second, "each failure explained", func() error {
		ok, why := h.agent.Ready()
		if ok {
			return fmt.Errorf("ready despite broken controllers")
		}
		text := strings.Join(why, "\n")
		for name, reason := range want {
			if !strings.Contains(text, fmt.Sprintf("controller %s: plugin not running: controller %q", name, name)) || !strings.Contains(text, reason) {
				return fmt.Errorf("readyz does not explain %s (%s):\n%s", name, reason, text)
			}
		}
		return nil
	})
	h.ctrl.PutJSON(cmKind, "obj-2", h.cm(2, "2"))
	eventually(t, 20*time.Second, "good controller still syncing", func() error {
		if h.configMaps()["cm-2"].Data["v"] != "2" {
			return fmt.Errorf("not applied")
		}
		return nil
	})
}

// TestReloadDisablesOneController: disabling a controller stops its plugin
// without touching its objects or restarting the others.
func TestReloadDisablesOneController(t *testing.T) {
	both := configmapController + `
controller "noop-a" {}`
	h := newHarness(t, both)
	h.ctrl.PutJSON(cmKind, "obj-1", h.cm(1, "1"))
	h.ctrl.PutJSON("noop-a.test.krane.dev", "n1", map[string]any{"x": 1.0})
	h.start()
	eventually(t, 30*time.Second, "both running and synced", func() error {
		if ok, why := h.agent.Ready(); !ok {
			return fmt.Errorf("%v", why)
		}
		if len(h.configMaps()) != 1 {
			return fmt.Errorf("configmap not applied")
		}
		return nil
	})
	noop := h.agent.Plugin("noop-a")
	noopPid := noop.Pid()
	cmPid := h.agent.Plugin("configmap").Pid()

	h.writeConfig(strings.Replace(configmapController, `controller "configmap" {`, `controller "configmap" {
  enabled = false`, 1)+`
controller "noop-a" {}`, "")
	h.reload()
	if p := h.agent.Plugin("configmap"); p != nil {
		t.Fatalf("configmap controller still running after being disabled")
	}
	if err := syscall.Kill(cmPid, 0); err == nil {
		t.Errorf("configmap plugin process %d still alive after being disabled", cmPid)
	}
	// Its desired state goes away; the disabled controller must not act.
	h.ctrl.Delete(cmKind, "obj-1")
	time.Sleep(time.Second)
	if len(h.configMaps()) != 1 {
		t.Errorf("a disabled controller's object was touched")
	}
	if got := h.agent.Plugin("noop-a"); got != noop || got.Pid() != noopPid {
		t.Errorf("noop-a was restarted by a reload that did not change it")
	}
	if v := h.metric(`krane_host_plugin_restarts_total{controller="noop-a"}`); v > 0 {
		t.Errorf("noop-a restarts = %v", v)
	}
	// Enabling it again re-bootstraps it: the deleted object is collected.
	h.writeConfig(both, "")
	h.reload()
	eventually(t, 30*time.Second, "re-enabled controller converges", func() error {
		if n := len(h.configMaps()); n != 0 {
			return fmt.Errorf("%d ConfigMaps left", n)
		}
		return nil
	})
}

// TestHostAttachesToPluginInTestProcess: a real host drives a controller
// served inside the test process (sdk/plugintest.Serve), so a plugin author
// gets coverage, -race and a debugger on their code under the real host.
func TestHostAttachesToPluginInTestProcess(t *testing.T) {
	h := newHarness(t, `controller "inproc" {}`)
	ctl := noop.New("inproc")
	rc := plugintest.Serve(t, ctl)
	log := hclog.New(&hclog.LoggerOptions{Level: hclog.Info, Output: h.logs})
	h.agent = agent.New(h.load(), log, agent.Options{Reattach: map[string]*plugin.ReattachConfig{"inproc": rc}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = h.agent.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	v := h.ctrl.PutJSON(ctl.Kind(), "x1", map[string]any{"hello": "world"})
	eventually(t, 20*time.Second, "in-process controller applied the change", func() error {
		got, ok := ctl.Get("x1")
		if !ok || got.Version != v {
			return fmt.Errorf("controller holds %+v, %v", got, ok)
		}
		return nil
	})
}
