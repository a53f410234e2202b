package main

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	listersv1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"krane.dev/internal/version"
	"krane.dev/sdk"
	"krane.dev/sdk/kube"
)

// Kind is the resource kind this plugin reconciles.
const Kind = "configmap.example.krane.dev"

const component = "configmap-example"

// Spec is the desired state of one resource, as JSON from ctrl.
type Spec struct {
	Namespace string            `json:"namespace"`
	Name      string            `json:"name"`
	Data      map[string]string `json:"data"`
}

// Config is the plugin's `config {}` block in krane.hcl.
type Config struct {
	// AllowedNamespaces limits where ConfigMaps may be written; empty
	// allows every namespace.
	AllowedNamespaces []string `json:"allowed_namespaces"`
}

const configSchema = `{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "type": "object",
  "additionalProperties": false,
  "properties": {
    "allowed_namespaces": {
      "type": "array",
      "items": {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"}
    }
  }
}`

// Controller reconciles ConfigMaps from desired state.
type Controller struct {
	log hclog.Logger

	mu      sync.RWMutex
	cfg     Config
	client  kubernetes.Interface
	dynamic dynamic.Interface
	lister  listersv1.ConfigMapLister
	stop    chan struct{}
	// dirty collects ids whose ConfigMap changed, for WatchStatus.
	dirty *dirtySet
}

// NewController returns an unconfigured controller.
func NewController(log hclog.Logger) *Controller {
	return &Controller{log: log, dirty: newDirtySet()}
}

func (c *Controller) Describe(context.Context) (sdk.Info, error) {
	return sdk.Info{
		Name:         "configmap",
		Version:      version.Version,
		Kinds:        []sdk.KindInfo{{Kind: Kind, Description: "one ConfigMap per resource (example plugin)", SpecType: "google.protobuf.Struct"}},
		ConfigSchema: configSchema,
	}, nil
}

func (c *Controller) Configure(ctx context.Context, req sdk.ConfigureRequest) error {
	var cfg Config
	if err := sdk.DecodeConfig(req.Config, &cfg); err != nil {
		return err
	}
	rc, err := kube.RESTConfig(req.Kube)
	if err != nil {
		return err
	}
	client, err := kube.NewClientset(rc)
	if err != nil {
		return err
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return err
	}
	// Watch only our own ConfigMaps: the cache stays small and Krane never
	// sees, let alone touches, anything it does not manage.
	factory := informers.NewSharedInformerFactoryWithOptions(client, 10*time.Minute,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = kube.ManagedSelector(component) }))
	inf := factory.Core().V1().ConfigMaps()
	if _, err := inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { c.markDirty(obj) },
		UpdateFunc: func(_, obj any) { c.markDirty(obj) },
		DeleteFunc: func(obj any) { c.markDirty(obj) },
	}); err != nil {
		return err
	}
	stop := make(chan struct{})
	factory.Start(stop)
	for typ, ok := range factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			close(stop)
			return fmt.Errorf("informer cache for %v did not sync: is the API server reachable with this kubeconfig?", typ)
		}
	}
	c.mu.Lock()
	if c.stop != nil {
		close(c.stop)
	}
	c.cfg, c.client, c.dynamic, c.lister, c.stop = cfg, client, dyn, inf.Lister(), stop
	c.mu.Unlock()
	c.log.Info("configured", "region", req.Region, "cluster", req.ClusterID, "allowed_namespaces", cfg.AllowedNamespaces)
	return nil
}

func (c *Controller) Apply(ctx context.Context, ch sdk.Change) (sdk.Result, error) {
	c.mu.RLock()
	cfg, client, dyn, lister := c.cfg, c.client, c.dynamic, c.lister
	c.mu.RUnlock()
	if lister == nil {
		return 0, fmt.Errorf("apply %s: plugin not configured yet", ch.ID)
	}
	if errs := validation.IsValidLabelValue(ch.ID); len(errs) > 0 {
		return 0, sdk.InvalidField("id", "%q is not usable as a label value: %s", ch.ID, errs[0])
	}
	current := c.byID(lister, ch.ID)
	if ch.Deleted {
		return sdk.Deleted, deleteAll(ctx, client, current)
	}
	var spec Spec
	if err := ch.Spec.DecodeJSON(&spec); err != nil {
		return 0, err
	}
	if err := validate(spec, cfg); err != nil {
		return 0, err
	}
	desired, err := kube.ToUnstructured(build(ch, spec))
	if err != nil {
		return 0, err
	}
	// A resource renamed or moved leaves its old ConfigMap behind: remove it.
	var stale []*corev1.ConfigMap
	var live *corev1.ConfigMap
	for _, cm := range current {
		if cm.Namespace == spec.Namespace && cm.Name == spec.Name {
			live = cm
		} else {
			stale = append(stale, cm)
		}
	}
	if err := deleteAll(ctx, client, stale); err != nil {
		return 0, err
	}
	if live != nil {
		if drift, err := kube.DriftObject(desired.Object, live); err == nil && drift == "" {
			return sdk.Unchanged, nil
		}
	}
	if _, err := kube.Apply(ctx, dyn, corev1.SchemeGroupVersion.WithResource("configmaps"), desired); err != nil {
		if apierrors.IsNotFound(err) {
			return 0, fmt.Errorf("namespace %q does not exist: create it, or let another controller manage it: %w", spec.Namespace, err)
		}
		if apierrors.IsInvalid(err) || apierrors.IsForbidden(err) {
			return 0, sdk.Permanent(err)
		}
		return 0, err
	}
	return sdk.Applied, nil
}

