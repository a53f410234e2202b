package controller

import (
	"fmt"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"

	"krane.dev/sdk"
)

// Config is the plugin's `config {}` block in krane.hcl.
type Config struct {
	// Namespace holds every sentinel object; created on demand.
	Namespace string `json:"namespace"`
	// LivenessPath and ReadinessPath are the HTTP paths of the probes. They
	// are separate so that a sentinel image with real liveness and
	// readiness endpoints can be used without a code change.
	LivenessPath  string `json:"liveness_path"`
	ReadinessPath string `json:"readiness_path"`
	// Port is the sentinel's HTTP port; GossipPort its peer port (TCP+UDP).
	Port       int32 `json:"port"`
	GossipPort int32 `json:"gossip_port"`
	// AdminPort serves the sentinel's metrics and health, apart from the
	// data port.
	AdminPort int32 `json:"admin_port"`
	// ServiceAccount is the account sentinel pods run as; the manifests
	// create it and let it read routes ConfigMaps in Namespace and
	// EndpointSlices.
	ServiceAccount string `json:"service_account"`
	// EnvFromSecrets are Secrets in Namespace whose keys become the
	// sentinel container's environment (database, Redis, ... credentials).
	EnvFromSecrets []SecretRef `json:"env_from_secrets"`
	// RequireSentinelNodes adds a required node affinity to
	// node-class=sentinel; the toleration for that pool's taint is always
	// set.
	RequireSentinelNodes *bool `json:"require_sentinel_nodes"`
	// StatusResyncInterval is how often every sentinel's status is sent
	// again even when it did not change (a Go duration, e.g. "60s").
	StatusResyncInterval string `json:"status_resync_interval"`
}

// SecretRef names a Secret for envFrom.
type SecretRef struct {
	Name string `json:"name"`
	// Optional lets pods start while the Secret does not exist.
	Optional bool `json:"optional"`
}

// Defaults of the config block.
const (
	DefaultNamespace            = "sentinel"
	DefaultHealthPath           = "/_unkey/internal/health"
	DefaultPort                 = 8040
	DefaultGossipPort           = 7946
	DefaultAdminPort            = 9091
	DefaultServiceAccount       = "krane-sentinel"
	DefaultStatusResyncInterval = time.Minute
)

// ConfigSchema is the JSON Schema of Config; the host validates the block
// against it before Configure, which checks the same rules again.
const ConfigSchema = `{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "type": "object",
  "additionalProperties": false,
  "properties": {
    "namespace": {"type": "string", "maxLength": 63, "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
      "description": "namespace of every sentinel object (default \"sentinel\"); created on demand"},
    "liveness_path": {"type": "string", "pattern": "^/", "description": "HTTP path of the liveness probe"},
    "readiness_path": {"type": "string", "pattern": "^/", "description": "HTTP path of the readiness probe"},
    "port": {"type": "integer", "minimum": 1, "maximum": 65535, "description": "sentinel HTTP port (default 8040)"},
    "gossip_port": {"type": "integer", "minimum": 1, "maximum": 65535, "description": "gossip port, TCP and UDP (default 7946)"},
    "admin_port": {"type": "integer", "minimum": 1, "maximum": 65535, "description": "sentinel metrics and health port (default 9091)"},
    "service_account": {"type": "string", "maxLength": 253, "pattern": "^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
      "description": "ServiceAccount of the sentinel pods in the namespace (default \"krane-sentinel\"; the manifests create it)"},
    "env_from_secrets": {
      "type": "array",
      "description": "Secrets in the namespace exposed to the sentinel container as environment variables",
      "items": {
        "type": "object",
        "additionalProperties": false,
        "required": ["name"],
        "properties": {
          "name": {"type": "string", "minLength": 1, "maxLength": 253},
          "optional": {"type": "boolean"}
        }
      }
    },
    "require_sentinel_nodes": {"type": "boolean", "description": "require nodes labelled node-class=sentinel (default true)"},
    "status_resync_interval": {"type": "string", "pattern": "^([0-9]+(\\.[0-9]+)?(ms|s|m|h))+$",
      "description": "how often unchanged statuses are sent again (default 60s)"}
  }
}`

// settings is a validated Config with defaults applied.
type settings struct {
	Namespace            string
	LivenessPath         string
	ReadinessPath        string
	Port                 int32
	GossipPort           int32
	AdminPort            int32
	ServiceAccount       string
	EnvFromSecrets       []SecretRef
	RequireSentinelNodes bool
	StatusResyncInterval time.Duration
}

