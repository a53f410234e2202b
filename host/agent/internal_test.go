package agent

import (
	"context"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/hashicorp/go-hclog"

	"krane.dev/host/config"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
	"krane.dev/sdk"
)

// TestStoppedControllerClaimsNoKind: a controller stopped (by a reload)
// while its plugin is starting must not claim its kinds when the plugin's
// start hook runs after the stop. The kind would stay owned by a
// controller that no longer runs, and every other controller for it would
// be refused until the host restarts.
func TestStoppedControllerClaimsNoKind(t *testing.T) {
	a := New(&config.Config{Region: "r1", ClusterID: "c1"}, hclog.NewNullLogger(), Options{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a.runCtx = ctx
	ctl := func(name string) config.Controller {
		return config.Controller{Name: name, Enabled: true, Path: t.TempDir() + "/krane-plugin-" + name, Config: map[string]any{}}
	}
	info := sdk.Info{Name: "x", Kinds: []sdk.KindInfo{{Kind: "thing"}}}

	a.mu.Lock()
	a.startController(ctl("late"))
	late := a.controllers["late"]
	a.mu.Unlock()
	a.stopController("late")
	// The plugin finished starting just as it was stopped: its hook runs now.
	if err := a.claimKinds("late", late, info); err == nil {
		t.Errorf("a stopped controller's plugin was accepted")
	}
	if owner, ok := a.kindOwner["thing"]; ok {
		t.Fatalf("kind thing is owned by %q, a controller that no longer runs", owner)
	}

	a.mu.Lock()
	a.startController(ctl("other"))
	other := a.controllers["other"]
	a.mu.Unlock()
	defer a.stopController("other")
	if err := a.claimKinds("other", other, info); err != nil {
		t.Fatalf("another controller for the kind was refused: %v", err)
	}
}

// TestHeartbeatFitsCtrlsBounds: what a plugin says of itself is cut to
// the bounds the ClusterService declares, at a character boundary, and
// kind names ctrl would refuse are left out, so a plugin cannot get the
// host's heartbeats refused.
func TestHeartbeatFitsCtrlsBounds(t *testing.T) {
	if controllerLimits.pluginVersion == 0 || controllerLimits.lastError == 0 || controllerLimits.kinds == 0 || controllerLimits.cursors == 0 {
		t.Fatalf("limits not read from the proto: %+v", controllerLimits)
	}
	cs := &clusterv1.ControllerStatus{
		PluginVersion: strings.Repeat("v", 1000), LastError: strings.Repeat("é", 5000),
		Kinds: []string{"Not.A.Kind", "-bad"},
	}
	for range controllerLimits.kinds + 5 {
		cs.Kinds = append(cs.Kinds, "configmap.example.krane.dev")
	}
	fitHeartbeat(cs)
	if len(cs.PluginVersion) != controllerLimits.pluginVersion || len(cs.LastError) > controllerLimits.lastError ||
		!utf8.ValidString(cs.LastError) || len(cs.Kinds) != controllerLimits.kinds || cs.Kinds[0] != "configmap.example.krane.dev" {
		t.Fatalf("fitted: version %d bytes, error %d bytes (valid UTF-8: %v), %d kinds; limits %+v",
			len(cs.PluginVersion), len(cs.LastError), utf8.ValidString(cs.LastError), len(cs.Kinds), controllerLimits)
	}
}
