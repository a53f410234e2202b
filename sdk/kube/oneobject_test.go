package kube

import (
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"krane.dev/sdk"
)

type cmSpec struct {
	Name string            `json:"name"`
	Data map[string]string `json:"data"`
}

func cmDef() OneObject[*corev1.ConfigMap, cmSpec, struct{}] {
	return OneObject[*corev1.ConfigMap, cmSpec, struct{}]{
		Info:      sdk.Info{Name: "cm", Kinds: []sdk.KindInfo{{Kind: "cm.test"}}},
		Component: "cm-test",
		Resource:  corev1.SchemeGroupVersion.WithResource("configmaps"),
		Informer:  InformerOf[corev1.ConfigMap, corev1.ConfigMapList]("configmaps"),
		Build: func(s cmSpec, _ struct{}) *corev1.ConfigMap {
			// An author's own label stays; one that claims Krane's labels
			// is overwritten, or GC and the cache would lose the object.
			return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: s.Name, Namespace: "ns",
				Labels: map[string]string{"team": "a", ManagedByLabel: "someone-else", IDLabel: "other"}}, Data: s.Data}
		},
	}
}

// The object a OneObject plugin applies carries Krane's labels and
// annotations and its apiVersion and kind, whatever Build left out: the
// inventory, the cache and server-side apply depend on them.
func TestOneObjectBuildAddsKranesLabelsAndType(t *testing.T) {
	c := NewOneObjectController(hclog.NewNullLogger(), cmDef())
	spec := cmSpec{Name: "settings", Data: map[string]string{"k": "v"}}
	obj, err := c.build(&sdk.ApplyRequest{Change: sdk.Change{ID: "r1", Version: 42}}, spec, struct{}{})
	if err != nil {
		t.Fatal(err)
	}
	if got := obj.GetObjectKind().GroupVersionKind().String(); got != "/v1, Kind=ConfigMap" {
		t.Errorf("type = %q, want /v1, Kind=ConfigMap", got)
	}
	want := map[string]string{"team": "a", ManagedByLabel: ManagedBy, ComponentLabel: "cm-test", IDLabel: "r1"}
	for k, v := range want {
		if obj.Labels[k] != v {
			t.Errorf("label %s = %q, want %q (labels %v)", k, obj.Labels[k], v, obj.Labels)
		}
	}
	if AppliedVersion(obj.Annotations) != 42 || obj.Annotations[SpecHashAnnotation] != SpecHash(spec) {
		t.Errorf("annotations %v: want version 42 and the spec's hash", obj.Annotations)
	}
	if _, err := ToUnstructured(obj); err != nil {
		t.Errorf("the built object does not convert for apply: %v", err)
	}
}

// A definition missing what every plugin needs fails at start, saying
// what is missing, rather than at the first Apply.
func TestOneObjectRefusesAnIncompleteDefinition(t *testing.T) {
	for name, breakIt := range map[string]func(*OneObject[*corev1.ConfigMap, cmSpec, struct{}]){
		"no kind":   func(d *OneObject[*corev1.ConfigMap, cmSpec, struct{}]) { d.Info.Kinds = nil },
		"no build":  func(d *OneObject[*corev1.ConfigMap, cmSpec, struct{}]) { d.Build = nil },
		"no source": func(d *OneObject[*corev1.ConfigMap, cmSpec, struct{}]) { d.Resource.Resource = "" },
	} {
		t.Run(name, func(t *testing.T) {
			d := cmDef()
			breakIt(&d)
			defer func() {
				r := recover()
				if r == nil || !strings.Contains(r.(string), "kube.OneObject") {
					t.Errorf("NewOneObjectController = no panic naming kube.OneObject (%v)", r)
				}
			}()
			NewOneObjectController(hclog.NewNullLogger(), d)
		})
	}
}
