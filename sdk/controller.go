package sdk

import (
	"context"
	"encoding/json"
	"time"

	"google.golang.org/protobuf/proto"
)

// Controller is implemented by a plugin. The host calls Describe, then
// Configure, then Apply/Inventory/WatchStatus concurrently, then Shutdown.
//
// Apply is called concurrently for different objects but never concurrently
// for the same object, and always in increasing version order per object.
type Controller interface {
	// Describe returns static facts about the plugin. It is called before
	// Configure and must not touch the cluster.
	Describe(ctx context.Context) (Info, error)

	// Configure hands the plugin its cluster and its config block. It may be
	// called again after a config reload. Return an [*ConfigError] for a bad
	// config so the operator sees which key is wrong.
	Configure(ctx context.Context, req ConfigureRequest) error

	// Apply makes the cluster match one object's desired state. It returns
	// Unchanged without writing when the cluster already matches. Errors are
	// retried with backoff unless wrapped with [Permanent].
	Apply(ctx context.Context, change Change) (Result, error)

	// Inventory lists the objects of kind this plugin manages in the cluster
	// (selected by its managed-by label), with the version last applied to each.
	Inventory(ctx context.Context, kind string) ([]InventoryItem, error)

	// WatchStatus sends actual-state reports until ctx is cancelled. Reports
	// for one object should be coalesced: send when something changed.
	WatchStatus(ctx context.Context, send func(StatusReport) error) error

	// Shutdown stops watches and finishes in-flight work before ctx's
	// deadline. The process is killed afterwards.
	Shutdown(ctx context.Context) error
}

// Info describes a plugin.
type Info struct {
	// Name is the controller's name, as used in krane.hcl.
	Name string
	// Version is the plugin's own version (semver).
	Version string
	// Kinds are the resource kinds the plugin reconciles.
	Kinds []KindInfo
	// ConfigSchema is the JSON Schema (draft 2020-12) of the plugin's
	// `config {}` block. The host validates the block against it.
	ConfigSchema string
}

// KindInfo describes one resource kind.
type KindInfo struct {
	Kind        string
	Description string
	// SpecType is the full proto message name of the spec, e.g.
	// "krane.cluster.v1.Deployment", or "google.protobuf.Struct" for kinds
	// whose spec is JSON.
	SpecType string
}

// ConfigureRequest carries what the host knows about the cluster.
type ConfigureRequest struct {
	Region    string
	ClusterID string
	Kube      KubeSource
	// Config is the controller's config block as a JSON object (never nil;
	// "{}" when the block is empty). Decode it with [DecodeConfig].
	Config json.RawMessage
	// Host is what the krane host does on the plugin's behalf with its ctrl
	// credentials (see [Host]). A plugin always gets a non-nil Host; with a
	// host that serves none, its calls fail with [ErrNoHostService]. On the
	// host side, a non-nil Host is served to the plugin through go-plugin's
	// broker.
	Host Host
}

// KubeSource says how to reach the Kubernetes API server. Package sdk/kube
// turns it into a client-go rest.Config.
type KubeSource struct {
	// InCluster uses the pod's ServiceAccount.
	InCluster bool
	// Path to a kubeconfig file (used when InCluster is false).
	Path string
	// Context within the kubeconfig; empty means current-context.
	Context string
	// Client-side rate limits; zero means the plugin's defaults.
	QPS   float32
	Burst int
}

// Change is one desired state of one object.
type Change struct {
	Kind    string
	ID      string
	Version uint64
	// Deleted means the object must not exist in the cluster.
	Deleted bool
	// Spec is the kind's payload; empty when Deleted.
	Spec Spec
}

// Result is what an Apply did.
type Result int

const (
	// Applied means objects were written.
	Applied Result = iota + 1
	// Unchanged means the cluster already matched and nothing was written.
	Unchanged
	// Deleted means the objects were removed or were already absent.
	Deleted
)

func (r Result) String() string {
	switch r {
	case Applied:
		return "applied"
	case Unchanged:
		return "unchanged"
	case Deleted:
		return "deleted"
	}
	return "unspecified"
}

// InventoryItem is one managed object found in the cluster.
type InventoryItem struct {
	Kind string
	ID   string
	// Version is the desired version last applied (from the object's
	// annotation), 0 when unknown.
	Version  uint64
	SpecHash string
}

// StatusReport is actual state observed in the cluster.
type StatusReport struct {
	Kind string
	ID   string
	// ObservedVersion is the desired version applied when the status was
	// observed; ctrl ignores reports older than what it has.
	ObservedVersion uint64
	ObservedAt      time.Time
	// Status is the kind's status message, e.g. *clusterv1.DeploymentStatus;
	// use [JSONStatus] for kinds whose status is JSON.
	Status proto.Message
}
