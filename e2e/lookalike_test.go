package e2e

import (
	"context"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestLookalikesSurviveGCAndResync: objects named like Krane's, labelled
// like Krane's except for the managed-by label, in other namespaces, are
// never touched: not by a bootstrap's garbage collection after a krane
// restart, not by resyncs.
func TestLookalikesSurviveGCAndResync(t *testing.T) {
	st := sharedStack(t)
	ctx := context.Background()
	id := deployJSON(t, st, "e2e-lookalike", "registry.local/e2e/lookalike:1", 1)
	c := st.Clusters["local-a"]
	list, err := c.Client.AppsV1().ReplicaSets("").List(ctx, metav1.ListOptions{LabelSelector: "unkey.com/deployment.id=" + id})
	if err != nil || len(list.Items) != 1 {
		t.Fatalf("ReplicaSets of %s: %d, %v", id, len(list.Items), err)
	}
	real := list.Items[0]
	ns := "not-krane"
	if err := c.EnsureNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{}
	for k, v := range real.Labels {
		if k != "app.kubernetes.io/managed-by" {
			labels[k] = v
		}
	}
	zero := int32(0)
	twin := &appsv1.ReplicaSet{
		ObjectMeta: metav1.ObjectMeta{Name: real.Name, Namespace: ns, Labels: labels},
		Spec: appsv1.ReplicaSetSpec{Replicas: &zero, Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"twin": "1"}},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"twin": "1"}},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "x", Image: "registry.local/someone-else:1"}}}}},
	}
	if _, err := c.Client.AppsV1().ReplicaSets(ns).Create(ctx, twin, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	sentinels, err := c.Client.AppsV1().Deployments("sentinel").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/managed-by=krane"})
	if err != nil || len(sentinels.Items) == 0 {
		t.Fatalf("no sentinel Deployment to copy: %v", err)
	}
	sen := sentinels.Items[0]
	senLabels := map[string]string{}
	for k, v := range sen.Labels {
		if k != "app.kubernetes.io/managed-by" {
			senLabels[k] = v
		}
	}
	senTwin := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: sen.Name, Namespace: ns, Labels: senLabels},
		Spec: appsv1.DeploymentSpec{Replicas: &zero, Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"twin": "2"}},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"twin": "2"}},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "x", Image: "registry.local/someone-else:2"}}}}},
	}
	if _, err := c.Client.AppsV1().Deployments(ns).Create(ctx, senTwin, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// A krane restart re-bootstraps every kind and garbage-collects; then
	// two resyncs (5s) run.
	if err := st.RestartKrane(ctx, "local-a", true); err != nil {
		t.Fatal(err)
	}
	time.Sleep(12 * time.Second)

	for _, check := range []struct {
		what string
		get  func() (metav1.Object, error)
	}{
		{"ReplicaSet twin", func() (metav1.Object, error) {
			return c.Client.AppsV1().ReplicaSets(ns).Get(ctx, real.Name, metav1.GetOptions{})
		}},
		{"sentinel Deployment twin", func() (metav1.Object, error) {
			return c.Client.AppsV1().Deployments(ns).Get(ctx, sen.Name, metav1.GetOptions{})
		}},
	} {
		o, err := check.get()
		if err != nil {
			t.Errorf("%s was removed: %v", check.what, err)
			continue
		}
		for _, mf := range o.GetManagedFields() {
			if mf.Manager == "krane" {
				t.Errorf("%s was written by Krane", check.what)
			}
		}
	}
	// And Krane's own objects are all still there.
	if _, err := c.Client.AppsV1().ReplicaSets(real.Namespace).Get(ctx, real.Name, metav1.GetOptions{}); err != nil {
		t.Errorf("Krane's own ReplicaSet: %v", err)
	}
}
