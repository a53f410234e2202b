package controller

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"

	"krane.dev/sdk"
)

// DefaultMaxPolicyBytes bounds the policy JSON when the config sets no
// max_policy_bytes. Real policies are a few KiB; the bound keeps a runaway
// or hostile payload from costing the plugin memory and CPU.
const DefaultMaxPolicyBytes = 256 << 10

// maxPolicyBytesLimit is the highest max_policy_bytes accepted: the object
// must still fit etcd's default request limit (1.5 MiB) with its metadata.
const maxPolicyBytesLimit = 1 << 20

// Config is the plugin's `config {}` block in krane.hcl.
type Config struct {
	// AllowedNamespaces are namespaces policies may be written to.
	AllowedNamespaces []string `json:"allowed_namespaces"`
	// AllowedNamespacePrefixes allow every namespace starting with one of
	// them (e.g. "ws-" for per-workspace namespaces).
	AllowedNamespacePrefixes []string `json:"allowed_namespace_prefixes"`
	// AllowedPeerNamespaces are namespaces, besides its own, that a
	// policy's allow rules may name as peers (e.g. "sentinel", whose pods
	// route traffic to every workload).
	AllowedPeerNamespaces []string `json:"allowed_peer_namespaces"`
	// MaxPolicyBytes bounds the size of the policy JSON.
	MaxPolicyBytes int `json:"max_policy_bytes"`
}

// ConfigSchema is the JSON Schema of Config. Configure checks the block
// against it too, so the schema is the one statement of what is valid.
const ConfigSchema = `{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "type": "object",
  "additionalProperties": false,
  "properties": {
    "allowed_namespaces": {
      "description": "Namespaces CiliumNetworkPolicies may be written to.",
      "type": "array",
      "items": {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "maxLength": 63}
    },
    "allowed_namespace_prefixes": {
      "description": "Every namespace starting with one of these prefixes is allowed too.",
      "type": "array",
      "items": {"type": "string", "pattern": "^[a-z0-9][-a-z0-9]*$", "maxLength": 62}
    },
    "allowed_peer_namespaces": {
      "description": "Namespaces besides its own that a policy's allow rules may name as peers.",
      "type": "array",
      "items": {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "maxLength": 63}
    },
    "max_policy_bytes": {
      "description": "Largest policy JSON accepted, in bytes (default 262144).",
      "type": "integer",
      "minimum": 1,
      "maximum": 1048576
    }
  }
}`

// ParseConfig validates a config block and returns it with defaults
// filled in. Errors are [*sdk.ConfigError]s naming the key.
func ParseConfig(raw json.RawMessage) (Config, error) {
	if err := sdk.ValidateConfig(ConfigSchema, raw); err != nil {
		return Config{}, err
	}
	cfg := Config{MaxPolicyBytes: DefaultMaxPolicyBytes}
	if err := sdk.DecodeConfig(raw, &cfg); err != nil {
		return Config{}, err
	}
	// The schema already says all of this; checking again keeps a plugin
	// that is handed an unvalidated block (tests, other hosts) safe.
	for key, names := range map[string][]string{"allowed_namespaces": cfg.AllowedNamespaces, "allowed_peer_namespaces": cfg.AllowedPeerNamespaces} {
		for _, ns := range names {
			if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
				return Config{}, &sdk.ConfigError{Key: key, Reason: fmt.Sprintf("%q is not a namespace name: %s", ns, errs[0])}
			}
		}
	}
	for _, p := range cfg.AllowedNamespacePrefixes {
		if p == "" {
			return Config{}, &sdk.ConfigError{Key: "allowed_namespace_prefixes", Reason: "an empty prefix would allow every namespace; list the namespaces instead"}
		}
	}
	if cfg.MaxPolicyBytes < 1 || cfg.MaxPolicyBytes > maxPolicyBytesLimit {
		return Config{}, &sdk.ConfigError{Key: "max_policy_bytes", Reason: fmt.Sprintf("%d is outside 1..%d", cfg.MaxPolicyBytes, maxPolicyBytesLimit)}
	}
	return cfg, nil
}

// NamespaceAllowed reports whether policies may be written to ns.
func (c Config) NamespaceAllowed(ns string) bool {
	if slices.Contains(c.AllowedNamespaces, ns) {
		return true
	}
	for _, p := range c.AllowedNamespacePrefixes {
		if strings.HasPrefix(ns, p) {
			return true
		}
	}
	return false
}

func (c Config) describeAllowed() string {
	return fmt.Sprintf("allowed_namespaces %q, allowed_namespace_prefixes %q", c.AllowedNamespaces, c.AllowedNamespacePrefixes)
}
