package controller

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"strconv"
	"sync"

	"github.com/hashicorp/go-hclog"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/validation"

	clusterv1 "krane.dev/proto/krane/cluster/v1"
	"krane.dev/sdk"
	"krane.dev/sdk/kube"
	"krane.dev/shared/kinds"
	"krane.dev/shared/version"
)

// Name is the controller's name in krane.hcl.
const Name = "cilium"

// Controller reconciles CiliumNetworkPolicies from ctrl's JSON. Its
// embedded StatusFeed is its WatchStatus.
type Controller struct {
	*sdk.StatusFeed
	log      hclog.Logger
	failures failures
	calls    kube.CallCounter

	// repair re-applies a policy someone else changed or deleted at once,
	// from ctrl's desired state (sdk/kube.Repairer), instead of at the
	// host's next resync.
	repair *kube.Repairer
	stop   context.CancelFunc

	mu   sync.RWMutex
	cfg  Config
	cl   *cluster // nil until configured
	memo *memo    // valid for cfg only: replaced with it
}

// New returns an unconfigured controller.
func New(log hclog.Logger) *Controller {
	c := &Controller{log: log}
	c.StatusFeed = c.newFeed()
	// A repair holds the Repairer's lock of the id, as Apply does.
	c.repair = kube.NewRepairer(kinds.CiliumNetworkPolicy, log, func(ctx context.Context, ch sdk.Change) error {
		_, err := c.applyChange(ctx, ch)
		return err
	})
	var bg context.Context
	bg, c.stop = context.WithCancel(context.Background())
	go c.repair.Run(bg)
	return c
}

// Permissions are what the plugin's identity needs (rbac.yaml grants
// them, and nothing else): its own policies, read through an informer,
// applied (a server-side apply that creates an object needs create too)
// and deleted.
var Permissions = []sdk.Permission{{Group: GVR.Group, Resource: GVR.Resource, Verbs: []string{"get", "list", "watch", "create", "patch", "delete"}}}

// Calls counts the API calls the controller made (reads and writes).
func (c *Controller) Calls() *kube.CallCounter { return &c.calls }

func (c *Controller) Describe(context.Context, *sdk.DescribeRequest) (*sdk.DescribeResponse, error) {
	return &sdk.DescribeResponse{Info: sdk.Info{
		Name:    Name,
		Version: version.Version,
		Kinds: []sdk.KindInfo{{
			Kind:        kinds.CiliumNetworkPolicy,
			Description: "a CiliumNetworkPolicy (cilium.io/v2) authored by ctrl as JSON, confined to its namespace",
			SpecType:    "krane.cluster.v1.CiliumNetworkPolicy",
		}},
		ConfigSchema: ConfigSchema,
		Permissions:  Permissions,
	}}, nil
}

func (c *Controller) Configure(ctx context.Context, req *sdk.ConfigureRequest) (*sdk.ConfigureResponse, error) {
	cfg, err := ParseConfig(req.Config)
	if err != nil {
		return nil, err
	}
	k, err := kube.Connect(ctx, req.Kube, Permissions, c.calls.Wrap)
	if err != nil {
		return nil, err
	}
	c.repair.SetHost(req.Host)
	cl := newCluster(k, c, c.repair)
	c.mu.Lock()
	old := c.cl
	c.cfg, c.cl, c.memo = cfg, cl, newMemo()
	c.mu.Unlock()
	old.close()
	c.ChangedAll()
	if len(cfg.AllowedNamespaces) == 0 && len(cfg.AllowedNamespacePrefixes) == 0 {
		c.log.Warn("no namespace is allowed for network policies: every policy will be refused until allowed_namespaces or allowed_namespace_prefixes is set")
	}
	c.log.Info("configured", "region", req.Region, "cluster", req.ClusterID,
		"allowed_namespaces", cfg.AllowedNamespaces, "allowed_namespace_prefixes", cfg.AllowedNamespacePrefixes,
		"allowed_peer_namespaces", cfg.AllowedPeerNamespaces, "max_policy_bytes", cfg.MaxPolicyBytes)
	return &sdk.ConfigureResponse{}, nil
}

// Apply applies one change under the id's repair lock and records it for
// repairs (kube.Repairer.Apply).
func (c *Controller) Apply(ctx context.Context, req *sdk.ApplyRequest) (*sdk.ApplyResponse, error) {
	return c.repair.Apply(ctx, req, c.applyChange)
}

// applyChange is one Apply, for the host or a repair; the caller holds the
// id's lock.
func (c *Controller) applyChange(ctx context.Context, ch sdk.Change) (sdk.Result, error) {
	c.mu.RLock()
	cfg, cl, memo := c.cfg, c.cl, c.memo
	c.mu.RUnlock()
	if cl == nil {
		return 0, errNotConfigured
	}
	if ch.Kind != kinds.CiliumNetworkPolicy {
		return 0, sdk.InvalidField("kind", "%q: this plugin reconciles only %q", ch.Kind, kinds.CiliumNetworkPolicy)
	}
	if errs := validation.IsValidLabelValue(ch.ID); ch.ID == "" || len(errs) > 0 {
		return 0, sdk.InvalidField("id", "%q is not usable as the %s label value: %v", ch.ID, IDLabel, errs)
	}
	if ch.Deleted {
		c.Deleted(ch.ID, ch.Version)
		c.failures.clear(ch.ID)
		if err := c.delete(ctx, cl, ch.ID); err != nil {
			return 0, err
		}
		memo.forget(ch.ID)
		return sdk.Deleted, nil
	}
	res, err := c.apply(ctx, cfg, cl, memo, ch)
	if err != nil {
		c.failures.set(ch.ID, ch.Version, err)
	} else {
		c.failures.clear(ch.ID)
	}
	c.Changed(ch.ID)
	return res, err
}

