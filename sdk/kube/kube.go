// Package kube holds what every Kubernetes-facing plugin needs: a client
// config from the host's KubeSource, Krane's labels and annotations, spec
// hashing, server-side apply with Krane's field manager, a drift check that
// compares desired state with an informer's copy without calling the API
// server, and a round tripper that counts API calls.
package kube

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"krane.dev/sdk"
)

// Labels and annotations Krane puts on every object it manages. Krane only
// ever lists, changes or deletes objects carrying ManagedByLabel=ManagedBy.
const (
	ManagedByLabel = "app.kubernetes.io/managed-by"
	ManagedBy      = "krane"
	ComponentLabel = "app.kubernetes.io/component"
	// IDLabel carries the resource id (for kinds whose ids are valid label
	// values); plugins of the built-in kinds use the seeds' unkey.com labels.
	IDLabel = "krane.dev/id"
	// VersionAnnotation is the desired-state version last applied.
	VersionAnnotation = "krane.dev/version"
	// SpecHashAnnotation is the hash of the desired spec last applied.
	SpecHashAnnotation = "krane.dev/spec-hash"
	// FieldManager is the server-side apply field manager of every write.
	FieldManager = "krane"
)

// Default client-side rate limits when the host sets none. Bootstrap of
// thousands of objects is bounded by these, not by the API server.
const (
	DefaultQPS   = 500
	DefaultBurst = 1000
)

// RESTConfig builds a client config from the host's KubeSource.
func RESTConfig(src sdk.KubeSource) (*rest.Config, error) {
	var (
		cfg *rest.Config
		err error
	)
	if src.InCluster {
		cfg, err = rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("in-cluster config (is the plugin running in a pod with a ServiceAccount?): %w", err)
		}
	} else {
		rules := &clientcmd.ClientConfigLoadingRules{ExplicitPath: src.Path}
		if src.Path == "" {
			rules = clientcmd.NewDefaultClientConfigLoadingRules()
		}
		overrides := &clientcmd.ConfigOverrides{CurrentContext: src.Context}
		cfg, err = clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, overrides).ClientConfig()
		if err != nil {
			return nil, fmt.Errorf("kubeconfig %q: %w", src.Path, err)
		}
	}
	cfg.QPS, cfg.Burst = DefaultQPS, DefaultBurst
	if src.QPS > 0 {
		cfg.QPS = src.QPS
	}
	if src.Burst > 0 {
		cfg.Burst = src.Burst
	}
	cfg.UserAgent = "krane-plugin"
	return cfg, nil
}

// SpecHash is a stable hash of v's JSON encoding (maps are encoded with
// sorted keys), used to tell whether a desired spec changed.
func SpecHash(v any) string {
	data, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("kube.SpecHash: %v", err))
	}
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:12])
}

// ManagedLabels returns the labels every object of a component carries.
func ManagedLabels(component string) map[string]string {
	return map[string]string{ManagedByLabel: ManagedBy, ComponentLabel: component}
}

// ManagedSelector selects a component's objects.
func ManagedSelector(component string) string {
	return ManagedByLabel + "=" + ManagedBy + "," + ComponentLabel + "=" + component
}

// VersionAnnotations records the applied version and spec hash.
func VersionAnnotations(version uint64, specHash string) map[string]string {
	return map[string]string{VersionAnnotation: strconv.FormatUint(version, 10), SpecHashAnnotation: specHash}
}

// AppliedVersion reads VersionAnnotation; 0 when absent or malformed.
func AppliedVersion(annotations map[string]string) uint64 {
	v, _ := strconv.ParseUint(annotations[VersionAnnotation], 10, 64)
	return v
}
