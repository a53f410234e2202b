package kube

import (
	"fmt"
	"maps"
	"math/big"
	"reflect"
	"slices"

	"k8s.io/apimachinery/pkg/runtime"
)

// Drift reports where a live object departs from the desired one, or "" when
// it does not. The comparison is on the desired object's shape: every field
// the desired object sets must hold the same value live, and every list it
// sets must have the same length (so an env var added by hand is drift).
// Fields the desired object leaves unset (defaults filled by the API
// server, labels added by others) are ignored, exactly the fields
// server-side apply would not change either. Numbers compare by value.
//
// A plugin answers UNCHANGED without any API call when Drift(desired,
// liveFromInformer) == "", which keeps a resync of thousands of unchanged
// objects free of writes.
//
// When several fields drifted, the one named is the first in key order, so
// the answer is the same on every call. Only a drifted object pays for the
// ordering: the walk that finds no drift visits maps in any order.
func Drift(desired, live map[string]any) string {
	if driftMap("", desired, live, false, true) == "" {
		return ""
	}
	return driftMap("", desired, live, true, true)
}

// DriftObject is Drift on a typed live object (e.g. from a typed lister).
func DriftObject(desired map[string]any, live runtime.Object) (string, error) {
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(live)
	if err != nil {
		return "", err
	}
	return Drift(desired, m), nil
}

// driftMap compares the keys want sets; sorted walks them in key order.
// top skips TypeMeta: objects from informers carry no apiVersion/kind.
func driftMap(path string, want, got map[string]any, sorted, top bool) string {
	one := func(k string) string {
		if top && (k == "apiVersion" || k == "kind") {
			return ""
		}
		return drift(path+"."+k, want[k], got[k], sorted)
	}
	if sorted {
		for _, k := range slices.Sorted(maps.Keys(want)) {
			if d := one(k); d != "" {
				return d
			}
		}
		return ""
	}
	for k := range want {
		if d := one(k); d != "" {
			return d
		}
	}
	return ""
}

func drift(path string, want, got any, sorted bool) string {
	switch w := want.(type) {
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok {
			return at(path)
		}
		return driftMap(path, w, g, sorted, false)
	case []any:
		g, ok := got.([]any)
		if !ok || len(g) != len(w) {
			return at(path)
		}
		for i := range w {
			if d := drift(fmt.Sprintf("%s[%d]", path, i), w[i], g[i], sorted); d != "" {
				return d
			}
		}
		return ""
	case nil:
		return ""
	}
	if wn, ok := number(want); ok {
		if gn, ok := number(got); ok && wn.Cmp(gn) == 0 {
			return ""
		}
		return at(path)
	}
	if !reflect.DeepEqual(want, got) {
		return at(path)
	}
	return ""
}

func at(path string) string {
	if path == "" {
		return "."
	}
	return path
}

func number(v any) (*big.Float, bool) {
	switch n := v.(type) {
	case int64:
		return new(big.Float).SetInt64(n), true
	case int:
		return new(big.Float).SetInt64(int64(n)), true
	case int32:
		return new(big.Float).SetInt64(int64(n)), true
	case float64:
		return big.NewFloat(n), true
	}
	return nil, false
}