// parseConfig decodes a config block strictly and checks it. Every error is
// an *sdk.ConfigError naming the key.
func parseConfig(raw []byte) (settings, error) {
	var cfg Config
	if err := sdk.DecodeConfig(raw, &cfg); err != nil {
		return settings{}, err
	}
	s := settings{
		Namespace:            or(cfg.Namespace, DefaultNamespace),
		LivenessPath:         or(cfg.LivenessPath, DefaultHealthPath),
		ReadinessPath:        or(cfg.ReadinessPath, DefaultHealthPath),
		Port:                 cfg.Port,
		GossipPort:           cfg.GossipPort,
		AdminPort:            cfg.AdminPort,
		ServiceAccount:       or(cfg.ServiceAccount, DefaultServiceAccount),
		EnvFromSecrets:       cfg.EnvFromSecrets,
		RequireSentinelNodes: cfg.RequireSentinelNodes == nil || *cfg.RequireSentinelNodes,
		StatusResyncInterval: DefaultStatusResyncInterval,
	}
	if s.Port == 0 {
		s.Port = DefaultPort
	}
	if s.GossipPort == 0 {
		s.GossipPort = DefaultGossipPort
	}
	if s.AdminPort == 0 {
		s.AdminPort = DefaultAdminPort
	}
	if errs := validation.IsDNS1123Subdomain(s.ServiceAccount); len(errs) > 0 {
		return settings{}, &sdk.ConfigError{Key: "service_account", Reason: fmt.Sprintf("%q is not a ServiceAccount name: %s", s.ServiceAccount, errs[0])}
	}
	if errs := validation.IsDNS1123Label(s.Namespace); len(errs) > 0 {
		return settings{}, &sdk.ConfigError{Key: "namespace", Reason: fmt.Sprintf("%q: %s", s.Namespace, errs[0])}
	}
	for key, p := range map[string]string{"liveness_path": s.LivenessPath, "readiness_path": s.ReadinessPath} {
		if !strings.HasPrefix(p, "/") || strings.ContainsAny(p, " \t\r\n") {
			return settings{}, &sdk.ConfigError{Key: key, Reason: fmt.Sprintf("%q: want an absolute URL path without spaces, e.g. %q", p, DefaultHealthPath)}
		}
	}
	for key, p := range map[string]int32{"port": s.Port, "gossip_port": s.GossipPort, "admin_port": s.AdminPort} {
		if p < 1 || p > 65535 {
			return settings{}, &sdk.ConfigError{Key: key, Reason: fmt.Sprintf("%d is not a port number (1-65535)", p)}
		}
	}
	if s.Port == s.GossipPort {
		return settings{}, &sdk.ConfigError{Key: "gossip_port", Reason: fmt.Sprintf("%d is also the HTTP port: the two must differ", s.GossipPort)}
	}
	if s.AdminPort == s.Port || s.AdminPort == s.GossipPort {
		return settings{}, &sdk.ConfigError{Key: "admin_port", Reason: fmt.Sprintf("%d is also the HTTP or gossip port: each port must differ", s.AdminPort)}
	}
	seen := map[string]bool{}
	for i, ref := range s.EnvFromSecrets {
		key := fmt.Sprintf("env_from_secrets.%d.name", i)
		if errs := validation.IsDNS1123Subdomain(ref.Name); len(errs) > 0 {
			return settings{}, &sdk.ConfigError{Key: key, Reason: fmt.Sprintf("%q is not a Secret name: %s", ref.Name, errs[0])}
		}
		if seen[ref.Name] {
			return settings{}, &sdk.ConfigError{Key: key, Reason: fmt.Sprintf("Secret %q is listed twice", ref.Name)}
		}
		seen[ref.Name] = true
	}
	if cfg.StatusResyncInterval != "" {
		d, err := time.ParseDuration(cfg.StatusResyncInterval)
		if err != nil || d < time.Second {
			return settings{}, &sdk.ConfigError{Key: "status_resync_interval", Reason: fmt.Sprintf("%q: want a duration of at least 1s, e.g. \"60s\"", cfg.StatusResyncInterval)}
		}
		s.StatusResyncInterval = d
	}
	return s, nil
}

func or(v, def string) string {
	if v == "" {
		return def
	}
	return v
}
