package kube

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
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

// NewInformers returns an empty set; add informers with Informer (typed,
// typed.go) or Add (NewDynamicInformer, NewMetadataInformer), then Start.
func NewInformers() *Informers { return &Informers{stop: make(chan struct{})} }

// Add adds an informer of resource (named so in errors) to the set, to
// start with it, and returns it.
func (i *Informers) Add(inf cache.SharedIndexInformer, resource string) cache.SharedIndexInformer {
	i.add(func(stop <-chan struct{}) { go inf.Run(stop) }, func(stop <-chan struct{}) []string {
		if !cache.WaitForCacheSync(stop, inf.HasSynced) {
			return []string{resource}
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