func (c *Controller) Inventory(_ context.Context, kind string) ([]sdk.InventoryItem, error) {
	c.mu.RLock()
	lister := c.lister
	c.mu.RUnlock()
	if kind != Kind || lister == nil {
		return nil, nil
	}
	cms, err := lister.List(labels.Everything())
	if err != nil {
		return nil, err
	}
	items := make([]sdk.InventoryItem, 0, len(cms))
	for _, cm := range cms {
		items = append(items, sdk.InventoryItem{
			Kind: Kind, ID: cm.Labels[kube.IDLabel],
			Version:  kube.AppliedVersion(cm.Annotations),
			SpecHash: cm.Annotations[kube.SpecHashAnnotation],
		})
	}
	return items, nil
}

// WatchStatus reports, per resource, whether its ConfigMap exists and how
// many keys it holds. Changes are coalesced: one report per resource per
// tick, however many events arrived.
func (c *Controller) WatchStatus(ctx context.Context, send func(sdk.StatusReport) error) error {
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		c.mu.RLock()
		lister := c.lister
		c.mu.RUnlock()
		for _, id := range c.dirty.drain() {
			status := map[string]any{"present": false}
			var observed uint64
			if lister != nil {
				if cms := c.byID(lister, id); len(cms) > 0 {
					status = map[string]any{"present": true, "namespace": cms[0].Namespace, "name": cms[0].Name, "keys": len(cms[0].Data)}
					observed = kube.AppliedVersion(cms[0].Annotations)
				}
			}
			msg, err := sdk.JSONStatus(status)
			if err != nil {
				return err
			}
			if err := send(sdk.StatusReport{Kind: Kind, ID: id, ObservedVersion: observed, ObservedAt: time.Now(), Status: msg}); err != nil {
				return err
			}
		}
	}
}

func (c *Controller) Shutdown(context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stop != nil {
		close(c.stop)
		c.stop = nil
	}
	return nil
}

func (c *Controller) markDirty(obj any) {
	if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	if cm, ok := obj.(*corev1.ConfigMap); ok {
		c.dirty.add(cm.Labels[kube.IDLabel])
	}
}

func (c *Controller) byID(lister listersv1.ConfigMapLister, id string) []*corev1.ConfigMap {
	cms, _ := lister.List(labels.SelectorFromSet(labels.Set{kube.IDLabel: id}))
	return cms
}

func build(ch sdk.Change, spec Spec) *corev1.ConfigMap {
	l := kube.ManagedLabels(component)
	l[kube.IDLabel] = ch.ID
	return &corev1.ConfigMap{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: metav1.ObjectMeta{
			Name: spec.Name, Namespace: spec.Namespace, Labels: l,
			Annotations: kube.VersionAnnotations(ch.Version, kube.SpecHash(spec)),
		},
		Data: spec.Data,
	}
}

func validate(s Spec, cfg Config) error {
	if errs := validation.IsDNS1123Label(s.Namespace); len(errs) > 0 {
		return sdk.InvalidField("namespace", "%q: %s", s.Namespace, errs[0])
	}
	if len(cfg.AllowedNamespaces) > 0 && !slices.Contains(cfg.AllowedNamespaces, s.Namespace) {
		return sdk.InvalidField("namespace", "%q is not in this cluster's allowed_namespaces %v", s.Namespace, cfg.AllowedNamespaces)
	}
	if errs := validation.IsDNS1123Subdomain(s.Name); len(errs) > 0 {
		return sdk.InvalidField("name", "%q: %s", s.Name, errs[0])
	}
	for k := range s.Data {
		if errs := validation.IsConfigMapKey(k); len(errs) > 0 {
			return sdk.InvalidField("data", "key %q: %s", k, errs[0])
		}
	}
	return nil
}

func deleteAll(ctx context.Context, client kubernetes.Interface, cms []*corev1.ConfigMap) error {
	for _, cm := range cms {
		err := client.CoreV1().ConfigMaps(cm.Namespace).Delete(ctx, cm.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &cm.UID}})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return fmt.Errorf("delete ConfigMap %s/%s: %w", cm.Namespace, cm.Name, err)
		}
	}
	return nil
}

// dirtySet is a set of ids with pending status reports.
type dirtySet struct {
	mu  sync.Mutex
	ids map[string]struct{}
}

func newDirtySet() *dirtySet { return &dirtySet{ids: map[string]struct{}{}} }

func (d *dirtySet) add(id string) {
	if id == "" {
		return
	}
	d.mu.Lock()
	d.ids[id] = struct{}{}
	d.mu.Unlock()
}

func (d *dirtySet) drain() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]string, 0, len(d.ids))
	for id := range d.ids {
		out = append(out, id)
	}
	clear(d.ids)
	return out
}
