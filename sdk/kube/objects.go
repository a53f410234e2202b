package kube

import (
	"context"
	"errors"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/cache"

	"krane.dev/sdk"
)

// Cached is an object as an informer caches it: typed (a *corev1.ConfigMap)
// or unstructured.
type Cached interface {
	metav1.Object
	runtime.Object
}

const byIDIndex = "krane-id"

// Store is a plugin's cache of one type of object it manages, looked up by
// resource id (the value of an id label): what Apply compares against,
// Inventory lists and a status is observed from, without an API call.
type Store[T Cached] struct {
	indexer cache.Indexer
	idLabel string
}

// NewStore indexes inf's objects by idLabel; call it before the informer
// starts.
func NewStore[T Cached](inf cache.SharedIndexInformer, idLabel string) (*Store[T], error) {
	err := inf.AddIndexers(cache.Indexers{byIDIndex: func(obj any) ([]string, error) {
		if m, ok := obj.(metav1.Object); ok {
			if id := m.GetLabels()[idLabel]; id != "" {
				return []string{id}, nil
			}
		}
		return nil, nil
	}})
	if err != nil {
		return nil, fmt.Errorf("index the informer by %s: %w", idLabel, err)
	}
	return &Store[T]{indexer: inf.GetIndexer(), idLabel: idLabel}, nil
}

// Track is NewStore plus OnChange: the store of inf's objects, and c told
// the id of every object that changes (c is usually the plugin's
// sdk.StatusFeed).
func Track[T Cached](inf cache.SharedIndexInformer, idLabel string, c Changer) (*Store[T], error) {
	s, err := NewStore[T](inf, idLabel)
	if err != nil {
		return nil, err
	}
	if _, err := inf.AddEventHandler(OnChange(c, idLabel)); err != nil {
		return nil, fmt.Errorf("watch the informer's changes: %w", err)
	}
	return s, nil
}

// Get returns the cached objects of resource id: normally one, more while
// a renamed or moved object's old copy is still there. A nil store (before
// Configure) holds nothing.
func (s *Store[T]) Get(id string) []T {
	if s == nil {
		return nil
	}
	objs, _ := s.indexer.ByIndex(byIDIndex, id)
	return typed[T](objs)
}

// List returns every cached object.
func (s *Store[T]) List() []T {
	if s == nil {
		return nil
	}
	return typed[T](s.indexer.List())
}

// IDs lists the resource ids of the cached objects (a StatusFeed's IDs).
func (s *Store[T]) IDs() []string {
	if s == nil {
		return nil
	}
	return s.indexer.ListIndexFuncValues(byIDIndex)
}

// Inventory is the plugin's inventory of kind (see the package function).
func (s *Store[T]) Inventory(kind string) *sdk.InventoryResponse {
	if s == nil {
		return &sdk.InventoryResponse{}
	}
	return Inventory(kind, s.idLabel, s.List())
}

func typed[T Cached](objs []any) []T {
	out := make([]T, 0, len(objs))
	for _, o := range objs {
		if t, ok := o.(T); ok {
			out = append(out, t)
		}
	}
	return out
}

// ApplyOne makes desired (a typed object with apiVersion and kind set) the
// one object of its resource in the cluster: when the cached copy among
// current already matches (Drift finds nothing) it answers Unchanged
// without an API call; otherwise it server-side applies desired. Then it
// deletes the other objects of current (a resource renamed or moved leaves
// its old object behind), each only if still the object seen. API errors
// are classified (Classify).
func ApplyOne[T Cached](ctx context.Context, client dynamic.Interface, gvr schema.GroupVersionResource, desired runtime.Object, current []T) (sdk.Result, error) {
	want, err := ToUnstructured(desired)
	if err != nil {
		return 0, err
	}
	result := sdk.Applied
	var stale []T
	for _, o := range current {
		if o.GetNamespace() != want.GetNamespace() || o.GetName() != want.GetName() {
			stale = append(stale, o)
			continue
		}
		if drift, err := DriftObject(want.Object, o); err == nil && drift == "" {
			result = sdk.Unchanged
		}
	}
	if result == sdk.Applied {
		if _, err := Apply(ctx, client, gvr, want); err != nil {
			return 0, Classify(err)
		}
	}
	if len(stale) > 0 {
		return sdk.Applied, DeleteAll(ctx, client, gvr, stale)
	}
	return result, nil
}

// DeleteAll deletes objs (each only if still the object seen: see Delete).
func DeleteAll[T Cached](ctx context.Context, client dynamic.Interface, gvr schema.GroupVersionResource, objs []T) error {
	var errs []error
	for _, o := range objs {
		res := client.Resource(gvr).Namespace(o.GetNamespace())
		errs = append(errs, Delete(ctx, DynamicDelete(res), gvr.Resource, o))
	}
	return Classify(errors.Join(errs...))
}

// Classify marks the API errors retrying cannot fix as permanent (the
// host parks them and reports them upstream), with a hint for the
// operator: an object the API server rejects (invalid, too large) and a
// write RBAC or an admission policy forbids. A missing namespace stays
// retryable: another controller may be about to create it.
func Classify(err error) error {
	switch {
	case err == nil || sdk.IsPermanent(err):
		return err
	case apierrors.IsNotFound(err):
		if s, ok := err.(apierrors.APIStatus); ok || errors.As(err, &s) {
			if d := s.Status().Details; d != nil && d.Kind == "namespaces" {
				return fmt.Errorf("the namespace does not exist yet; retrying (create it, or let the controller that owns it do so): %w", err)
			}
		}
		return err
	case apierrors.IsInvalid(err), apierrors.IsBadRequest(err), apierrors.IsRequestEntityTooLargeError(err):
		return sdk.Permanent(fmt.Errorf("the API server rejected the object: %w", err))
	case apierrors.IsForbidden(err):
		return sdk.Permanent(fmt.Errorf("forbidden (check the plugin's RBAC and the cluster's admission policies): %w", err))
	}
	return err
}
