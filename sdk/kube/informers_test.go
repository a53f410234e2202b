package kube_test

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"krane.dev/sdk"
	"krane.dev/sdk/envtest"
	"krane.dev/sdk/kube"
)

func TestMain(m *testing.M) { envtest.Main(m) }

type changes chan string

func (c changes) Changed(id string) { c <- id }

// TestInformersSyncOnlyManagedObjects: the caches hold only objects with
// the selector's labels, and a change reaches the tracker.
func TestInformersSyncOnlyManagedObjects(t *testing.T) {
	cluster := envtest.Shared(t)
	ctx := context.Background()
	if err := cluster.EnsureNamespace(ctx, "informers"); err != nil {
		t.Fatal(err)
	}
	mine := kube.ManagedLabels("informer-test")
	mine[kube.IDLabel] = "r1"
	for name, labels := range map[string]map[string]string{"mine": mine, "foreign": {"app": "other"}} {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "informers", Labels: labels}}
		if _, err := cluster.Client.CoreV1().ConfigMaps("informers").Create(ctx, cm, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cluster.Client.CoreV1().ConfigMaps("informers").Delete(ctx, name, metav1.DeleteOptions{}) })
	}
	k, err := kube.Connect(ctx, sdk.KubeSource{Path: cluster.Kubeconfig}, nil)
	if err != nil {
		t.Fatal(err)
	}
	inf := kube.NewInformers()
	defer inf.Stop()
	events := make(changes, 16)
	cms := kube.Informer[corev1.ConfigMap, corev1.ConfigMapList](inf, k, "configmaps", kube.InformerOptions{LabelSelector: kube.ManagedSelector("informer-test")})
	store, err := kube.Track[*corev1.ConfigMap](cms, kube.IDLabel, events)
	if err != nil {
		t.Fatal(err)
	}
	if err := inf.Start(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	if got := store.List(); len(got) != 1 || got[0].Name != "mine" || got[0].ManagedFields != nil {
		t.Fatalf("cache: %v", got)
	}
	if ids := store.IDs(); len(ids) != 1 || ids[0] != "r1" {
		t.Errorf("ids: %v", ids)
	}
	select {
	case id := <-events:
		if id != "r1" {
			t.Errorf("change of %q", id)
		}
	case <-time.After(time.Minute):
		t.Error("no change event for the cached object")
	}
	inf.Stop()
	inf.Stop() // twice is fine
}

// TestInformersNameWhatDidNotSync: an identity that may not list what an
// informer watches fails Start within its bound, naming the resource and
// the RBAC fix, instead of waiting for the caller's deadline.
func TestInformersNameWhatDidNotSync(t *testing.T) {
	cluster := envtest.Shared(t)
	_, kubeconfig, err := cluster.ServiceAccountConfig(context.Background(), "informers", "nobody")
	if err != nil {
		t.Fatal(err)
	}
	k, err := kube.Connect(context.Background(), sdk.KubeSource{Path: kubeconfig}, nil) // no permissions declared: no check
	if err != nil {
		t.Fatal(err)
	}
	inf := kube.NewInformers()
	kube.Informer[corev1.Secret, corev1.SecretList](inf, k, "secrets", kube.InformerOptions{LabelSelector: kube.ManagedSelector("x")})
	begin := time.Now()
	err = inf.Start(context.Background(), 3*time.Second)
	if err == nil || !strings.Contains(err.Error(), "secrets") || !strings.Contains(err.Error(), "rbac.yaml") {
		t.Fatalf("Start = %v; want an error naming secrets and the RBAC fix", err)
	}
	if took := time.Since(begin); took > time.Minute {
		t.Errorf("Start took %s with a 3s bound", took)
	}
	select {
	case <-inf.Done():
	default:
		t.Error("a failed Start left the informers running")
	}
}
