package config

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

func write(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "krane.hcl")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

const base = `
region = "r1"
cluster_id = "c1"
control_plane { url = "http://127.0.0.1:7070"
  token = "t" }
`

func TestRepoSampleLoads(t *testing.T) {
	cfg, err := Load("../../krane.hcl", []string{"KRANE_TOKEN=x"})
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Controllers) != 3 || !cfg.Controllers["deployment"].Enabled {
		t.Fatalf("controllers = %+v", cfg.Controllers)
	}
	if got := cfg.Controllers["deployment"].Config["runtime_class"]; got != "gvisor" {
		t.Errorf("deployment config runtime_class = %v", got)
	}
	if !strings.HasSuffix(cfg.Controllers["cilium"].Path, filepath.Join("bin", "krane-plugin-cilium")) {
		t.Errorf("cilium path = %s", cfg.Controllers["cilium"].Path)
	}
}

func TestControllerBlocksNormalised(t *testing.T) {
	p := write(t, base+`
controller "a" {
  sha256 = "ABCDEF0123456789abcdef0123456789abcdef0123456789abcdef0123456789"
  config {
    nested { x = 1 }
    list = ["p", "q"]
    objects = [{ n = 1 }, { n = 2 }]
  }
}
controller "b" {
  enabled = false
  path = "/opt/b"
}
`)
	cfg, err := Load(p, []string{})
	if err != nil {
		t.Fatal(err)
	}
	a, b := cfg.Controllers["a"], cfg.Controllers["b"]
	if !a.Enabled || b.Enabled {
		t.Errorf("enabled: a=%v b=%v", a.Enabled, b.Enabled)
	}
	if len(a.SHA256) != 1 || a.SHA256[0] != strings.ToLower("ABCDEF0123456789abcdef0123456789abcdef0123456789abcdef0123456789") {
		t.Errorf("sha256 = %v", a.SHA256)
	}
	if b.Path != "/opt/b" || a.Path != filepath.Join(filepath.Dir(p), "krane-plugin-a") {
		t.Errorf("paths: a=%s b=%s", a.Path, b.Path)
	}
	js, err := a.ConfigJSON(`{"type":"object","properties":{"list":{"type":"array"}}}`)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"nested":{"x":1}`, `"list":["p","q"]`, `"objects":[{"n":1},{"n":2}]`} {
		if !strings.Contains(string(js), want) {
			t.Errorf("config JSON %s lacks %s", js, want)
		}
	}
}

func TestSchemaResolvesSingleObjectList(t *testing.T) {
	p := write(t, base+`
controller "a" {
  config {
    rules = [{ port = 80 }]
  }
}`)
	cfg, err := Load(p, []string{})
	if err != nil {
		t.Fatal(err)
	}
	js, _ := cfg.Controllers["a"].ConfigJSON(`{"type":"object","properties":{"rules":{"type":"array","items":{"type":"object"}}}}`)
	if !strings.Contains(string(js), `"rules":[{"port":80}]`) {
		t.Errorf("config JSON = %s, want rules as a list", js)
	}
}

func TestErrorsNameFileAndKey(t *testing.T) {
	cases := map[string]string{
		base + `sync { workerz = 3 }`:                        `unknown key "sync.workerz"`,
		base + `colour = "blue"`:                             `unknown key "colour"`,
		base + `sync { workers = "many" }`:                   `sync.workers`,
		base + `sync { workers = 0 }`:                        `"sync.workers"`,
		base + `controller "a" {} controller "a" {}`:         `block "a" is defined twice`,
		base + `controller "Bad_Name" {}`:                    `"controller.Bad_Name"`,
		base + `controller "a" { sha256 = "xyz" }`:           `"controller.a.sha256"`,
		base + `controller "a" { enabeld = true }`:           `unknown key "controller.a.enabeld"`,
		base + `gc { max_delete_fraction = 3 }`:              `"gc.max_delete_fraction"`,
		base + `sync {`:                                      `krane.hcl`,
		`cluster_id = "c" control_plane { url = "ftp://x" }`: `"control_plane.url"`,
		base + `control_plane { token_file = "/x" }`:         `block "control_plane" is defined more than once`,
		`region = "r" cluster_id = "c" control_plane {
  url = "http://x:1"
  token = "a"
  token_file = "/b" }`: `exactly one of token`,
	}
	for content, want := range cases {
		_, err := Load(write(t, content), []string{})
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "krane.hcl") {
			t.Errorf("config %q:\n got  %v\n want an error with %s and the file name", strings.ReplaceAll(content, base, "<base>"), err, want)
		}
	}
}

func TestEnvironmentOverrides(t *testing.T) {
	p := write(t, base+`controller "a" { config { mode = "slow" } }`)
	cfg, err := Load(p, []string{
		"KRANE_REGION=r2",
		"KRANE_SYNC__WORKERS=4",
		"KRANE_SYNC__RESYNC_INTERVAL=30s",
		"KRANE_CONTROLLER__A__ENABLED=false",
		"KRANE_CONTROLLER__A__CONFIG__MODE=fast",
		"OTHER=ignored",
	})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Region != "r2" || cfg.Sync.Workers != 4 || cfg.Sync.ResyncInterval != 30*time.Second {
		t.Errorf("overrides not applied: %+v %+v", cfg.Region, cfg.Sync)
	}
	if a := cfg.Controllers["a"]; a.Enabled || a.Config["mode"] != "fast" {
		t.Errorf("controller a = %+v", a)
	}
	if _, err := Load(p, []string{"KRANE_SYNC__WORKERS=lots"}); err == nil || !strings.Contains(err.Error(), "sync.workers") {
		t.Errorf("bad env value: got %v", err)
	}
}

func TestTokenSources(t *testing.T) {
	dir := t.TempDir()
	tf := filepath.Join(dir, "token")
	os.WriteFile(tf, []byte("from-file\n"), 0o600)
	t.Setenv("MY_TOKEN", "from-env")
	for cp, want := range map[ControlPlane]string{
		{Token: "inline"}:      "inline",
		{TokenFile: tf}:        "from-file",
		{TokenEnv: "MY_TOKEN"}: "from-env",
	} {
		got, err := cp.ReadToken()
		if err != nil || got != want {
			t.Errorf("%+v: got %q, %v; want %q", cp, got, err, want)
		}
	}
}

func TestUnrelatedEnvironmentIgnored(t *testing.T) {
	p := write(t, base+`controller "my-plugin" {}`)
	cfg, err := Load(p, []string{
		"KRANE_SERVICE_HOST=10.0.0.1", // injected by Kubernetes for a Service named krane
		"KRANE_PORT=tcp://10.0.0.1:80",
		"KRANE_TOKEN=secret",
		"KRANE_CONTROLLER__MY_PLUGIN__ENABLED=false",
	})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Controllers["my-plugin"].Enabled {
		t.Errorf("KRANE_CONTROLLER__MY_PLUGIN__ENABLED did not reach controller my-plugin")
	}
}

// TestLeaderTimingsMatchClientGo: krane validate accepts exactly the
// leader election timings client-go accepts. A combination that passed
// validation and that client-go refuses crashed the host at start.
func TestLeaderTimingsMatchClientGo(t *testing.T) {
	durations := []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second, 2200 * time.Millisecond,
		2400 * time.Millisecond, 2500 * time.Millisecond, 3 * time.Second, 7 * time.Second, 10 * time.Second}
	for _, lease := range durations {
		for _, renew := range durations {
			for _, retry := range durations {
				p := write(t, base+fmt.Sprintf(`leader_election {
  enabled = true
  lease_duration = %q
  renew_deadline = %q
  retry_period = %q
}`, lease, renew, retry))
				_, err := Load(p, []string{})
				_, cgErr := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
					Lock:          &resourcelock.LeaseLock{LockConfig: resourcelock.ResourceLockConfig{Identity: "x"}},
					LeaseDuration: lease, RenewDeadline: renew, RetryPeriod: retry,
					Callbacks: leaderelection.LeaderCallbacks{OnStartedLeading: func(context.Context) {}, OnStoppedLeading: func() {}},
				})
				if (err == nil) != (cgErr == nil) {
					t.Errorf("lease %s, renew %s, retry %s: krane says %v, client-go says %v", lease, renew, retry, err, cgErr)
				}
			}
		}
	}
}

func TestPluginIdentities(t *testing.T) {
	cfg, err := Load(write(t, base+`
controller "a" {}
controller "b" { service_account = "custom-b" }
`), []string{})
	if err != nil {
		t.Fatal(err)
	}
	pi := cfg.Kubernetes.PluginIdentities
	if !pi.Enabled || pi.Namespace != "krane" || pi.TokenTTL != time.Hour || pi.Refresh != 0 {
		t.Errorf("defaults = %+v", pi)
	}
	if a, b := cfg.Controllers["a"].ServiceAccount, cfg.Controllers["b"].ServiceAccount; a != "krane-plugin-a" || b != "custom-b" {
		t.Errorf("service accounts: a=%q b=%q", a, b)
	}
	off, err := Load(write(t, base+`
kubernetes {
  plugin_identities { enabled = false }
}
`), []string{})
	if err != nil {
		t.Fatal(err)
	}
	if off.Kubernetes.PluginIdentities.Enabled {
		t.Error("plugin_identities { enabled = false } left them enabled")
	}
	env, err := Load(write(t, base), []string{"KRANE_KUBERNETES__PLUGIN_IDENTITIES__REFRESH=30s", "KRANE_KUBERNETES__PLUGIN_IDENTITIES__TOKEN_TTL=10m"})
	if err != nil {
		t.Fatal(err)
	}
	if got := env.Kubernetes.PluginIdentities; got.Refresh != 30*time.Second || got.TokenTTL != 10*time.Minute {
		t.Errorf("environment overrides: %+v", got)
	}
	for _, tc := range []struct{ hcl, key string }{
		{`kubernetes { plugin_identities { token_ttl = "5m" } }`, "kubernetes.plugin_identities.token_ttl"},
		{`kubernetes { plugin_identities { refresh = "59m" } }`, "kubernetes.plugin_identities.refresh"},
		{`kubernetes { plugin_identities { namespace = "Krane" } }`, "kubernetes.plugin_identities.namespace"},
		{`controller "a" { service_account = "Not_A_Name" }`, "controller.a.service_account"},
	} {
		_, err := Load(write(t, base+tc.hcl), []string{})
		if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("key %q", tc.key)) {
			t.Errorf("%s: error %v, want one naming %s", tc.hcl, err, tc.key)
		}
	}
}

// TestPinsTakeOneDigestOrAList: a pin is one digest, as before, or a list
// (the old and the new release's, while an upgrade rolls); a digest the
// pin does not list is refused with an error naming the binary's digest,
// and for a built-in plugin the krane release whose plugins.hcl lists it.
func TestPinsTakeOneDigestOrAList(t *testing.T) {
	old, next := strings.Repeat("a", 64), strings.Repeat("b", 64)
	p := write(t, base+`
controller "deployment" {
  sha256 = ["`+old+`", "`+strings.ToUpper(next)+`"]
}
controller "quota" {
  sha256 = "`+old+`"
}
`)
	cfg, err := Load(p, []string{})
	if err != nil {
		t.Fatal(err)
	}
	dep, quota := cfg.Controllers["deployment"], cfg.Controllers["quota"]
	if len(dep.SHA256) != 2 || dep.SHA256[1] != next {
		t.Fatalf("a list pin: %v", dep.SHA256)
	}
	for _, d := range []string{old, next} {
		if err := dep.PinError(d, "v0.2.0"); err != nil {
			t.Errorf("a digest the list holds: %v", err)
		}
	}
	other := strings.Repeat("c", 64)
	err = dep.PinError(other, "v0.2.0")
	for _, want := range []string{`controller "deployment"`, "has sha256 " + other, "krane v0.2.0 ships", "plugins.hcl", `sha256 = "` + other + `"`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("a built-in's pin mismatch: %v; want it to say %q", err, want)
		}
	}
	if err := quota.PinError(other, "v0.2.0"); err == nil || strings.Contains(err.Error(), "plugins.hcl") || !strings.Contains(err.Error(), "update sha256 in krane.hcl") {
		t.Errorf("a plugin author's pin mismatch: %v", err)
	}
	if err := (Controller{Name: "x"}).PinError(other, "v0.2.0"); err != nil {
		t.Errorf("an unpinned controller: %v", err)
	}
	bad := write(t, base+`
controller "deployment" {
  sha256 = ["`+old+`", "nope"]
}
`)
	if _, err := Load(bad, []string{}); err == nil || !strings.Contains(err.Error(), "sha256") || !strings.Contains(err.Error(), `"nope"`) {
		t.Errorf("a list holding a bad digest: %v", err)
	}
}
