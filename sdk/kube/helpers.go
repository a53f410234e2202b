package kube

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/distribution/reference"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/dynamic"

	"krane.dev/sdk"
)

// Inventory turns a plugin's cached objects (a lister's List, an
// indexer's) into its inventory of kind: one item per id, the value of
// idLabel. Objects without the label, and objects already being deleted,
// are left out; when several objects carry one id (an object renamed, a
// template replaced), the one applied last stands for it.
func Inventory[T metav1.Object](kind, idLabel string, objs []T) *sdk.InventoryResponse {
	byID := map[string]sdk.InventoryItem{}
	for _, o := range objs {
		id := o.GetLabels()[idLabel]
		if id == "" || o.GetDeletionTimestamp() != nil {
			continue
		}
		v := AppliedVersion(o.GetAnnotations())
		if prev, ok := byID[id]; ok && prev.Version > v {
			continue
		}
		byID[id] = sdk.InventoryItem{Kind: kind, ID: id, Version: v, SpecHash: o.GetAnnotations()[SpecHashAnnotation]}
	}
	items := slices.SortedFunc(maps.Values(byID), func(a, b sdk.InventoryItem) int { return cmp.Compare(a.ID, b.ID) })
	return &sdk.InventoryResponse{Items: items}
}

// DeleteFunc is a typed client's Delete, e.g.
// client.CoreV1().ConfigMaps(ns).Delete.
type DeleteFunc func(ctx context.Context, name string, opts metav1.DeleteOptions) error

// DynamicDelete adapts a dynamic client's Delete to a DeleteFunc.
func DynamicDelete(res dynamic.ResourceInterface) DeleteFunc {
	return func(ctx context.Context, name string, opts metav1.DeleteOptions) error {
		return res.Delete(ctx, name, opts)
	}
}

// Delete deletes obj only if it is still the object that was seen (a UID
// precondition): an object already gone, or replaced meanwhile by one of
// the same name, is left alone and is not an error. what names the object
// in errors ("ConfigMap"). opts may set a propagation policy.
func Delete(ctx context.Context, del DeleteFunc, what string, obj metav1.Object, opts ...metav1.DeleteOptions) error {
	var o metav1.DeleteOptions
	if len(opts) > 0 {
		o = opts[0]
	}
	uid := obj.GetUID()
	o.Preconditions = &metav1.Preconditions{UID: &uid}
	err := del(ctx, obj.GetName(), o)
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("delete %s %s: %w", what, namespacedName(obj), err)
	}
	return nil
}

func namespacedName(o metav1.Object) string {
	if ns := o.GetNamespace(); ns != "" {
		return ns + "/" + o.GetName()
	}
	return o.GetName()
}

// The validators below answer a spec field that cannot work with a
// permanent error naming the field (sdk.InvalidField), so it is refused
// before any API call and parked instead of retried.

// ValidateImage checks a container image reference with the grammar of the
// distribution project (what containerd and docker parse), so a typo fails
// here, named, instead of as ImagePullBackOff on every node.
func ValidateImage(field, image string) error {
	switch {
	case image == "":
		return sdk.InvalidField(field, "an image is required, e.g. registry.example.com/team/app:1.2.3")
	case strings.TrimSpace(image) != image:
		return sdk.InvalidField(field, "%q has leading or trailing spaces", image)
	}
	named, err := reference.ParseNormalizedNamed(image)
	if err != nil {
		return sdk.InvalidField(field, "%q is not an image reference ([registry/]repository[:tag][@digest]): %v", image, err)
	}
	// Registries refuse longer names; the parser does not check it.
	if n := len(reference.FamiliarName(named)); n > maxImageNameLen {
		return sdk.InvalidField(field, "the repository name is %d characters, at most %d", n, maxImageNameLen)
	}
	return nil
}

// maxImageNameLen is the registries' limit on a repository name
// (distribution's NameTotalLengthMax).
const maxImageNameLen = 255

// ValidateName checks an object name (a DNS-1123 subdomain: what most
// kinds take).
func ValidateName(field, name string) error {
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return sdk.InvalidField(field, "%q is not a valid object name: %s", name, errs[0])
	}
	return nil
}

// ValidateNamespace checks a namespace name (a DNS-1123 label).
func ValidateNamespace(field, ns string) error {
	if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
		return sdk.InvalidField(field, "%q is not a valid namespace name: %s", ns, errs[0])
	}
	return nil
}

// ValidateID checks that a resource id can be the value of IDLabel, which
// garbage collection and the inventory rely on.
func ValidateID(id string) error {
	if id == "" {
		return sdk.InvalidField("id", "the resource id is empty")
	}
	if errs := validation.IsValidLabelValue(id); len(errs) > 0 {
		return sdk.InvalidField("id", "%q is not usable as the %s label value: %s", id, IDLabel, errs[0])
	}
	return nil
}
