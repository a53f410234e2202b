package kube

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestDrift(t *testing.T) {
	desired := map[string]any{
		"metadata": map[string]any{"labels": map[string]any{"a": "1"}},
		"spec": map[string]any{
			"replicas": int64(3),
			"env":      []any{map[string]any{"name": "X", "value": "1"}},
		},
	}
	cases := []struct {
		name string
		live map[string]any
		want string
	}{
		{"identical", clone(desired), ""},
		{"defaults and foreign labels are not drift", map[string]any{
			"metadata": map[string]any{"labels": map[string]any{"a": "1", "b": "2"}, "uid": "u"},
			"spec": map[string]any{
				"replicas": float64(3),
				"env":      []any{map[string]any{"name": "X", "value": "1", "valueFrom": nil}},
				"paused":   false,
			},
		}, ""},
		{"edited scalar", map[string]any{
			"metadata": map[string]any{"labels": map[string]any{"a": "1"}},
			"spec":     map[string]any{"replicas": int64(5), "env": []any{map[string]any{"name": "X", "value": "1"}}},
		}, ".spec.replicas"},
		{"added list entry", map[string]any{
			"metadata": map[string]any{"labels": map[string]any{"a": "1"}},
			"spec": map[string]any{"replicas": int64(3), "env": []any{
				map[string]any{"name": "X", "value": "1"}, map[string]any{"name": "Y", "value": "2"},
			}},
		}, ".spec.env"},
		{"removed label", map[string]any{
			"metadata": map[string]any{"labels": map[string]any{}},
			"spec":     map[string]any{"replicas": int64(3), "env": []any{map[string]any{"name": "X", "value": "1"}}},
		}, ".metadata.labels.a"},
		{"missing object part", map[string]any{}, ".metadata"},
	}
	for _, c := range cases {
		if got := Drift(desired, c.live); got != c.want {
			t.Errorf("%s: Drift = %q, want %q", c.name, got, c.want)
		}
	}
}

func TestToUnstructuredDropsStatusAndNulls(t *testing.T) {
	cm := &corev1.ConfigMap{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: metav1.ObjectMeta{Name: "x", Namespace: "ns"},
		Data:       map[string]string{"k": "v"},
	}
	u, err := ToUnstructured(cm)
	if err != nil {
		t.Fatal(err)
	}
	meta := u.Object["metadata"].(map[string]any)
	if _, ok := meta["creationTimestamp"]; ok {
		t.Errorf("creationTimestamp kept: %v", meta)
	}
	if u.GetName() != "x" || u.Object["data"].(map[string]any)["k"] != "v" {
		t.Errorf("content lost: %v", u.Object)
	}
}

func clone(m map[string]any) map[string]any {
	out := map[string]any{}
	for k, v := range m {
		if mm, ok := v.(map[string]any); ok {
			out[k] = clone(mm)
		} else {
			out[k] = v
		}
	}
	return out
}

func TestToUnstructuredKeepsMeaningfulEmptyMaps(t *testing.T) {
	pod := &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: "p"},
		Spec:       corev1.PodSpec{Volumes: []corev1.Volume{{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}},
	}
	u, err := ToUnstructured(pod)
	if err != nil {
		t.Fatal(err)
	}
	vols := u.Object["spec"].(map[string]any)["volumes"].([]any)
	if _, ok := vols[0].(map[string]any)["emptyDir"]; !ok {
		t.Errorf("emptyDir: {} was dropped, the volume lost its type: %v", vols[0])
	}
}

// TestDriftNamesTheSameFieldEveryTime: when several fields drifted, Drift
// names the first in key order, not whichever a map walk met first, so a
// log line or a status does not flap between calls.
func TestDriftNamesTheSameFieldEveryTime(t *testing.T) {
	desired := map[string]any{"metadata": map[string]any{"labels": map[string]any{"a": "1", "b": "2", "c": "3"}},
		"spec": map[string]any{"x": int64(1), "y": int64(2)}}
	live := map[string]any{"metadata": map[string]any{"labels": map[string]any{}}, "spec": map[string]any{}}
	for i := range 200 {
		if got := Drift(desired, live); got != ".metadata.labels.a" {
			t.Fatalf("call %d: Drift = %q, want .metadata.labels.a (the first drifted field in key order)", i, got)
		}
	}
}
