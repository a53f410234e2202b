package sdk

import (
	"context"
	"encoding/json"
	"time"

	"google.golang.org/protobuf/proto"
)

// Controller is what every plugin implements. The host calls Describe, then
// Configure, then Apply and Inventory concurrently (and, when the plugin has
// them, WatchStatus and Shutdown: see [StatusWatcher] and [Shutdowner]).
//
// The contract, which the host relies on and the conformance suite
// (sdk/plugintest) checks:
//
//   - Describe is static: no cluster access, the same answer every time.
//   - Configure may be called again after a config reload; it replaces the
//     previous configuration as a whole. Check the plugin's RBAC here
//     (kube.Connect does) so a missing permission fails at once, named.
//   - Apply is called concurrently for different objects, never
//     concurrently for one object, and in increasing version order per
//     object. It answers [Unchanged] without any API write when the cluster
//     already matches (a resync re-applies every object every few minutes),
//     [Applied] after writing and [Deleted] for a delete, also when the
//     objects were already gone. Errors are retried with backoff; wrap what
//     retrying cannot fix with [Permanent] or [InvalidField].
//   - Inventory lists only objects the plugin created (selected by Krane's
//     managed-by label), each with the version last applied to it: the host
//     garbage-collects every item desired state no longer names.
//
// Every method takes a request struct and returns a response struct, so
// that fields can be added without breaking plugins built against an older
// SDK.
type Controller interface {
	// Describe returns the plugin's name, version, kinds, config schema and
	// the permissions it needs in the cluster.
	Describe(ctx context.Context, req *DescribeRequest) (*DescribeResponse, error)

	// Configure hands the plugin its cluster and its config block. Return
	// a [*ConfigError] for a bad config so the operator sees which key is
	// wrong.
	Configure(ctx context.Context, req *ConfigureRequest) (*ConfigureResponse, error)

	// Apply makes the cluster match one object's desired state.
	Apply(ctx context.Context, req *ApplyRequest) (*ApplyResponse, error)

	// Inventory lists the objects of one kind the plugin manages.
	Inventory(ctx context.Context, req *InventoryRequest) (*InventoryResponse, error)
}

// StatusWatcher is an optional capability: a plugin that reports actual
// state implements it. [StatusFeed] implements it for the plugin: coalescing,
// dedupe, delete-once and periodic resend included.
type StatusWatcher interface {
	// WatchStatus sends actual-state reports until ctx is cancelled. The
	// host may call it again after a failure; each call starts with the full
	// picture.
	WatchStatus(ctx context.Context, send func(StatusReport) error) error
}

// Shutdowner is an optional capability: a plugin with informers or
// in-flight work to stop implements it. Shutdown must return before ctx's
// deadline; the process is killed afterwards.
type Shutdowner interface {
	Shutdown(ctx context.Context) error
}

// Plugin is a whole plugin as the host sees it: every capability, answered
// over the wire (a plugin without a capability answers it trivially).
// [Dispense] and sdk/plugintest return one.
type Plugin interface {
	Controller
	StatusWatcher
	Shutdowner
}

// DescribeRequest asks a plugin what it is. It carries nothing yet.
type DescribeRequest struct{}

// DescribeResponse is a plugin's description. Its fields are the Info's
// (resp.Name, resp.Kinds, ...).
type DescribeResponse struct {
	Info
}

// ConfigureResponse answers a Configure. It carries nothing yet.
type ConfigureResponse struct{}

// Info describes a plugin.
type Info struct {
	// Name is the controller's name, as used in krane.hcl.
	Name string `json:"name"`
	// Version is the plugin's own version (semver); [BuildVersion] reads
	// it from the binary.
	Version string `json:"version"`
	// Kinds are the resource kinds the plugin reconciles.
	Kinds []KindInfo `json:"kinds"`
	// ConfigSchema is the JSON Schema (draft 2020-12) of the plugin's
	// `config {}` block. The host validates the block against it.
	ConfigSchema string `json:"config_schema"`
	// Permissions are what the plugin's identity must be allowed to do in
	// the cluster. kube.Connect checks them at Configure and `krane
	// validate --cluster` checks them before a start; each missing one is
	// named.
	Permissions []Permission `json:"permissions"`
}

// KindInfo describes one resource kind.
type KindInfo struct {
	Kind        string `json:"kind"`
	Description string `json:"description,omitempty"`
	// SpecType is the full proto message name of the spec, e.g.
	// "krane.cluster.v1.Deployment", or "google.protobuf.Struct" for kinds
	// whose spec is JSON (every kind registered with ctrl by its authors).
	SpecType string `json:"spec_type"`
	// SpecSchema is the JSON Schema (draft 2020-12) of a JSON spec, when the
	// plugin publishes one: `krane-plugin-x --describe` prints it, and
	// `ctrl kind register` takes it, so ctrl refuses a spec the plugin
	// would refuse before it reaches any cluster.
	SpecSchema string `json:"spec_schema,omitempty"`
}

// Permission is one thing a plugin's identity must be allowed to do: Verbs
// on Resource of Group, in Namespace ("" means in every namespace, or a
// cluster-scoped resource), on the object Name ("" means any).
type Permission struct {
	// Group is the API group ("" for the core group, "apps", ...).
	Group string `json:"group,omitempty"`
	// Resource is the plural resource name ("configmaps", "deployments").
	Resource string `json:"resource"`
	// Verbs are RBAC verbs: get, list, watch, create, update, patch, delete.
	Verbs     []string `json:"verbs"`
	Namespace string   `json:"namespace,omitempty"`
	Name      string   `json:"name,omitempty"`
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
	// Spec is the kind's payload; empty when Deleted. A kind registered
	// with ctrl by its authors arrives as a google.protobuf.Struct: decode
	// it with [Spec.DecodeJSON].
	Spec Spec
	// TraceParent is the W3C trace context (traceparent value) of the
	// operation that made the change, e.g. a deploy; empty when untraced.
	// The sdk runs Apply inside a child span of it, so a controller that
	// traces its own calls passes ctx on and nothing more.
	TraceParent string
}

// ApplyRequest asks the plugin to make one object match its desired state.
// Its fields are the Change's (req.ID, req.Spec, ...).
type ApplyRequest struct {
	Change
}

// ApplyResponse says what an Apply did.
type ApplyResponse struct {
	Result Result
}

// Result is what an Apply did to the cluster.
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

// Done answers an Apply: with result r when err is nil, else with err.
func Done(r Result, err error) (*ApplyResponse, error) {
	if err != nil {
		return nil, err
	}
	return &ApplyResponse{Result: r}, nil
}

// InventoryRequest asks for the managed objects of one kind.
type InventoryRequest struct {
	Kind string
}

// InventoryResponse lists the managed objects found.
type InventoryResponse struct {
	Items []InventoryItem
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
