package controller_test

import (
	"context"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"krane.dev/plugins/deployment/controller"
	"krane.dev/sdk"
	"krane.dev/sdk/kube"
	"krane.dev/sdk/plugintest"
)

// TestPullSecretsOnlyWhereDesired: the pull Secrets reach only the
// namespaces of deployments ctrl sent. A tenant who forges a ReplicaSet
// with Krane's labels (in its own namespace, or in kube-system) gets no
// copy; a Secret a tenant made with the copy's labels is never taken for
// the plugin's copy (neither patched with the source's data nor deleted);
// and a deployment aimed at a reserved namespace (krane's own, where the
// sources are) is refused naming k8s_namespace.
func TestPullSecretsOnlyWhereDesired(t *testing.T) {
	cluster, _, _ := pluginIdentity(t)
	ctx := context.Background()
	for _, ns := range []string{"pull-tenant", "pull-legit", "pull-look"} {
		cleanupNamespace(t, cluster, ns)
		if _, err := cluster.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	putSource(t, cluster, "pull-t", dockerConfig("registry.example", "c2VjcmV0OnYx"))

	// Forged workloads, made before and after the plugin starts.
	forge := func(ns, name string) {
		t.Helper()
		labels := map[string]string{kube.ManagedByLabel: kube.ManagedBy, kube.ComponentLabel: controller.Component, controller.LabelDeployment: "dep_forged", "app": name}
		rs := &appsv1.ReplicaSet{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels},
			Spec: appsv1.ReplicaSetSpec{Replicas: new(int32), Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": name}},
				Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: image}}}}},
		}
		if _, err := cluster.Client.AppsV1().ReplicaSets(ns).Create(ctx, rs, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = cluster.Client.AppsV1().ReplicaSets(ns).Delete(context.Background(), name, metav1.DeleteOptions{})
		})
	}
	forge("pull-tenant", "forged-before")
	forge("kube-system", "forged-system")

	// A lookalike: a tenant's Secret dressed as the plugin's copy.
	lookalike := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "pull-t", Namespace: "pull-look",
		Labels:      map[string]string{kube.ManagedByLabel: kube.ManagedBy, kube.ComponentLabel: controller.Component, controller.PullSecretLabel: "true"},
		Annotations: map[string]string{controller.CopiedFromAnnotation: "krane/pull-t"}},
		Type: corev1.SecretTypeDockerConfigJson, Data: dockerConfig("registry.example", "dGVuYW50")}
	if _, err := cluster.Client.CoreV1().Secrets("pull-look").Create(ctx, lookalike, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	p := startPlugin(t, `{"image_pull_secret": "pull-t"}`)
	forge("pull-tenant", "forged-after")

	// A real deployment gets its copy; the plugin's syncs have run.
	apply(t, p, change(t, "dep_pt_legit", 1, spec("pull-legit", "web", image, 1)), sdk.Applied)
	if s := secretIn(t, cluster, "pull-legit", "pull-t"); s == nil {
		t.Fatal("no pull Secret in the namespace of a deployment ctrl sent")
	}
	// A deployment where the lookalike is: the lookalike stays as it is.
	apply(t, p, change(t, "dep_pt_look", 1, spec("pull-look", "web", image, 1)), sdk.Applied)
	// A source change makes the plugin sync every namespace.
	putSource(t, cluster, "pull-t", dockerConfig("registry.example", "c2VjcmV0OnYy"))
	waitUntil(t, 30*time.Second, "the changed source in pull-legit", func() bool {
		s := secretIn(t, cluster, "pull-legit", "pull-t")
		return s != nil && strings.Contains(string(s.Data[corev1.DockerConfigJsonKey]), "c2VjcmV0OnYy")
	})
	time.Sleep(2 * time.Second) // room for a wrong write to land
	for _, ns := range []string{"pull-tenant", "kube-system"} {
		if s := secretIn(t, cluster, ns, "pull-t"); s != nil {
			t.Errorf("the pull Secret was copied into %s, where only a forged ReplicaSet is", ns)
			_ = cluster.Client.CoreV1().Secrets(ns).Delete(ctx, "pull-t", metav1.DeleteOptions{})
		}
	}
	unchanged := func(when string) {
		t.Helper()
		s := secretIn(t, cluster, "pull-look", "pull-t")
		switch {
		case s == nil:
			t.Errorf("%s: the tenant's lookalike Secret was deleted", when)
		case string(s.Data[corev1.DockerConfigJsonKey]) != string(lookalike.Data[corev1.DockerConfigJsonKey]):
			t.Errorf("%s: the tenant's lookalike Secret was patched with the source's data", when)
		}
	}
	unchanged("after a deployment in its namespace")

	// The deployment goes: the plugin's copies go, the lookalike stays.
	apply(t, p, deleted("dep_pt_look", 2), sdk.Deleted)
	apply(t, p, deleted("dep_pt_legit", 2), sdk.Deleted)
	waitUntil(t, 30*time.Second, "the copy gone from pull-legit", func() bool { return secretIn(t, cluster, "pull-legit", "pull-t") == nil })
	time.Sleep(time.Second)
	unchanged("after its namespace's last deployment went")

	// Reserved namespaces are refused, naming the field.
	for _, ns := range []string{"krane", "kube-system", "default", "sentinel"} {
		_, err := plugintest.Apply(ctx, p, change(t, "dep_pt_reserved", 1, spec(ns, "web", image, 1)))
		if err == nil || !sdk.IsPermanent(err) || !strings.Contains(err.Error(), "k8s_namespace") {
			t.Errorf("a deployment in namespace %s: %v, want a permanent error naming k8s_namespace", ns, err)
		}
	}
}
