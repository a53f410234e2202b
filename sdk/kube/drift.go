package kube

import (
	"fmt"
	"math/big"
	"reflect"

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
func Drift(desired, live map[string]any) string {
	for k, want := range desired {
		// Objects from informers carry no apiVersion/kind (TypeMeta).
		if k == "apiVersion" || k == "kind" {
			continue
		}
		if d := drift("."+k, want, live[k]); d != "" {
			return d
		}
	}
	return ""
}

// DriftObject is Drift on a typed live object (e.g. from a typed lister).
func DriftObject(desired map[string]any, live runtime.Object) (string, error) {
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(live)
	if err != nil {
		return "", err
	}
	return Drift(desired, m), nil
}

func drift(path string, want, got any) string {
	switch w := want.(type) {
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok {
			return at(path)
		}
		for k, wv := range w {
			if d := drift(path+"."+k, wv, g[k]); d != "" {
				return d
			}
		}
		return ""
	case []any:
		g, ok := got.([]any)
		if !ok || len(g) != len(w) {
			return at(path)
		}
		for i := range w {
			if d := drift(fmt.Sprintf("%s[%d]", path, i), w[i], g[i]); d != "" {
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
