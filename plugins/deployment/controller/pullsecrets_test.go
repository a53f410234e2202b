package controller_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"krane.dev/internal/testenv/kubeenv"
	"krane.dev/plugins/deployment/controller"
	"krane.dev/sdk"
)

func dockerConfig(registry, auth string) map[string][]byte {
	return map[string][]byte{corev1.DockerConfigJsonKey: fmt.Appendf(nil, `{"auths":{%q:{"auth":%q}}}`, registry, auth)}
}

// putSource creates or replaces a pull Secret in krane's namespace, as an
// operator does.
func putSource(t *testing.T, c *kubeenv.Cluster, name string, data map[string][]byte) {
	t.Helper()
	ctx := context.Background()
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "krane"}, Type: corev1.SecretTypeDockerConfigJson, Data: data}
	live, err := c.Client.CoreV1().Secrets("krane").Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		_, err = c.Client.CoreV1().Secrets("krane").Create(ctx, s, metav1.CreateOptions{})
	case err == nil:
		live.Data = data
		_, err = c.Client.CoreV1().Secrets("krane").Update(ctx, live, metav1.UpdateOptions{})
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.Client.CoreV1().Secrets("krane").Delete(context.Background(), name, metav1.DeleteOptions{})
	})
}

// secretIn returns ns/name, nil when it does not exist.
func secretIn(t *testing.T, c *kubeenv.Cluster, ns, name string) *corev1.Secret {
	t.Helper()
	s, err := c.Client.CoreV1().Secrets(ns).Get(context.Background(), name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestPullSecretsReachEveryWorkspace: the configured pull Secrets are in a
// new workspace namespace as soon as the Apply that creates it returns
// (so before any pod), follow changes of their source, come back when
// deleted by hand, and go when the config drops them, when their source
// goes, and when no workload is left in the namespace. A Secret of the
// same name that Krane did not make is never touched.
func TestPullSecretsReachEveryWorkspace(t *testing.T) {
	cluster, kubeconfig, _ := pluginIdentity(t)
	ctx := context.Background()
	for _, ns := range []string{"pull-new", "pull-pre", "pull-foreign"} {
		cleanupNamespace(t, cluster, ns)
	}
	putSource(t, cluster, "pull-all", dockerConfig("registry.example", "YWxsOnYx"))
	putSource(t, cluster, "pull-private", dockerConfig("private.example:5000", "cHJpdjp2MQ=="))
	config := `{"image_pull_secret": "pull-all", "image_pull_secrets": {"private.example:5000": "pull-private"}}`
	p := startPlugin(t, config)

	wantCopy := func(ns, name string) {
		t.Helper()
		src, dst := secretIn(t, cluster, "krane", name), secretIn(t, cluster, ns, name)
		switch {
		case dst == nil:
			t.Fatalf("no pull Secret %s in namespace %s", name, ns)
		case dst.Type != src.Type || string(dst.Data[corev1.DockerConfigJsonKey]) != string(src.Data[corev1.DockerConfigJsonKey]):
			t.Fatalf("pull Secret %s/%s = %s %s, want its source's %s %s", ns, name, dst.Type, dst.Data[corev1.DockerConfigJsonKey], src.Type, src.Data[corev1.DockerConfigJsonKey])
		case dst.Labels[controller.PullSecretLabel] != "true" || dst.Annotations[controller.CopiedFromAnnotation] != "krane/"+name:
			t.Fatalf("pull Secret %s/%s: labels %v annotations %v", ns, name, dst.Labels, dst.Annotations)
		}
	}
	eventually := func(what string, cond func() bool) { t.Helper(); waitUntil(t, 30*time.Second, what, cond) }
	sameAsSource := func(ns, name string) func() bool {
		return func() bool {
			src, dst := secretIn(t, cluster, "krane", name), secretIn(t, cluster, ns, name)
			return dst != nil && string(dst.Data[corev1.DockerConfigJsonKey]) == string(src.Data[corev1.DockerConfigJsonKey])
		}
	}
	gone := func(ns, name string) func() bool {
		return func() bool { return secretIn(t, cluster, ns, name) == nil }
	}

	// A new workspace: its namespace is created by the Apply, with the
	// copies in it when the Apply returns.
	web := change(t, "dep_pull", 1, spec("pull-new", "web", "private.example:5000/team/web:v1", 1))
	apply(t, p, web, sdk.Applied)
	wantCopy("pull-new", "pull-all")
	wantCopy("pull-new", "pull-private")

	// A namespace made by someone else, holding its own Secret of one name.
	for _, ns := range []string{"pull-pre", "pull-foreign"} {
		if _, err := cluster.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	theirs := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "pull-all", Namespace: "pull-foreign"}, Type: corev1.SecretTypeDockerConfigJson, Data: dockerConfig("registry.example", "dGhlaXJz")}
	if _, err := cluster.Client.CoreV1().Secrets("pull-foreign").Create(ctx, theirs, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pre := change(t, "dep_pull_pre", 1, spec("pull-pre", "web", image, 1))
	foreign := change(t, "dep_pull_foreign", 1, spec("pull-foreign", "web", image, 1))
	apply(t, p, pre, sdk.Applied)
	apply(t, p, foreign, sdk.Applied)
	wantCopy("pull-pre", "pull-all")
	wantCopy("pull-foreign", "pull-private")

	// A change of the source reaches every namespace, without an Apply.
	putSource(t, cluster, "pull-all", dockerConfig("registry.example", "YWxsOnYy"))
	eventually("the changed source in pull-new", sameAsSource("pull-new", "pull-all"))
	eventually("the changed source in pull-pre", sameAsSource("pull-pre", "pull-all"))

	// A copy deleted by hand comes back, without an Apply.
	if err := cluster.Client.CoreV1().Secrets("pull-new").Delete(ctx, "pull-private", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually("the hand-deleted copy back", sameAsSource("pull-new", "pull-private"))

	// Someone else's Secret of that name was never touched.
	if s := secretIn(t, cluster, "pull-foreign", "pull-all"); s == nil || string(s.Data[corev1.DockerConfigJsonKey]) != string(theirs.Data[corev1.DockerConfigJsonKey]) || s.Labels[controller.PullSecretLabel] != "" {
		t.Errorf("the namespace's own Secret pull-all was changed: %v", s)
	}

	// The config drops one: its copies go.
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if _, err := p.Configure(cctx, &sdk.ConfigureRequest{Region: "local", ClusterID: "test", Kube: sdk.KubeSource{Path: kubeconfig}, Config: []byte(`{"image_pull_secret": "pull-all"}`)}); err != nil {
		t.Fatal(err)
	}
	eventually("pull-private gone from pull-new", gone("pull-new", "pull-private"))
	eventually("pull-private gone from pull-foreign", gone("pull-foreign", "pull-private"))
	wantCopy("pull-new", "pull-all")

	// The source goes: its copies go.
	if err := cluster.Client.CoreV1().Secrets("krane").Delete(ctx, "pull-all", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually("pull-all gone from pull-new", gone("pull-new", "pull-all"))
	eventually("pull-all gone from pull-pre", gone("pull-pre", "pull-all"))
	if s := secretIn(t, cluster, "pull-foreign", "pull-all"); s == nil {
		t.Error("the namespace's own Secret pull-all was deleted with the source of Krane's copies")
	}
	// It comes back: so do its copies.
	putSource(t, cluster, "pull-all", dockerConfig("registry.example", "YWxsOnYz"))
	eventually("pull-all back in pull-pre", sameAsSource("pull-pre", "pull-all"))

	// The last workload of a namespace Krane did not create goes: the
	// namespace stays, the copies go with the workload.
	apply(t, p, deleted("dep_pull_pre", 2), sdk.Deleted)
	eventually("pull-all gone from pull-pre", gone("pull-pre", "pull-all"))
	if namespaceGone(t, cluster, "pull-pre") {
		t.Error("namespace pull-pre, which Krane did not create, was deleted")
	}
	// A namespace Krane created goes with its last workload, copies and
	// all: a copy does not keep it.
	apply(t, p, deleted("dep_pull", 2), sdk.Deleted)
	waitUntil(t, time.Minute, "namespace pull-new removed", func() bool { return namespaceGone(t, cluster, "pull-new") })
	apply(t, p, deleted("dep_pull_foreign", 2), sdk.Deleted)
}
