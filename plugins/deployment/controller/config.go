package controller

import (
	"encoding/json"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"krane.dev/sdk"
)

// Config is the plugin's `config {}` block in krane.hcl. Every key is
// optional; Defaults lists what an empty block means.
type Config struct {
	// RuntimeClass is the pods' runtimeClassName; "" runs them without one.
	RuntimeClass string `json:"runtime_class"`
	// EnvVarNames are the names of the variables Krane injects.
	EnvVarNames EnvVarNames `json:"env_var_names"`
	// ImagePullSecret names a Secret every pod pulls with, whatever its
	// image; the plugin copies it from PullSecretNamespace into each
	// workload namespace. "" uses none.
	// ImagePullSecrets is the finer form and may be set with it.
	ImagePullSecret string `json:"image_pull_secret"`
	// ImagePullSecrets maps a registry host (as in the image reference,
	// with its port if any: "registry.example.com", "localhost:5000",
	// "docker.io" for images without a host) to the Secret that pods of
	// images from that registry pull with.
	ImagePullSecrets map[string]string `json:"image_pull_secrets"`
	// PullSecretNamespace is where the configured pull Secrets are kept;
	// the plugin copies them into every namespace it runs workloads in
	// (pullsecrets.go). "" copies nothing: the Secrets are then put into
	// each workload namespace by someone else.
	PullSecretNamespace string `json:"pull_secret_namespace"`
	// NodeSelector pins user workloads to the untrusted node pool.
	NodeSelector map[string]string `json:"node_selector"`
	// Tolerations replace the default toleration of the untrusted pool.
	Tolerations []Toleration `json:"tolerations"`
	// SentinelNamespace is where the environment's sentinel pods run; the
	// pods prefer zones that run one.
	SentinelNamespace string `json:"sentinel_namespace"`
	// Probe timings used when a healthcheck leaves one unset.
	ProbeDefaults ProbeDefaults `json:"probe_defaults"`
	// StatusResyncInterval is how often every status is sent again, changed
	// or not, so a report lost on the way heals (Go duration, e.g. "60s").
	StatusResyncInterval string `json:"status_resync_interval"`
	// Upper bounds of a single deployment's request.
	MaxCPUMillicores int64 `json:"max_cpu_millicores"`
	MaxMemoryMiB     int64 `json:"max_memory_mib"`
	MaxReplicas      int32 `json:"max_replicas"`
	// DecryptEnv opens a deployment's sealed secret environment through the
	// krane host (ctrl) and injects it from a Secret with envFrom.
	DecryptEnv bool `json:"decrypt_env"`
	// PassEncryptedEnv also passes the sealed blob, base64, in the variable
	// env_var_names.encrypted_env, for workloads that open it themselves.
	PassEncryptedEnv bool `json:"pass_encrypted_env"`
	// SecretCacheTTL is how long an opened environment stays in memory
	// (Go duration): within it, re-applying a deployment asks ctrl nothing.
	SecretCacheTTL string `json:"secret_cache_ttl"`
	// MaxConcurrentRolls bounds how many deployments of the cluster replace
	// their pod template at the same time (roll.go).
	MaxConcurrentRolls int `json:"max_concurrent_rolls"`
	// MinReadySeconds is the ReplicaSets' minReadySeconds: how long a new
	// pod must be ready before it counts as available, and so before a
	// roll deletes the pods it replaces.
	MinReadySeconds int32 `json:"min_ready_seconds"`
	// RollProgressDeadline is how long a roll may wait for its new
	// ReplicaSet to become available before it gives up its slot and
	// leaves the deployment on its old pods (Go duration, roll.go).
	RollProgressDeadline string `json:"roll_progress_deadline"`

	resync       time.Duration
	cacheTTL     time.Duration
	rollDeadline time.Duration
	// hostNamespace is krane's own when in-cluster (reserved).
	hostNamespace string
}

// EnvVarNames are the names of the variables Krane sets in every workload.
type EnvVarNames struct {
	WorkspaceID   string `json:"workspace_id"`
	ProjectID     string `json:"project_id"`
	EnvironmentID string `json:"environment_id"`
	DeploymentID  string `json:"deployment_id"`
	EncryptedEnv  string `json:"encrypted_env"`
}

func (n EnvVarNames) list() []string {
	return []string{n.WorkspaceID, n.ProjectID, n.EnvironmentID, n.DeploymentID, n.EncryptedEnv}
}

// Toleration is a pod toleration (see the Kubernetes API).
type Toleration struct {
	Key      string `json:"key"`
	Operator string `json:"operator"`
	Value    string `json:"value"`
	Effect   string `json:"effect"`
}

