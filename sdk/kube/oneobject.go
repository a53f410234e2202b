package kube

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync/atomic"

	"github.com/hashicorp/go-hclog"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/cache"

	"krane.dev/sdk"
)

// OneObject describes a plugin of the most common shape: each resource of
// one kind becomes one Kubernetes object of type T, built from the
// resource's spec (S, decoded from JSON) and the plugin's config block (C,
// decoded strictly). Give it to NewOneObjectController for a whole
// sdk.Controller; write the Controller yourself, with the same helpers
// (Connect, Informers, Track, ApplyOne, DeleteAll, sdk.StatusFeed), when a
// resource needs several objects or more than one informer.
type OneObject[T Cached, S, C any] struct {
	// Info is what Describe answers; it names exactly one kind.
	Info sdk.Info
	// Component is the value of ComponentLabel on the plugin's objects: the
	// informer watches only Krane's objects of this component.
	Component string
	// Resource is T's API resource, e.g. configmaps in core/v1.
	Resource schema.GroupVersionResource
	// Informer adds T's informer to i, narrowed to the objects selector
	// selects (the plugin's own), e.g.
	// kube.InformerOf[corev1.ConfigMap, corev1.ConfigMapList]("configmaps").
	Informer func(i *Informers, c *Clients, selector string) cache.SharedIndexInformer
	// Validate refuses a spec that cannot work (sdk.InvalidField names the
	// field); nil accepts every spec that decodes.
	Validate func(spec S, cfg C) error
	// Build returns the object of a valid spec: its name, namespace and
	// content. Krane's labels and annotations (managed-by, component, the
	// resource id, the version and spec hash) and T's apiVersion and kind
	// are added to it.
	Build func(spec S, cfg C) T
	// Status is the status reported for a resource whose object exists;
	// nil reports {"present": true}. A resource without an object is
	// reported as {"present": false}.
	Status func(obj T) map[string]any
}

// OneObjectController is the sdk.Controller NewOneObjectController builds:
// Configure connects (checking Info.Permissions, naming what is missing)
// and caches only the plugin's objects; Apply validates, then applies
// through ApplyOne (Unchanged without an API call when the cache matches)
// or deletes through DeleteAll; Inventory and the status feed read the
// cache.
type OneObjectController[T Cached, S, C any] struct {
	*sdk.StatusFeed
	def OneObject[T, S, C]
	log hclog.Logger
	cur atomic.Pointer[oneObjectState[T, C]] // what the last Configure built
}

type oneObjectState[T Cached, C any] struct {
	cfg       C
	client    dynamic.Interface
	objs      *Store[T] // the plugin's objects, by resource id
	informers *Informers
}

// NewOneObjectController returns an unconfigured controller for def. It
// panics when def lacks what every plugin needs (one kind, Component,
// Resource, Informer, Build): that is a programming error, found at start.
func NewOneObjectController[T Cached, S, C any](log hclog.Logger, def OneObject[T, S, C]) *OneObjectController[T, S, C] {
	switch {
	case len(def.Info.Kinds) != 1:
		panic(fmt.Sprintf("kube.OneObject: Info names %d kinds; it must name exactly one", len(def.Info.Kinds)))
	case def.Component == "" || def.Resource.Resource == "" || def.Informer == nil || def.Build == nil:
		panic("kube.OneObject: Component, Resource, Informer and Build are required")
	}
	c := &OneObjectController[T, S, C]{def: def, log: log}
	c.cur.Store(&oneObjectState[T, C]{})
	c.StatusFeed = sdk.NewStatusFeed(sdk.FeedOptions{Kind: c.kind(), Observe: c.observe, IDs: func() []string { return c.cur.Load().objs.IDs() }})
	return c
}

func (c *OneObjectController[T, S, C]) kind() string { return c.def.Info.Kinds[0].Kind }

// Describe returns def.Info.
func (c *OneObjectController[T, S, C]) Describe(context.Context, *sdk.DescribeRequest) (*sdk.DescribeResponse, error) {
	return &sdk.DescribeResponse{Info: c.def.Info}, nil
}

