package routes

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// Key is the ConfigMap data key that holds the routes document.
const Key = "routes.json"

// Routes is what one sentinel serves: the environment's hosts and, once the
// environment has a live deployment, where its instances are.
type Routes struct {
	SentinelID    string `json:"sentinel_id"`
	EnvironmentID string `json:"environment_id"`
	// Version grows with every change ctrl makes; the sentinel exports it
	// as a metric so an operator can see which routes a pod serves.
	Version uint64   `json:"version"`
	Hosts   []string `json:"hosts"`
	// Backend is nil while the environment has no live deployment; requests
	// for its hosts then get 503 with that reason.
	Backend *Backend `json:"backend,omitempty"`
}

// Backend is a deployment requests go to. Its instances are the ready
// endpoints of the EndpointSlices labelled
// kubernetes.io/service-name=<Service> in Namespace.
type Backend struct {
	DeploymentID string `json:"deployment_id"`
	Namespace    string `json:"namespace"`
	Service      string `json:"service"`
	// Port is used for endpoints whose slice names no usable port.
	Port int32 `json:"port"`
}

// Parse decodes and validates a routes document. Hosts are normalized to
// lower case; an invalid host is an error rather than silently dropped, so
// a typo is seen where the routes are written. Fields it does not know are
// ignored: the document only grows, and a sentinel of the previous release
// must keep reading what a newer sentinel plugin writes.
func Parse(data []byte) (*Routes, error) {
	var r Routes
	dec := json.NewDecoder(strings.NewReader(string(data)))
	if err := dec.Decode(&r); err != nil {
		return nil, fmt.Errorf("routes: decode %s: %w (expected {\"sentinel_id\",\"environment_id\",\"version\",\"hosts\":[...],\"backend\":{...}})", Key, err)
	}
	if err := r.Validate(); err != nil {
		return nil, err
	}
	return &r, nil
}

// Validate checks the document and lower-cases its hosts.
func (r *Routes) Validate() error {
	if r.EnvironmentID == "" {
		return errors.New("routes: environment_id is empty; the routes must name the environment they belong to")
	}
	seen := make(map[string]bool, len(r.Hosts))
	for i, h := range r.Hosts {
		n := strings.ToLower(h)
		if !ValidHost(n) {
			return fmt.Errorf("routes: hosts[%d] %q is not a DNS name (letters, digits, '-', '.', at most 253 characters, no port)", i, h)
		}
		if seen[n] {
			return fmt.Errorf("routes: hosts[%d] %q is listed twice", i, h)
		}
		seen[n] = true
		r.Hosts[i] = n
	}
	if b := r.Backend; b != nil {
		switch {
		case b.DeploymentID == "":
			return errors.New("routes: backend.deployment_id is empty")
		case b.Namespace == "" || b.Service == "":
			return fmt.Errorf("routes: backend of deployment %s needs namespace and service (got %q/%q)", b.DeploymentID, b.Namespace, b.Service)
		case b.Port < 0 || b.Port > 65535:
			return fmt.Errorf("routes: backend of deployment %s has port %d, outside 0-65535", b.DeploymentID, b.Port)
		}
	}
	return nil
}

// Encode is the canonical form the plugin writes.
func (r *Routes) Encode() ([]byte, error) {
	if err := r.Validate(); err != nil {
		return nil, err
	}
	return json.Marshal(r)
}

// ValidHost reports whether h is a lower-case DNS name as routes list them:
// labels of letters, digits, '-' and '_' (seen in the wild), 1-63 bytes each,
// at most 253 bytes in all, an optional trailing dot excluded. A leading "*"
// label is not a wildcard here: routes list exact hosts.
func ValidHost(h string) bool {
	if len(h) == 0 || len(h) > 253 {
		return false
	}
	label := 0
	for i := 0; i < len(h); i++ {
		c := h[i]
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '_':
			label++
		case c == '-':
			if label == 0 {
				return false
			}
			label++
		case c == '.':
			if label == 0 || h[i-1] == '-' {
				return false
			}
			label = 0
			continue
		default:
			return false
		}
		if label > 63 {
			return false
		}
	}
	return label > 0 && h[len(h)-1] != '-'
}
