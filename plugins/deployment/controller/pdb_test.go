package controller_test

import (
	"context"
	"testing"
	"time"

	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"krane.dev/plugins/deployment/controller"
	"krane.dev/sdk"
)

// TestDisruptionBudget: a deployment of more than one replica has a
// PodDisruptionBudget (one pod at a time, unhealthy pods always evictable);
// scaled to one it loses it, and it goes with the deployment. A hand-deleted
// budget comes back at the next Apply, an unchanged one costs no write.
func TestDisruptionBudget(t *testing.T) {
	cluster, _, _ := pluginIdentity(t)
	cleanupNamespace(t, cluster, "pdb")
	ctx := context.Background()
	p := startPlugin(t, `{}`)
	pdbs := cluster.Client.PolicyV1().PodDisruptionBudgets("pdb")
	get := func() (*policyv1.PodDisruptionBudget, bool) {
		t.Helper()
		b, err := pdbs.Get(ctx, "web", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil, false
		}
		if err != nil {
			t.Fatal(err)
		}
		return b, true
	}
	const id = "dep_pdb"
	d := spec("pdb", "web", image, 3)
	apply(t, p, change(t, id, 1, d), sdk.Applied)
	b, ok := get()
	if !ok {
		t.Fatal("no PodDisruptionBudget for 3 replicas")
	}
	if b.Spec.MaxUnavailable == nil || b.Spec.MaxUnavailable.IntValue() != 1 || b.Spec.MinAvailable != nil {
		t.Errorf("budget maxUnavailable %v minAvailable %v, want 1 and none", b.Spec.MaxUnavailable, b.Spec.MinAvailable)
	}
	if b.Spec.UnhealthyPodEvictionPolicy == nil || *b.Spec.UnhealthyPodEvictionPolicy != policyv1.AlwaysAllow {
		t.Errorf("unhealthyPodEvictionPolicy %v, want AlwaysAllow", b.Spec.UnhealthyPodEvictionPolicy)
	}
	if sel := b.Spec.Selector.MatchLabels; len(sel) != 1 || sel[controller.LabelDeployment] != id {
		t.Errorf("selector %v, want the deployment id only (every template's pods)", sel)
	}
	applyUntil(t, p, change(t, id, 1, d), sdk.Unchanged)

	if err := pdbs.Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	applyUntil(t, p, change(t, id, 1, d), sdk.Applied)
	if _, ok := get(); !ok {
		t.Fatal("a hand-deleted budget was not restored")
	}

	d.Replicas = 1
	apply(t, p, change(t, id, 2, d), sdk.Applied)
	waitUntil(t, 30*time.Second, "budget gone at 1 replica", func() bool { _, ok := get(); return !ok })
	d.Replicas = 2
	applyUntil(t, p, change(t, id, 3, d), sdk.Applied)
	if _, ok := get(); !ok {
		t.Fatal("no budget after scaling back to 2")
	}
	apply(t, p, deleted(id, 4), sdk.Deleted)
	if _, ok := get(); ok {
		t.Fatal("budget left behind by the delete")
	}
}
