package controller

import (
	"fmt"
	"slices"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	appslisters "k8s.io/client-go/listers/apps/v1"
	"k8s.io/client-go/tools/cache"

	"krane.dev/sdk/kube"
)

func indexedReplicaSets(t testing.TB, rss ...*appsv1.ReplicaSet) cache.Indexer {
	t.Helper()
	idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, deploymentIndexers)
	for _, rs := range rss {
		if err := idx.Add(rs); err != nil {
			t.Fatal(err)
		}
	}
	return idx
}

func labelledRS(ns, name string, labels map[string]string) *appsv1.ReplicaSet {
	return &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels}}
}

func names[T metav1.Object](objs []T) []string {
	var out []string
	for _, o := range objs {
		out = append(out, o.GetNamespace()+"/"+o.GetName())
	}
	slices.Sort(out)
	return out
}

// TestDeploymentIndexMatchesSelector: the index finds exactly what a
// byDeployment scan of the cache finds, whatever labels an object has.
func TestDeploymentIndexMatchesSelector(t *testing.T) {
	ours := func(id string) map[string]string {
		l := kube.ManagedLabels(Component)
		l[LabelDeployment] = id
		return l
	}
	with := func(l map[string]string, k, v string) map[string]string { l[k] = v; return l }
	without := func(l map[string]string, k string) map[string]string { delete(l, k); return l }
	idx := indexedReplicaSets(t,
		labelledRS("a", "one", ours("d1")),
		labelledRS("b", "one-moved", ours("d1")),
		labelledRS("a", "two", ours("d2")),
		labelledRS("a", "empty-id", ours("")),
		labelledRS("a", "no-id", without(ours("x"), LabelDeployment)),
		labelledRS("a", "foreign", with(ours("d1"), kube.ManagedByLabel, "someone-else")),
		labelledRS("a", "unmanaged", without(ours("d1"), kube.ManagedByLabel)),
		labelledRS("a", "sentinel", with(ours("d1"), kube.ComponentLabel, SentinelComponent)),
		labelledRS("a", "no-labels", nil),
	)
	lister := appslisters.NewReplicaSetLister(idx)
	for _, id := range []string{"d1", "d2", "d3", "x"} {
		scanned, err := lister.List(byDeployment(id))
		if err != nil {
			t.Fatal(err)
		}
		indexed, err := ofDeployment[*appsv1.ReplicaSet](idx, id)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := names(indexed), names(scanned); !slices.Equal(got, want) {
			t.Errorf("deployment %q: index finds %v, a selector scan %v", id, got, want)
		}
	}
	if got := names(must(ofDeployment[*appsv1.ReplicaSet](idx, "d1"))); !slices.Equal(got, []string{"a/one", "b/one-moved"}) {
		t.Errorf("d1: %v", got)
	}

	// Updates and deletes move objects between index entries.
	moved := labelledRS("a", "two", ours("d1"))
	if err := idx.Update(moved); err != nil {
		t.Fatal(err)
	}
	if err := idx.Delete(labelledRS("b", "one-moved", nil)); err != nil {
		t.Fatal(err)
	}
	if got := names(must(ofDeployment[*appsv1.ReplicaSet](idx, "d1"))); !slices.Equal(got, []string{"a/one", "a/two"}) {
		t.Errorf("d1 after an update and a delete: %v", got)
	}
	if got := must(ofDeployment[*appsv1.ReplicaSet](idx, "d2")); len(got) != 0 {
		t.Errorf("d2 after its ReplicaSet moved to d1: %v", names(got))
	}
	// Another type in the same index is skipped, not a panic.
	if got := must(ofDeployment[*corev1.Pod](idx, "d1")); len(got) != 0 {
		t.Errorf("pods from a ReplicaSet index: %v", got)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// BenchmarkReplicaSetsOfDeployment is the cache lookup every Apply and
// every status report makes (twice per applied deployment), with 2,000
// deployments in the cache: by index, and by the label-selector scan it
// replaced (linear in the cache, so quadratic over a bootstrap).
func BenchmarkReplicaSetsOfDeployment(b *testing.B) {
	const n = 2000
	rss := make([]*appsv1.ReplicaSet, n)
	for i := range rss {
		id := fmt.Sprintf("d-%05d", i)
		rss[i] = buildReplicaSet(id, uint64(i+1), validSpec(), Defaults())
	}
	idx := indexedReplicaSets(b, rss...)
	lister := appslisters.NewReplicaSetLister(idx)
	id := func(i int) string { return fmt.Sprintf("d-%05d", i%n) }
	b.Run("index", func(b *testing.B) {
		i := 0
		for b.Loop() {
			if got, _ := ofDeployment[*appsv1.ReplicaSet](idx, id(i)); len(got) != 1 {
				b.Fatalf("%s: %d ReplicaSets", id(i), len(got))
			}
			i++
		}
	})
	b.Run("selector-scan", func(b *testing.B) {
		i := 0
		for b.Loop() {
			if got, _ := lister.List(byDeployment(id(i))); len(got) != 1 {
				b.Fatalf("%s: %d ReplicaSets", id(i), len(got))
			}
			i++
		}
	})
}
