package kube

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/tools/cache"
)

// SyncTimeout bounds Informers.Start when the caller gives none: a missing
// permission makes an informer retry forever, and Configure must say so
// instead of hanging until the host's deadline.
const SyncTimeout = 2 * time.Minute

// Informers are a plugin's informer caches, started and synced together.
// Every informer it makes watches only the objects its selector names (a
// plugin's own, by Krane's labels) and drops managedFields, which are most
// of an object's size and never read: the caches stay small.
type Informers struct {
	mu        sync.Mutex
	stop      chan struct{}
	stopOnce  sync.Once
	starts    []func(<-chan struct{})
	syncs     []func(<-chan struct{}) []string
	shutdowns []func()
}

// NewInformers returns an empty set; add informers with Typed, Metadata
// and Dynamic, then Start.
func NewInformers() *Informers { return &Informers{stop: make(chan struct{})} }

// Typed returns a factory of typed informers over the objects selector
// selects (a label selector, e.g. ManagedSelector(component); "" for all).
// opts add to the defaults (e.g. informers.WithNamespace); an
// informers.WithTransform among them replaces StripManagedFields, so give
// it Chain(StripManagedFields, ...) (transform.go).
func (i *Informers) Typed(client kubernetes.Interface, selector string, opts ...informers.SharedInformerOption) informers.SharedInformerFactory {
	base := []informers.SharedInformerOption{informers.WithTransform(StripManagedFields)}
	if selector != "" {
		base = append(base, informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = selector }))
	}
	f := informers.NewSharedInformerFactoryWithOptions(client, 0, append(base, opts...)...)
	i.add(f.Start, func(stop <-chan struct{}) []string {
		var bad []string
		for typ, ok := range f.WaitForCacheSync(stop) {
			if !ok {
				bad = append(bad, resourceOf(typ.String()))
			}
		}
		return bad
	}, f.Shutdown)
	return f
}

// Metadata returns a factory of metadata-only informers (names, labels,
// annotations), e.g. of nodes for their zone labels.
func (i *Informers) Metadata(client metadata.Interface, opts ...metadatainformer.SharedInformerOption) metadatainformer.SharedInformerFactory {
	f := metadatainformer.NewSharedInformerFactoryWithOptions(client, 0, append([]metadatainformer.SharedInformerOption{metadatainformer.WithTransform(StripManagedFields)}, opts...)...)
	i.add(f.Start, func(stop <-chan struct{}) []string { return unsyncedGVRs(f.WaitForCacheSync(stop)) }, f.Shutdown)
	return f
}

// Dynamic returns one informer over gvr (a custom resource, typically) in
// namespace ("" for all) selected by selector.
func (i *Informers) Dynamic(client dynamic.Interface, gvr schema.GroupVersionResource, namespace, selector string) informers.GenericInformer {
	inf := dynamicinformer.NewFilteredDynamicInformer(client, gvr, namespace, 0, cache.Indexers{}, func(o *metav1.ListOptions) {
		o.LabelSelector = selector
	})
	_ = inf.Informer().SetTransform(StripManagedFields) // cannot fail before the informer runs
	i.add(func(stop <-chan struct{}) { go inf.Informer().Run(stop) }, func(stop <-chan struct{}) []string {
		if !cache.WaitForCacheSync(stop, inf.Informer().HasSynced) {
			return []string{gvr.GroupResource().String()}
		}
		return nil
	}, nil)
	return inf
}

func (i *Informers) add(start func(<-chan struct{}), sync func(<-chan struct{}) []string, shutdown func()) {
	i.mu.Lock()
	defer i.mu.Unlock()
	i.starts = append(i.starts, start)
	i.syncs = append(i.syncs, sync)
	if shutdown != nil {
		i.shutdowns = append(i.shutdowns, shutdown)
	}
}

// Start starts every informer added so far and waits until all caches are
// synced, for at most timeout (SyncTimeout when 0) and no longer than ctx
// allows. When one does not sync it stops them all and returns an error
// naming the resources and the usual cause.
func (i *Informers) Start(ctx context.Context, timeout time.Duration) error {
	if timeout <= 0 {
		timeout = SyncTimeout
	}
	i.mu.Lock()
	starts, syncs := slices.Clone(i.starts), slices.Clone(i.syncs)
	i.mu.Unlock()
	for _, s := range starts {
		s(i.stop)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	// Waiting ends when the caches sync, the deadline passes or Stop is
	// called, whichever comes first.
	wait := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
		case <-i.stop:
		}
		close(wait)
	}()
	var bad []string
	for _, s := range syncs {
		bad = append(bad, s(wait)...)
	}
	if len(bad) == 0 {
		return nil
	}
	i.Stop()
	slices.Sort(bad)
	return fmt.Errorf("informer caches of %s did not sync within %s: is the API server reachable with this kubeconfig, and may the plugin's identity list and watch them? (grant the ClusterRole of the plugin's rbac.yaml)",
		strings.Join(slices.Compact(bad), ", "), timeout)
}

// Stop stops every informer; it is safe to call more than once, and on a
// nil set.
func (i *Informers) Stop() {
	if i == nil {
		return
	}
	i.stopOnce.Do(func() {
		close(i.stop)
		i.mu.Lock()
		shutdowns := slices.Clone(i.shutdowns)
		i.mu.Unlock()
		for _, s := range shutdowns {
			s()
		}
	})
}

// Done is closed by Stop.
func (i *Informers) Done() <-chan struct{} { return i.stop }

// StripManagedFields is an informer transform that drops managedFields.
func StripManagedFields(obj any) (any, error) {
	if m, err := meta.Accessor(obj); err == nil {
		m.SetManagedFields(nil)
	}
	return obj, nil
}

func unsyncedGVRs(m map[schema.GroupVersionResource]bool) []string {
	var bad []string
	for gvr, ok := range m {
		if !ok {
			bad = append(bad, gvr.GroupResource().String())
		}
	}
	return bad
}

// resourceOf turns a Go type name (*v1.ConfigMap) into something an
// operator recognises (ConfigMap).
func resourceOf(typeName string) string {
	if i := strings.LastIndex(typeName, "."); i >= 0 {
		return typeName[i+1:] + "s"
	}
	return typeName
}

// Changer is told which object may have a new status (a sdk.StatusFeed).
type Changer interface{ Changed(id string) }

// OnChange is an informer event handler that tells c the id (the value of
// idLabel) of every object added, deleted, or updated with a new resource
// version; an informer's periodic re-delivery of unchanged objects is
// ignored.
func OnChange(c Changer, idLabel string) cache.ResourceEventHandlerFuncs {
	tell := func(obj any) {
		if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = tomb.Obj
		}
		if m, err := meta.Accessor(obj); err == nil {
			c.Changed(m.GetLabels()[idLabel])
		}
	}
	return cache.ResourceEventHandlerFuncs{
		AddFunc: tell,
		UpdateFunc: func(old, obj any) {
			o, err1 := meta.Accessor(old)
			n, err2 := meta.Accessor(obj)
			if err1 == nil && err2 == nil && o.GetResourceVersion() == n.GetResourceVersion() {
				return
			}
			tell(obj)
		},
		DeleteFunc: tell,
	}
}
