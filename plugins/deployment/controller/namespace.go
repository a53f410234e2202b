package controller

import (
	"context"
	"fmt"
	"sync"

	"golang.org/x/sync/singleflight"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/cache"

	"krane.dev/sdk"
	"krane.dev/sdk/kube"
)

// Namespaces. Krane creates a workload namespace on demand (Create, not
// apply: a namespace that already exists was made by someone else and is
// left exactly as it is, unlabelled). Only a namespace carrying Krane's
// managed-by label, so one Krane created, is ever deleted, and only when
// none of the objects below is left in it: ours that are not being deleted
// (other deployments, other plugins' policies) and anything foreign.
//
// The list is fixed so the ClusterRole can name it; each entry needs `list`
// in rbac.yaml. Objects are read as metadata only.
var namespaceGuard = []schema.GroupVersionResource{
	{Version: "v1", Resource: "pods"},
	{Version: "v1", Resource: "services"},
	{Version: "v1", Resource: "configmaps"},
	{Version: "v1", Resource: "secrets"},
	{Version: "v1", Resource: "serviceaccounts"},
	{Version: "v1", Resource: "persistentvolumeclaims"},
	{Group: "apps", Version: "v1", Resource: "deployments"},
	{Group: "apps", Version: "v1", Resource: "statefulsets"},
	{Group: "apps", Version: "v1", Resource: "daemonsets"},
	{Group: "apps", Version: "v1", Resource: "replicasets"},
	{Group: "batch", Version: "v1", Resource: "jobs"},
	{Group: "batch", Version: "v1", Resource: "cronjobs"},
	{Group: "networking.k8s.io", Version: "v1", Resource: "networkpolicies"},
	{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "rolebindings"},
	{Group: "cilium.io", Version: "v2", Resource: "ciliumnetworkpolicies"},
}

// createdByAnnotation records which plugin created a namespace.
const createdByAnnotation = "krane.dev/created-by"

func buildNamespace(name string) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
		Name:        name,
		Labels:      map[string]string{kube.ManagedByLabel: kube.ManagedBy},
		Annotations: map[string]string{createdByAnnotation: "krane-plugin-deployment"},
	}}
}

// knownNamespaces remembers the namespaces this process saw exist (it
// created them, or its create found them), so that writing many workloads
// into a new namespace costs one POST: concurrent writes wait for the one
// create in flight (singleflight), later ones find the namespace
// remembered, before the namespace informer sees it or when it never will
// (a namespace Krane did not create carries no label of ours). A namespace
// is forgotten when this plugin removes it, when the informer sees it
// deleted, and when a write into it finds it missing or terminating, so
// the next write creates it again.
type knownNamespaces struct {
	creates singleflight.Group
	mu      sync.Mutex
	known   map[string]bool
}

func (n *knownNamespaces) has(ns string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.known[ns]
}

func (n *knownNamespaces) remember(ns string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.known == nil {
		n.known = map[string]bool{}
	}
	n.known[ns] = true
}

func (n *knownNamespaces) forget(ns string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.known, ns)
}

// forgetDeleted is the namespace informer's handler: a namespace deleted
// is forgotten.
func (n *knownNamespaces) forgetDeleted() cache.ResourceEventHandlerFuncs {
	return cache.ResourceEventHandlerFuncs{DeleteFunc: func(obj any) {
		if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = tomb.Obj
		}
		if m, err := meta.Accessor(obj); err == nil {
			n.forget(m.GetName())
		}
	}}
}

// forgetIfGone forgets ns when err says it is missing or terminating.
func (n *knownNamespaces) forgetIfGone(ns string, err error) {
	if apierrors.IsNotFound(err) || apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause) {
		n.forget(ns)
	}
}

// ensureNamespace makes sure ns exists. Call with the namespace locked.
func (c *Controller) ensureNamespace(ctx context.Context, k *kubeState, ns string) error {
	if n, err := k.namespaces.Get(ns); err == nil {
		if n.DeletionTimestamp != nil {
			return fmt.Errorf("namespace %s is being deleted; the workload is created again once it is gone (retrying)", ns)
		}
		return nil
	}
	if c.namespaces.has(ns) {
		return nil
	}
	_, err, _ := c.namespaces.creates.Do(ns, func() (any, error) {
		_, err := k.namespaceClient().Create(ctx, buildNamespace(ns), metav1.CreateOptions{FieldManager: kube.FieldManager})
		if err == nil || apierrors.IsAlreadyExists(err) {
			c.namespaces.remember(ns)
			return nil, nil
		}
		return nil, err
	})
	switch {
	case err == nil:
		return nil
	case apierrors.IsForbidden(err):
		return sdk.Permanent(fmt.Errorf("create namespace %s: %w (grant the plugin's ClusterRole from rbac.yaml)", ns, err))
	}
	return fmt.Errorf("create namespace %s: %w", ns, err)
}

