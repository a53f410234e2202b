package controller

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/cache"

	"krane.dev/sdk/kube"
)

// TestCompactPolicyComparesLikeTheObject: the policy cache keeps a compact
// form, and drift against it must find exactly what it finds against the
// object the API server returned.
func TestCompactPolicyComparesLikeTheObject(t *testing.T) {
	desired, err := buildGossipPolicy(identityOf(validSentinel(), 3), defaultParams(t), ownerRefFromUID("sentinel-env1", "uid-1"))
	if err != nil {
		t.Fatal(err)
	}
	// As served: server-set metadata, managedFields, a status.
	served := func() *unstructured.Unstructured {
		u := desired.DeepCopy()
		u.SetUID("uid-p")
		u.SetResourceVersion("42")
		u.SetGeneration(2)
		u.SetManagedFields([]metav1.ManagedFieldsEntry{{Manager: "krane-sentinel", Operation: metav1.ManagedFieldsOperationApply}})
		u.Object["status"] = map[string]any{"conditions": []any{map[string]any{"type": "Valid", "status": "True"}}}
		return u
	}
	idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{bySentinel: sentinelIndex})
	obj, err := compactPolicy(served())
	if err != nil {
		t.Fatal(err)
	}
	if again, _ := compactPolicy(obj); again != obj {
		t.Fatal("compactPolicy changed an already compact policy")
	}
	if err := idx.Add(obj); err != nil {
		t.Fatal(err)
	}
	pc := &policyCache{indexer: idx}
	live := pc.live(desired.GetNamespace(), desired.GetName())
	if live == nil {
		t.Fatalf("no cached policy %s/%s", desired.GetNamespace(), desired.GetName())
	}
	lu := live.(*unstructured.Unstructured)
	if d := kube.Drift(desired.Object, lu.Object); d != "" {
		t.Errorf("an unchanged policy drifted at %s", d)
	}
	if _, ok := lu.Object["status"]; ok || lu.GetManagedFields() != nil {
		t.Errorf("the cache kept status or managedFields: %v", lu.Object)
	}
	id := desired.GetLabels()[LabelSentinel]
	if got := byIndex[*cachedPolicy](idx, id); len(got) != 1 || got[0].GetName() != desired.GetName() || got[0].GetResourceVersion() != "42" {
		t.Errorf("the sentinel index finds %v", got)
	}

	// A hand edit is drift, as on the full object.
	edited := served()
	if err := unstructured.SetNestedField(edited.Object, true, "spec", "enableDefaultDeny", "ingress"); err != nil {
		t.Fatal(err)
	}
	want := kube.Drift(desired.Object, edited.DeepCopy().Object)
	obj, err = compactPolicy(edited)
	if err != nil {
		t.Fatal(err)
	}
	if err := idx.Update(obj); err != nil {
		t.Fatal(err)
	}
	lu = pc.live(desired.GetNamespace(), desired.GetName()).(*unstructured.Unstructured)
	if got := kube.Drift(desired.Object, lu.Object); got == "" || got != want {
		t.Errorf("drift against the compact policy %q, against the object %q", got, want)
	}
	if pc.live(desired.GetNamespace(), "other") != nil {
		t.Error("a policy not cached was found")
	}
}