// ProbeDefaults are the probe timings used when a healthcheck sets none.
type ProbeDefaults struct {
	InitialDelaySeconds int32 `json:"initial_delay_seconds"`
	PeriodSeconds       int32 `json:"period_seconds"`
	TimeoutSeconds      int32 `json:"timeout_seconds"`
	FailureThreshold    int32 `json:"failure_threshold"`
}

// Defaults is the configuration of an empty `config {}` block.
func Defaults() Config {
	return Config{
		RuntimeClass: "gvisor",
		EnvVarNames: EnvVarNames{
			WorkspaceID:   "UNKEY_WORKSPACE_ID",
			ProjectID:     "UNKEY_PROJECT_ID",
			EnvironmentID: "UNKEY_ENVIRONMENT_ID",
			DeploymentID:  "UNKEY_DEPLOYMENT_ID",
			EncryptedEnv:  "UNKEY_ENCRYPTED_ENV",
		},
		NodeSelector:         map[string]string{"node-class": "untrusted"},
		Tolerations:          []Toleration{{Key: "karpenter.sh/nodepool", Operator: "Equal", Value: "untrusted", Effect: "NoSchedule"}},
		SentinelNamespace:    "sentinel",
		PullSecretNamespace:  "krane",
		ProbeDefaults:        ProbeDefaults{PeriodSeconds: 10, TimeoutSeconds: 2, FailureThreshold: 3},
		StatusResyncInterval: "60s",
		MaxCPUMillicores:     64_000,
		MaxMemoryMiB:         256 * 1024,
		MaxReplicas:          1000,
		DecryptEnv:           true,
		SecretCacheTTL:       "5m",
		MaxConcurrentRolls:   defaultMaxConcurrentRolls,
		RollProgressDeadline: defaultRollProgressDeadline.String(),
		resync:               time.Minute,
		cacheTTL:             5 * time.Minute,
		rollDeadline:         defaultRollProgressDeadline,
	}
}

// ParseConfig decodes a config block strictly over the defaults. A map or
// list key replaces its default instead of merging into it ({} and [] mean
// none). Errors are *sdk.ConfigError naming the key.
func ParseConfig(raw json.RawMessage) (Config, error) {
	cfg := Defaults()
	cfg.NodeSelector, cfg.Tolerations = nil, nil
	if err := sdk.DecodeConfig(raw, &cfg); err != nil {
		return Config{}, err
	}
	def := Defaults()
	if cfg.NodeSelector == nil {
		cfg.NodeSelector = def.NodeSelector
	}
	if cfg.Tolerations == nil {
		cfg.Tolerations = def.Tolerations
	}
	return cfg, cfg.check()
}

