package kube

import (
	"context"
	"encoding/json"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
)

// ToUnstructured converts a typed object to the map form that is both sent
// with server-side apply and compared against live objects: status and the
// nulls that typed structs always carry (creationTimestamp: null) are
// removed, so the apply claims no fields the object does not set. Empty maps
// stay: some mean something (emptyDir: {}, a select-all selector {}).
func ToUnstructured(obj runtime.Object) (*unstructured.Unstructured, error) {
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return nil, err
	}
	delete(m, "status")
	prune(m)
	return &unstructured.Unstructured{Object: m}, nil
}

// prune drops nil values, which typed structs emit for unset fields
// (creationTimestamp: null); they carry no intent.
func prune(v any) {
	switch t := v.(type) {
	case map[string]any:
		for k, x := range t {
			prune(x)
			if x == nil {
				delete(t, k)
			}
		}
	case []any:
		for _, x := range t {
			prune(x)
		}
	}
}

// Apply server-side applies obj with field manager "krane" and force, so a
// field someone edited by hand is taken back. obj must carry apiVersion,
// kind, name and (for namespaced resources) namespace.
func Apply(ctx context.Context, client dynamic.Interface, gvr schema.GroupVersionResource, obj *unstructured.Unstructured) (*unstructured.Unstructured, error) {
	data, err := json.Marshal(obj.Object)
	if err != nil {
		return nil, err
	}
	force := true
	opts := metav1.PatchOptions{FieldManager: FieldManager, Force: &force}
	var res dynamic.ResourceInterface = client.Resource(gvr)
	if ns := obj.GetNamespace(); ns != "" {
		res = client.Resource(gvr).Namespace(ns)
	}
	out, err := res.Patch(ctx, obj.GetName(), types.ApplyPatchType, data, opts)
	if err != nil {
		return nil, fmt.Errorf("apply %s %s: %w", obj.GetKind(), objectName(obj), err)
	}
	return out, nil
}

// TypedPatch is the Patch method of a typed client, such as
// clientset.AppsV1().ReplicaSets(ns).Patch.
type TypedPatch[T any] func(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, subresources ...string) (T, error)

// ApplyTyped server-side applies obj (as Apply does: field manager "krane",
// force) through a typed client's Patch and returns the typed result. With
// a NewClientset client the API server answers in protobuf, which costs a
// fraction of decoding the JSON a dynamic client gets back (with its
// managedFields) into maps: per object, the largest cost of an apply on
// the client's side.
func ApplyTyped[T any](ctx context.Context, patch TypedPatch[T], obj *unstructured.Unstructured) (T, error) {
	var zero T
	data, err := json.Marshal(obj.Object)
	if err != nil {
		return zero, err
	}
	force := true
	out, err := patch(ctx, obj.GetName(), types.ApplyPatchType, data, metav1.PatchOptions{FieldManager: FieldManager, Force: &force})
	if err != nil {
		return zero, fmt.Errorf("apply %s %s: %w", obj.GetKind(), objectName(obj), err)
	}
	return out, nil
}

func objectName(obj *unstructured.Unstructured) string {
	if ns := obj.GetNamespace(); ns != "" {
		return ns + "/" + obj.GetName()
	}
	return obj.GetName()
}