// removeNamespaceIfUnused deletes ns when Krane created it and nothing in
// namespaceGuard is left in it. Call with the namespace locked.
func (c *Controller) removeNamespaceIfUnused(ctx context.Context, k *kubeState, ns string) error {
	live, err := k.namespaceClient().Get(ctx, ns, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read namespace %s: %w", ns, err)
	}
	if live.Labels[kube.ManagedByLabel] != kube.ManagedBy || live.DeletionTimestamp != nil {
		return nil
	}
	keeper, err := namespaceKeeper(ctx, k, ns)
	if err != nil || keeper != "" {
		if keeper != "" {
			c.log.Info("namespace kept", "namespace", ns, "because_of", keeper)
		}
		return err
	}
	err = k.namespaceClient().Delete(ctx, ns, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &live.UID}})
	if err == nil || apierrors.IsNotFound(err) {
		c.namespaces.forget(ns)
	}
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("delete empty namespace %s: %w", ns, err)
	}
	c.log.Info("namespace removed: nothing left in it", "namespace", ns)
	return nil
}

// namespaceKeeper names the first object that keeps ns alive, or "".
func namespaceKeeper(ctx context.Context, k *kubeState, ns string) (string, error) {
	for _, gvr := range namespaceGuard {
		list, err := k.metadata.Resource(gvr).Namespace(ns).List(ctx, metav1.ListOptions{})
		if apierrors.IsNotFound(err) {
			continue // the kind is not served here (e.g. no cilium)
		}
		if err != nil {
			return "", fmt.Errorf("check whether namespace %s is empty: list %s: %w", ns, gvr.Resource, err)
		}
		for _, obj := range list.Items {
			if !keepsNamespace(gvr.Resource, obj.ObjectMeta) {
				continue
			}
			return gvr.Resource + "/" + obj.Name, nil
		}
	}
	return "", nil
}

// keepsNamespace: objects that go away on their own, that every namespace
// gets, or that are our pods, Secrets or Services (their ReplicaSet,
// listed too, decides) do not keep a namespace.
func keepsNamespace(resource string, m metav1.ObjectMeta) bool {
	switch {
	case m.DeletionTimestamp != nil:
		return false
	case resource == "configmaps" && m.Name == "kube-root-ca.crt":
		return false
	case resource == "serviceaccounts" && m.Name == "default":
		return false
	case (resource == "pods" || resource == "secrets" || resource == "services") && m.Labels[kube.ManagedByLabel] == kube.ManagedBy && m.Labels[kube.ComponentLabel] == Component:
		return false
	}
	return true
}

// keyedMutex guards namespaces in this process: writing workloads into a
// namespace (shared: any number at once) and removing that namespace
// (exclusive) must not interleave. Entries are dropped when unused, so it
// does not grow with history.
type keyedMutex struct {
	mu    sync.Mutex
	locks map[string]*refLock
}

type refLock struct {
	sync.RWMutex
	refs int
}

// lock takes key exclusively (removing a namespace).
func (k *keyedMutex) lock(key string) (unlock func()) {
	l := k.ref(key)
	l.Lock()
	return func() { l.Unlock(); k.unref(key, l) }
}

// rlock takes key shared (writing into a namespace): writes run in
// parallel with each other, never with a removal.
func (k *keyedMutex) rlock(key string) (unlock func()) {
	l := k.ref(key)
	l.RLock()
	return func() { l.RUnlock(); k.unref(key, l) }
}

func (k *keyedMutex) ref(key string) *refLock {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.locks == nil {
		k.locks = map[string]*refLock{}
	}
	l := k.locks[key]
	if l == nil {
		l = &refLock{}
		k.locks[key] = l
	}
	l.refs++
	return l
}

func (k *keyedMutex) unref(key string, l *refLock) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if l.refs--; l.refs == 0 {
		delete(k.locks, key)
	}
}