var (
	cIdentifier  = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	registryHost = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?(:[0-9]{1,5})?$`)
)

func (c *Config) check() error {
	bad := func(key, format string, args ...any) error {
		return &sdk.ConfigError{Key: key, Reason: fmt.Sprintf(format, args...)}
	}
	if c.RuntimeClass != "" {
		if errs := validation.IsDNS1123Subdomain(c.RuntimeClass); len(errs) > 0 {
			return bad("runtime_class", "%q: %s", c.RuntimeClass, errs[0])
		}
	}
	names := map[string]string{
		"workspace_id": c.EnvVarNames.WorkspaceID, "project_id": c.EnvVarNames.ProjectID,
		"environment_id": c.EnvVarNames.EnvironmentID, "deployment_id": c.EnvVarNames.DeploymentID,
		"encrypted_env": c.EnvVarNames.EncryptedEnv,
	}
	seen := map[string]string{}
	for _, key := range []string{"workspace_id", "project_id", "environment_id", "deployment_id", "encrypted_env"} {
		name := names[key]
		if !cIdentifier.MatchString(name) {
			return bad("env_var_names."+key, "%q is not a valid variable name (letters, digits and _, not starting with a digit)", name)
		}
		if other, dup := seen[name]; dup {
			return bad("env_var_names."+key, "%q is already used by env_var_names.%s", name, other)
		}
		seen[name] = key
	}
	if c.ImagePullSecret != "" {
		if errs := validation.IsDNS1123Subdomain(c.ImagePullSecret); len(errs) > 0 {
			return bad("image_pull_secret", "%q: %s", c.ImagePullSecret, errs[0])
		}
	}
	lower := make(map[string]string, len(c.ImagePullSecrets))
	for _, host := range slices.Sorted(maps.Keys(c.ImagePullSecrets)) {
		// Host names are case-insensitive; RegistryOf answers in lower case.
		if _, dup := lower[strings.ToLower(host)]; dup {
			return bad("image_pull_secrets", "key %q is given twice (host names ignore case)", host)
		}
		lower[strings.ToLower(host)] = c.ImagePullSecrets[host]
		if !registryHost.MatchString(host) {
			return bad("image_pull_secrets", "key %q is not a registry host: want a host name with an optional port, as in the image reference (\"registry.example.com\", \"localhost:5000\", \"docker.io\"), without a scheme or path", host)
		}
		if secret := c.ImagePullSecrets[host]; validation.IsDNS1123Subdomain(secret) != nil {
			return bad("image_pull_secrets."+host, "%q is not a Secret name: %s", secret, validation.IsDNS1123Subdomain(secret)[0])
		}
	}
	c.ImagePullSecrets = lower
	if slices.Contains(c.pullSecretNames(), CopyKeySecret) {
		return bad("image_pull_secrets", "Secret name %q is the plugin's own pull Secret copy key: name the registry Secret differently", CopyKeySecret)
	}
	if c.PullSecretNamespace != "" {
		if errs := validation.IsDNS1123Label(c.PullSecretNamespace); len(errs) > 0 {
			return bad("pull_secret_namespace", "%q: %s", c.PullSecretNamespace, errs[0])
		}
	}
	for k, v := range c.NodeSelector {
		if errs := validation.IsQualifiedName(k); len(errs) > 0 {
			return bad("node_selector", "key %q: %s", k, errs[0])
		}
		if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
			return bad("node_selector."+k, "%q: %s", v, errs[0])
		}
	}
	for i, t := range c.Tolerations {
		key := fmt.Sprintf("tolerations.%d", i)
		if t.Key != "" {
			if errs := validation.IsQualifiedName(t.Key); len(errs) > 0 {
				return bad(key+".key", "%q: %s", t.Key, errs[0])
			}
		}
		if !slices.Contains([]string{"", "Equal", "Exists"}, t.Operator) {
			return bad(key+".operator", "%q: want Equal or Exists", t.Operator)
		}
		if t.Operator == "Exists" && t.Value != "" {
			return bad(key+".value", "must be empty when operator is Exists")
		}
		if !slices.Contains([]string{"", "NoSchedule", "PreferNoSchedule", "NoExecute"}, t.Effect) {
			return bad(key+".effect", "%q: want NoSchedule, PreferNoSchedule or NoExecute", t.Effect)
		}
	}
	if errs := validation.IsDNS1123Label(c.SentinelNamespace); len(errs) > 0 {
		return bad("sentinel_namespace", "%q: %s", c.SentinelNamespace, errs[0])
	}
	p := c.ProbeDefaults
	switch {
	case p.InitialDelaySeconds < 0:
		return bad("probe_defaults.initial_delay_seconds", "must be >= 0")
	case p.PeriodSeconds < 1:
		return bad("probe_defaults.period_seconds", "must be >= 1")
	case p.TimeoutSeconds < 1:
		return bad("probe_defaults.timeout_seconds", "must be >= 1")
	case p.FailureThreshold < 1:
		return bad("probe_defaults.failure_threshold", "must be >= 1")
	}
	d, err := time.ParseDuration(c.StatusResyncInterval)
	if err != nil || d < time.Second {
		return bad("status_resync_interval", "%q: want a duration of at least 1s, e.g. \"60s\"", c.StatusResyncInterval)
	}
	c.resync = d
	switch {
	case c.MaxCPUMillicores < 1:
		return bad("max_cpu_millicores", "must be >= 1")
	case c.MaxMemoryMiB < 1:
		return bad("max_memory_mib", "must be >= 1")
	case c.MaxReplicas < 1:
		return bad("max_replicas", "must be >= 1")
	}
	if !c.DecryptEnv && !c.PassEncryptedEnv {
		return bad("decrypt_env", "false together with pass_encrypted_env false would give workloads none of their secrets; enable one")
	}
	ttl, err := time.ParseDuration(c.SecretCacheTTL)
	if err != nil || ttl < time.Second || ttl > time.Hour {
		return bad("secret_cache_ttl", "%q: want a duration from 1s to 1h, e.g. \"5m\"", c.SecretCacheTTL)
	}
	c.cacheTTL = ttl
	if c.MaxConcurrentRolls < 1 {
		return bad("max_concurrent_rolls", "%d: must be >= 1 (deployments whose pod template changes roll this many at a time)", c.MaxConcurrentRolls)
	}
	if c.MinReadySeconds < 0 || c.MinReadySeconds > 3600 {
		return bad("min_ready_seconds", "%d: want 0 to 3600", c.MinReadySeconds)
	}
	deadline, err := time.ParseDuration(c.RollProgressDeadline)
	if err != nil || deadline < time.Second || deadline > 24*time.Hour {
		return bad("roll_progress_deadline", "%q: want a duration from 1s to 24h, e.g. \"10m\" (how long a roll waits for its new pods to become available before it gives up its slot)", c.RollProgressDeadline)
	}
	if minReady := time.Duration(c.MinReadySeconds) * time.Second; deadline <= minReady {
		return bad("roll_progress_deadline", "%s is not longer than min_ready_seconds (%s): no roll could ever finish; raise it above min_ready_seconds plus the time pods take to start", deadline, minReady)
	}
	c.rollDeadline = deadline
	return nil
}

func (c Config) tolerations() []corev1.Toleration {
	out := make([]corev1.Toleration, 0, len(c.Tolerations))
	for _, t := range c.Tolerations {
		out = append(out, corev1.Toleration{
			Key: t.Key, Operator: corev1.TolerationOperator(t.Operator),
			Value: t.Value, Effect: corev1.TaintEffect(t.Effect),
		})
	}
	return out
}

// configSchema is the JSON Schema of Config; the host checks a block
// against it before Configure, and ParseConfig repeats the checks.
const configSchema = `{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "type": "object",
  "additionalProperties": false,
  "properties": {
    "runtime_class": {"type": "string", "description": "runtimeClassName of the pods; empty for none (default gvisor)"},
    "env_var_names": {
      "type": "object",
      "additionalProperties": false,
      "properties": {
        "workspace_id":   {"$ref": "#/$defs/envName"},
        "project_id":     {"$ref": "#/$defs/envName"},
        "environment_id": {"$ref": "#/$defs/envName"},
        "deployment_id":  {"$ref": "#/$defs/envName"},
        "encrypted_env":  {"$ref": "#/$defs/envName"}
      }
    },
    "image_pull_secret": {"type": "string", "description": "a Secret every pod pulls with (default none)"},
    "image_pull_secrets": {"type": "object", "additionalProperties": {"type": "string"}, "description": "registry host -> Secret that pods of that registry's images pull with"},
    "pull_secret_namespace": {"type": "string", "pattern": "^([a-z0-9]([-a-z0-9]*[a-z0-9])?)?$", "maxLength": 63, "description": "namespace the pull Secrets are copied from into every workload namespace; empty copies none (default krane)"},
    "node_selector": {"type": "object", "additionalProperties": {"type": "string"}},
    "tolerations": {
      "type": "array",
      "items": {
        "type": "object",
        "additionalProperties": false,
        "properties": {
          "key":      {"type": "string"},
          "operator": {"enum": ["", "Equal", "Exists"]},
          "value":    {"type": "string"},
          "effect":   {"enum": ["", "NoSchedule", "PreferNoSchedule", "NoExecute"]}
        }
      }
    },
    "sentinel_namespace": {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "maxLength": 63},
    "probe_defaults": {
      "type": "object",
      "additionalProperties": false,
      "properties": {
        "initial_delay_seconds": {"type": "integer", "minimum": 0},
        "period_seconds":        {"type": "integer", "minimum": 1},
        "timeout_seconds":       {"type": "integer", "minimum": 1},
        "failure_threshold":     {"type": "integer", "minimum": 1}
      }
    },
    "status_resync_interval": {"type": "string", "pattern": "^([0-9]+(\\.[0-9]+)?(ns|us|ms|s|m|h))+$"},
    "max_cpu_millicores": {"type": "integer", "minimum": 1},
    "max_memory_mib":     {"type": "integer", "minimum": 1},
    "max_replicas":       {"type": "integer", "minimum": 1, "maximum": 2147483647},
    "decrypt_env":        {"type": "boolean", "description": "open sealed secret environments through the krane host and inject them from a Secret (default true)"},
    "pass_encrypted_env": {"type": "boolean", "description": "also pass the sealed blob, base64, in env_var_names.encrypted_env (default false)"},
    "secret_cache_ttl":   {"type": "string", "pattern": "^([0-9]+(\\.[0-9]+)?(ns|us|ms|s|m|h))+$", "description": "how long an opened environment stays in memory (default 5m)"},
    "max_concurrent_rolls": {"type": "integer", "minimum": 1, "description": "how many deployments replace their pod template at once (default 10)"},
    "min_ready_seconds":  {"type": "integer", "minimum": 0, "maximum": 3600, "description": "seconds a new pod must be ready before a roll counts it available (default 0)"},
    "roll_progress_deadline": {"type": "string", "pattern": "^([0-9]+(\\.[0-9]+)?(ns|us|ms|s|m|h))+$", "description": "how long a roll waits for its new pods to become available before it gives up its slot, keeping the old pods (default 10m)"}
  },
  "$defs": {
    "envName": {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]*$"}
  }
}`
