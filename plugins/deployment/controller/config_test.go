package controller

import (
	"errors"
	"strings"
	"testing"
	"time"

	"krane.dev/sdk"
)

// BadConfig is a config block ParseConfig (and the schema) must refuse,
// naming Key. Exported for the conformance test.
type BadConfig struct{ Config, Key string }

// BadConfigs covers the config checks.
func BadConfigs() []BadConfig {
	return []BadConfig{
		{`{"runtime_klass": "gvisor"}`, "runtime_klass"},
		{`{"runtime_class": 5}`, "runtime_class"},
		{`{"runtime_class": "Not A Name"}`, "runtime_class"},
		{`{"env_var_names": {"workspace_id": "1WS"}}`, "env_var_names.workspace_id"},
		{`{"env_var_names": {"project_id": "UNKEY_WORKSPACE_ID"}}`, "env_var_names.project_id"},
		{`{"env_var_names": {"region": "X"}}`, "env_var_names.region"},
		{`{"image_pull_secret": "Bad_Secret"}`, "image_pull_secret"},
		{`{"node_selector": {"node-class": "not a value"}}`, "node_selector.node-class"},
		{`{"tolerations": [{"key": "pool", "operator": "Maybe"}]}`, "tolerations.0.operator"},
		{`{"tolerations": [{"key": "pool", "operator": "Exists", "value": "x"}]}`, "tolerations.0.value"},
		{`{"sentinel_namespace": "Sentinels"}`, "sentinel_namespace"},
		{`{"pull_secret_namespace": "Krane"}`, "pull_secret_namespace"},
		{`{"probe_defaults": {"period_seconds": 0}}`, "probe_defaults.period_seconds"},
		{`{"status_resync_interval": "soon"}`, "status_resync_interval"},
		{`{"status_resync_interval": "10ms"}`, "status_resync_interval"},
		{`{"max_replicas": 0}`, "max_replicas"},
		{`{"decrypt_env": false}`, "decrypt_env"},
		{`{"decrypt_env": "yes"}`, "decrypt_env"},
		{`{"secret_cache_ttl": "forever"}`, "secret_cache_ttl"},
		{`{"secret_cache_ttl": "2h"}`, "secret_cache_ttl"},
		{`{"max_concurrent_rolls": 0}`, "max_concurrent_rolls"},
		{`{"min_ready_seconds": -1}`, "min_ready_seconds"},
		{`{"roll_progress_deadline": "never"}`, "roll_progress_deadline"},
		{`{"roll_progress_deadline": "500ms"}`, "roll_progress_deadline"},
		{`{"roll_progress_deadline": "48h"}`, "roll_progress_deadline"},
		{`{"roll_progress_deadline": 600}`, "roll_progress_deadline"},
		{`{"roll_progress_deadline": "30s", "min_ready_seconds": 60}`, "roll_progress_deadline"},
		{`{"image_pull_secrets": {"https://registry.example": "pull"}}`, "image_pull_secrets"},
		{`{"image_pull_secrets": {"registry.example/team": "pull"}}`, "image_pull_secrets"},
		{`{"image_pull_secrets": {"registry.example": "Bad_Secret"}}`, "image_pull_secrets.registry.example"},
		{`{"image_pull_secrets": ["registry.example"]}`, "image_pull_secrets"},
	}
}

func TestParseConfigDefaults(t *testing.T) {
	for _, raw := range []string{"", "{}"} {
		cfg, err := ParseConfig([]byte(raw))
		if err != nil {
			t.Fatalf("%q: %v", raw, err)
		}
		if cfg.RuntimeClass != "gvisor" || cfg.EnvVarNames.DeploymentID != "UNKEY_DEPLOYMENT_ID" || cfg.resync != time.Minute ||
			len(cfg.Tolerations) != 1 || cfg.NodeSelector["node-class"] != "untrusted" || cfg.ProbeDefaults.PeriodSeconds != 10 {
			t.Errorf("%q: defaults %+v", raw, cfg)
		}
		if cfg.rollDeadline != 10*time.Minute {
			t.Errorf("%q: roll_progress_deadline %s, want 10m like Kubernetes' progressDeadlineSeconds", raw, cfg.rollDeadline)
		}
	}
	cfg, err := ParseConfig([]byte(`{"node_selector": {"pool": "apps"}, "status_resync_interval": "2s", "probe_defaults": {"timeout_seconds": 4}}`))
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.NodeSelector) != 1 || cfg.NodeSelector["pool"] != "apps" {
		t.Errorf("node_selector %v: a configured map replaces the default", cfg.NodeSelector)
	}
	if cfg.resync != 2*time.Second || cfg.ProbeDefaults.TimeoutSeconds != 4 || cfg.ProbeDefaults.PeriodSeconds != 10 {
		t.Errorf("resync %s, probe defaults %+v", cfg.resync, cfg.ProbeDefaults)
	}
}

func TestBadConfigsNameTheKey(t *testing.T) {
	// The host checks the schema first, then Configure runs ParseConfig;
	// between them the operator must learn the full key. (encoding/json
	// names an unknown nested key without its parent; the schema names it
	// in full.)
	for _, bc := range BadConfigs() {
		_, err := ParseConfig([]byte(bc.Config))
		var ce *sdk.ConfigError
		if !errors.As(err, &ce) {
			t.Errorf("ParseConfig(%s) = %v, want a ConfigError", bc.Config, err)
			continue
		}
		serr := sdk.ValidateConfig(configSchema, []byte(bc.Config))
		if !strings.Contains(ce.Error(), bc.Key) && (serr == nil || !strings.Contains(serr.Error(), bc.Key)) {
			t.Errorf("config %s: neither ParseConfig (%v) nor the schema (%v) names %q", bc.Config, err, serr, bc.Key)
		}
	}
}

func TestSchemaAcceptsTheDefaults(t *testing.T) {
	full := `{"runtime_class":"gvisor","env_var_names":{"workspace_id":"A","project_id":"B","environment_id":"C","deployment_id":"D","encrypted_env":"E"},
		"image_pull_secret":"pull","pull_secret_namespace":"krane","node_selector":{"node-class":"untrusted"},"tolerations":[{"key":"k","operator":"Equal","value":"v","effect":"NoSchedule"}],
		"sentinel_namespace":"sentinel","probe_defaults":{"initial_delay_seconds":0,"period_seconds":10,"timeout_seconds":2,"failure_threshold":3},
		"status_resync_interval":"1m30s","max_cpu_millicores":64000,"max_memory_mib":262144,"max_replicas":1000,
		"roll_progress_deadline":"90s","min_ready_seconds":30}`
	if err := sdk.ValidateConfig(configSchema, []byte(full)); err != nil {
		t.Errorf("schema refuses a full valid block: %v", err)
	}
	if _, err := ParseConfig([]byte(full)); err != nil {
		t.Errorf("ParseConfig refuses a full valid block: %v", err)
	}
}