func (c *Controller) apply(ctx context.Context, cfg Config, cl *cluster, memo *memo, ch sdk.Change) (sdk.Result, error) {
	// Everything is validated before the first API call.
	var pb clusterv1.CiliumNetworkPolicy
	if err := ch.Spec.Decode(&pb); err != nil {
		return 0, err
	}
	key := memoKey(&pb, ch.Version)
	want, ok := memo.get(ch.ID, key)
	if !ok {
		var err error
		if want, err = Build(&pb, ch.ID, ch.Version, cfg); err != nil {
			return 0, err
		}
		memo.put(ch.ID, key, want)
	}
	if _, err := cl.policies(ctx); err != nil {
		return 0, err
	}
	var live *unstructured.Unstructured
	var stale []*unstructured.Unstructured
	for _, u := range cl.byID(ch.ID) {
		if u.GetNamespace() == pb.GetK8SNamespace() && u.GetName() == pb.GetK8SName() {
			live = u
		} else {
			stale = append(stale, u)
		}
	}
	result := sdk.Unchanged
	if live == nil || kube.Drift(want.Object.Object, live.Object) != "" {
		out, err := kube.Apply(ctx, cl.dyn, GVR, want.Object)
		if err != nil {
			return 0, classify(err, pb.GetK8SNamespace())
		}
		cl.repair.Wrote(out)
		result = sdk.Applied
	}
	// Renamed or moved: the old object goes only once the new one is in
	// place, so the pods are never left without the policy.
	for _, u := range stale {
		if err := cl.deleteObject(ctx, u); err != nil {
			return 0, err
		}
		result = sdk.Applied
	}
	return result, nil
}

// classify turns an API error into what the host should do with it.
func classify(err error, ns string) error {
	var status apierrors.APIStatus
	if errors.As(err, &status) && apierrors.IsNotFound(err) {
		if d := status.Status().Details; d != nil && d.Kind == "namespaces" {
			return fmt.Errorf("namespace %q does not exist yet (the workload's controller creates it); retrying: %w", ns, err)
		}
		return fmt.Errorf("%w (%v)", errCRDMissing, err)
	}
	switch {
	case apierrors.IsInvalid(err), apierrors.IsBadRequest(err):
		return sdk.Permanent(fmt.Errorf("rejected by the API server: %w", err))
	case apierrors.IsForbidden(err):
		// RBAC (see rbac.yaml) or an admission policy refused it; neither
		// changes by retrying soon.
		return sdk.Permanent(fmt.Errorf("forbidden by the API server (check the plugin's RBAC and admission policies): %w", err))
	}
	return err
}

// delete removes every policy carrying id. It lists from the API server
// rather than the cache so that a policy applied a moment ago goes too.
func (c *Controller) delete(ctx context.Context, cl *cluster, id string) error {
	if _, err := cl.policies(ctx); errors.Is(err, errCRDMissing) {
		return nil // no CRD, no policies
	} else if err != nil {
		return err
	}
	objs, err := cl.listLive(ctx, id)
	if err != nil {
		return fmt.Errorf("list CiliumNetworkPolicies of %s: %w", id, err)
	}
	for i := range objs {
		if err := cl.deleteObject(ctx, &objs[i]); err != nil {
			return err
		}
	}
	return nil
}

func (c *Controller) Inventory(ctx context.Context, req *sdk.InventoryRequest) (*sdk.InventoryResponse, error) {
	if req.Kind != kinds.CiliumNetworkPolicy {
		return &sdk.InventoryResponse{}, nil
	}
	cl := c.cluster()
	if cl == nil {
		return nil, errNotConfigured
	}
	if _, err := cl.policies(ctx); errors.Is(err, errCRDMissing) {
		return &sdk.InventoryResponse{}, nil // no CRD, no policies
	} else if err != nil {
		return nil, err
	}
	return kube.Inventory(kinds.CiliumNetworkPolicy, IDLabel, cl.all()), nil
}

func (c *Controller) Shutdown(context.Context) error {
	c.stop()
	c.mu.Lock()
	cl := c.cl
	c.cl = nil
	c.mu.Unlock()
	cl.close()
	return nil
}

func (c *Controller) cluster() *cluster {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.cl
}

// memo remembers, per policy, the last desired object built and the input
// it was built from. A resync re-sends the same input every minute, and
// cilium's validator costs about a millisecond per policy: with the memo an
// unchanged policy costs a hash and a map lookup. It holds one object per
// policy and is dropped whenever the config changes.
type memo struct {
	mu sync.Mutex
	m  map[string]memoEntry
}

type memoEntry struct {
	key  [sha256.Size]byte
	want *Desired
}

func newMemo() *memo { return &memo{m: map[string]memoEntry{}} }

// memoKey identifies everything Build reads besides the config.
func memoKey(pb *clusterv1.CiliumNetworkPolicy, version uint64) [sha256.Size]byte {
	h := sha256.New()
	for _, s := range []string{pb.GetId(), pb.GetK8SNamespace(), pb.GetK8SName(), strconv.FormatUint(version, 10)} {
		h.Write([]byte(s))
		h.Write([]byte{0})
	}
	h.Write(pb.GetPolicy())
	var k [sha256.Size]byte
	h.Sum(k[:0])
	return k
}

func (m *memo) get(id string, key [sha256.Size]byte) (*Desired, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.m[id]
	return e.want, ok && e.key == key
}

func (m *memo) put(id string, key [sha256.Size]byte, want *Desired) {
	m.mu.Lock()
	m.m[id] = memoEntry{key: key, want: want}
	m.mu.Unlock()
}

func (m *memo) forget(id string) {
	m.mu.Lock()
	delete(m.m, id)
	m.mu.Unlock()
}
