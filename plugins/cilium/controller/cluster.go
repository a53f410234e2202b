package controller

import (
	"context"
	"errors"
	"fmt"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/cache"

	"krane.dev/sdk/kube"
)

// errCRDMissing is retryable: installing Cilium fixes it without any
// change to the policy.
var errCRDMissing = fmt.Errorf("the CiliumNetworkPolicy CRD (%s) is not installed in this cluster: install Cilium or its CRDs; Krane retries until it is served", GVR.GroupResource())

const byIDIndex = "krane-id"

// cluster is the plugin's view of one API server: a dynamic client and an
// informer over the policies Krane manages. The informer starts on first
// use once the CRD is served, so a cluster without Cilium neither blocks
// Configure nor floods the log with failing list calls.
type cluster struct {
	dyn dynamic.Interface
	// served asks discovery whether the CRD is served.
	served  func(context.Context) (bool, error)
	changes kube.Changer
	// repair is told of the plugin's own writes and deletes, and watches
	// the policies for everyone else's.
	repair *kube.Repairer

	mu       sync.Mutex
	informer cache.SharedIndexInformer // nil until the CRD is served
	stop     chan struct{}
}

func newCluster(k *kube.Clients, changes kube.Changer, repair *kube.Repairer) *cluster {
	served := func(ctx context.Context) (bool, error) { return kube.Served(ctx, k, GVR) }
	return &cluster{dyn: k.Dynamic, served: served, changes: changes, repair: repair, stop: make(chan struct{})}
}

// policies returns the synced informer, starting it when the CRD is served.
func (c *cluster) policies(ctx context.Context) (cache.SharedIndexInformer, error) {
	inf, err := c.start(ctx)
	if err != nil {
		return nil, err
	}
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return nil, fmt.Errorf("the informer over %s did not sync: is the API server reachable, and may this plugin list and watch them? %w", GVR.GroupResource(), ctx.Err())
	}
	return inf, nil
}

func (c *cluster) start(ctx context.Context) (cache.SharedIndexInformer, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.informer != nil {
		return c.informer, nil
	}
	served, err := c.served(ctx)
	if err != nil {
		return nil, err
	}
	if !served {
		return nil, errCRDMissing
	}
	// Only Krane's own policies of this component: the cache stays small
	// and other controllers' policies are never seen, let alone touched.
	inf := kube.NewDynamicInformer(c.dyn, GVR, kube.InformerOptions{LabelSelector: kube.ManagedSelector(Component) + "," + IDLabel})
	if err := inf.AddIndexers(cache.Indexers{byIDIndex: func(obj any) ([]string, error) {
		if u, ok := obj.(*unstructured.Unstructured); ok {
			return []string{u.GetLabels()[IDLabel]}, nil
		}
		return nil, nil
	}}); err != nil {
		return nil, err
	}
	if _, err := inf.AddEventHandler(kube.OnChange(c.changes, IDLabel)); err != nil {
		return nil, err
	}
	if _, err := inf.AddEventHandler(c.repair.Handler(IDLabel)); err != nil {
		return nil, err
	}
	go inf.Run(c.stop)
	c.informer = inf
	return inf, nil
}

// byID returns the cached policies carrying id (normally one; more when a
// policy was renamed or moved and the old object is still there).
func (c *cluster) byID(id string) []*unstructured.Unstructured {
	inf := c.current()
	if inf == nil {
		return nil
	}
	objs, _ := inf.GetIndexer().ByIndex(byIDIndex, id)
	out := make([]*unstructured.Unstructured, 0, len(objs))
	for _, o := range objs {
		if u, ok := o.(*unstructured.Unstructured); ok {
			out = append(out, u)
		}
	}
	return out
}

// all returns every cached policy.
func (c *cluster) all() []*unstructured.Unstructured {
	inf := c.current()
	if inf == nil {
		return nil
	}
	var out []*unstructured.Unstructured
	for _, o := range inf.GetStore().List() {
		if u, ok := o.(*unstructured.Unstructured); ok {
			out = append(out, u)
		}
	}
	return out
}

func (c *cluster) ids() []string {
	var ids []string
	for _, u := range c.all() {
		ids = append(ids, u.GetLabels()[IDLabel])
	}
	return ids
}

func (c *cluster) current() cache.SharedIndexInformer {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.informer
}

// listLive lists the policies carrying id from the API server, not the
// cache: a delete must see an object applied a moment ago.
func (c *cluster) listLive(ctx context.Context, id string) ([]unstructured.Unstructured, error) {
	list, err := c.dyn.Resource(GVR).Namespace(metav1.NamespaceAll).List(ctx, metav1.ListOptions{
		LabelSelector: kube.ManagedSelector(Component) + "," + IDLabel + "=" + id,
	})
	if err != nil {
		return nil, err
	}
	return list.Items, nil
}

// deleteObject deletes one policy if it is still the object that was seen.
func (c *cluster) deleteObject(ctx context.Context, u *unstructured.Unstructured) error {
	uid := u.GetUID()
	c.repair.Deleting(uid)
	err := c.dyn.Resource(GVR).Namespace(u.GetNamespace()).Delete(ctx, u.GetName(), metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
	// Gone already, or replaced by a newer object: nothing to do.
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("delete CiliumNetworkPolicy %s/%s: %w", u.GetNamespace(), u.GetName(), err)
	}
	return nil
}

func (c *cluster) close() {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	select {
	case <-c.stop:
	default:
		close(c.stop)
	}
}

var errNotConfigured = errors.New("the cilium plugin is not configured yet: the host calls Configure first")