// Configure decodes the config block strictly, connects, and replaces the
// previous configuration (and its informer) as a whole.
func (c *OneObjectController[T, S, C]) Configure(ctx context.Context, req *sdk.ConfigureRequest) (*sdk.ConfigureResponse, error) {
	var cfg C
	if err := sdk.DecodeConfig(req.Config, &cfg); err != nil {
		return nil, err
	}
	k, err := Connect(ctx, req.Kube, c.def.Info.Permissions)
	if err != nil {
		return nil, err
	}
	inf := NewInformers()
	objs, err := Track[T](c.def.Informer(inf, k, ManagedSelector(c.def.Component)), IDLabel, c)
	if err != nil {
		return nil, err
	}
	if err := inf.Start(ctx, 0); err != nil {
		return nil, err
	}
	c.cur.Swap(&oneObjectState[T, C]{cfg: cfg, client: k.Dynamic, objs: objs, informers: inf}).informers.Stop()
	c.ChangedAll()
	c.log.Info("configured", "kind", c.kind(), "region", req.Region, "cluster", req.ClusterID)
	return &sdk.ConfigureResponse{}, nil
}

// Apply makes the resource's one object match its spec, or deletes it.
func (c *OneObjectController[T, S, C]) Apply(ctx context.Context, req *sdk.ApplyRequest) (*sdk.ApplyResponse, error) {
	st := c.cur.Load()
	if st.objs == nil {
		return nil, errors.New("plugin not configured yet")
	}
	if err := ValidateID(req.ID); err != nil {
		return nil, err
	}
	if req.Deleted {
		c.Deleted(req.ID, req.Version)
		return sdk.Done(sdk.Deleted, DeleteAll(ctx, st.client, c.def.Resource, st.objs.Get(req.ID)))
	}
	var spec S
	if err := req.Spec.DecodeJSON(&spec); err != nil {
		return nil, err
	}
	if c.def.Validate != nil {
		if err := c.def.Validate(spec, st.cfg); err != nil {
			return nil, err
		}
	}
	obj, err := c.build(req, spec, st.cfg)
	if err != nil {
		return nil, err
	}
	// A resource renamed or moved leaves its old object behind: ApplyOne
	// removes it.
	return sdk.Done(ApplyOne(ctx, st.client, c.def.Resource, obj, st.objs.Get(req.ID)))
}

// build is def.Build plus Krane's labels, annotations and T's type.
func (c *OneObjectController[T, S, C]) build(req *sdk.ApplyRequest, spec S, cfg C) (T, error) {
	obj := c.def.Build(spec, cfg)
	labels := maps.Clone(obj.GetLabels())
	if labels == nil {
		labels = map[string]string{}
	}
	maps.Copy(labels, ManagedLabels(c.def.Component))
	labels[IDLabel] = req.ID
	obj.SetLabels(labels)
	ann := obj.GetAnnotations()
	if ann == nil {
		ann = map[string]string{}
	}
	maps.Copy(ann, VersionAnnotations(req.Version, SpecHash(spec)))
	obj.SetAnnotations(ann)
	if obj.GetObjectKind().GroupVersionKind().Empty() {
		gvks, _, err := Scheme.ObjectKinds(obj)
		if err != nil || len(gvks) == 0 {
			return obj, fmt.Errorf("kube.OneObject: %T has no apiVersion and kind, and kube.Scheme does not know it: set its TypeMeta in Build: %v", obj, err)
		}
		obj.GetObjectKind().SetGroupVersionKind(gvks[0])
	}
	return obj, nil
}

// Inventory lists the plugin's objects with the version last applied.
func (c *OneObjectController[T, S, C]) Inventory(_ context.Context, req *sdk.InventoryRequest) (*sdk.InventoryResponse, error) {
	if req.Kind != c.kind() {
		return &sdk.InventoryResponse{}, nil
	}
	return c.cur.Load().objs.Inventory(c.kind()), nil
}

// Shutdown stops the informer.
func (c *OneObjectController[T, S, C]) Shutdown(context.Context) error {
	c.cur.Load().informers.Stop()
	return nil
}

// observe is one resource's status, from the cache.
func (c *OneObjectController[T, S, C]) observe(id string) sdk.Observation {
	objs := c.cur.Load().objs.Get(id)
	if len(objs) == 0 {
		st, _ := sdk.JSONStatus(map[string]any{"present": false})
		return sdk.Observation{Status: st, Gone: true}
	}
	status := map[string]any{"present": true}
	if c.def.Status != nil {
		status = c.def.Status(objs[0])
	}
	st, err := sdk.JSONStatus(status)
	if err != nil {
		c.log.Warn("status is not JSON-shaped: reporting present only", "kind", c.kind(), "id", id, "error", err)
		st, _ = sdk.JSONStatus(map[string]any{"present": true})
	}
	return sdk.Observation{Status: st, Version: AppliedVersion(objs[0].GetAnnotations())}
}
