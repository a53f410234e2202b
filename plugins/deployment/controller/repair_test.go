package controller_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"krane.dev/plugins/deployment/controller"
	"krane.dev/sdk"
	"krane.dev/sdk/plugintest"
)

// desiredHost plays ctrl behind the krane host: it answers GetDesiredState
// from a map the test sets.
type desiredHost struct {
	mu      sync.Mutex
	changes map[string]sdk.Change
	lookups atomic.Int64
}

func (h *desiredHost) DecryptEnv(context.Context, string, []byte) (map[string]string, error) {
	return nil, errors.New("no secrets in this test")
}

func (h *desiredHost) GetDesiredState(_ context.Context, kind, id string) (sdk.Change, error) {
	h.lookups.Add(1)
	h.mu.Lock()
	defer h.mu.Unlock()
	ch, ok := h.changes[id]
	if !ok {
		return sdk.Change{}, status.Errorf(codes.NotFound, "no %s %s", kind, id)
	}
	return ch, nil
}

func (h *desiredHost) set(ch sdk.Change) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.changes[ch.ID] = ch
}

// TestDriftIsRepairedWithoutResync: a hand edit or a hand delete of a
// ReplicaSet is repaired by the plugin itself, from the desired state the
// host looks up in ctrl, with no Apply from the host; a newer version that
// ctrl holds but the host has not delivered yet is left to the host.
func TestDriftIsRepairedWithoutResync(t *testing.T) {
	cluster, kubeconfig, _ := pluginIdentity(t)
	cleanupNamespace(t, cluster, "repair")
	ctx := context.Background()
	host := &desiredHost{changes: map[string]sdk.Change{}}
	p := plugintest.New(t, controller.New(testLogger()), plugintest.WithHost(host))
	if _, err := p.Configure(ctx, &sdk.ConfigureRequest{Region: "local", ClusterID: "test", Kube: sdk.KubeSource{Path: kubeconfig}, Config: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = p.Shutdown(ctx)
	})
	const id = "dep_repair"
	ch := change(t, id, 1, spec("repair", "web", image, 2))
	host.set(ch)
	apply(t, p, ch, sdk.Applied)
	applyUntil(t, p, ch, sdk.Unchanged)
	rs := replicaSetsOf(t, cluster, id)[0]
	rsClient := cluster.Client.AppsV1().ReplicaSets("repair")
	imageOf := func() string {
		got, err := rsClient.Get(ctx, rs.Name, metav1.GetOptions{})
		if err != nil {
			return ""
		}
		return got.Spec.Template.Spec.Containers[0].Image
	}
	edit := func() {
		t.Helper()
		patch := `[{"op": "replace", "path": "/spec/template/spec/containers/0/image", "value": "registry.example/evil:latest"}]`
		if _, err := rsClient.Patch(ctx, rs.Name, types.JSONPatchType, []byte(patch), metav1.PatchOptions{FieldManager: "kubectl-edit"}); err != nil {
			t.Fatal(err)
		}
	}

	// A hand edit: repaired with no Apply.
	start := time.Now()
	edit()
	waitUntil(t, 30*time.Second, "the hand-edited image taken back without an Apply", func() bool { return imageOf() == image })
	t.Logf("drift repair time (hand edit of the image -> restored, no resync): %s", time.Since(start).Round(time.Millisecond))

	// A hand delete: the ReplicaSet comes back, with no Apply.
	if err := rsClient.Delete(ctx, rs.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	waitUntil(t, 30*time.Second, "the hand-deleted ReplicaSet back without an Apply", func() bool {
		got, err := rsClient.Get(ctx, rs.Name, metav1.GetOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
		return err == nil && got.UID != rs.UID && got.DeletionTimestamp == nil
	})
	t.Logf("hand-deleted ReplicaSet recreated after %s", time.Since(start).Round(time.Millisecond))

	// ctrl holds version 2, which the host has not delivered: the repair
	// must not overtake it (the host applies in order), so the edit stays
	// until the host's Apply of version 2.
	d2 := spec("repair", "web", image, 3)
	host.set(change(t, id, 2, d2))
	before := host.lookups.Load()
	edit()
	waitUntil(t, 30*time.Second, "the plugin to look the edited object up", func() bool { return host.lookups.Load() > before })
	// Repairs run one at a time: once a second edit is looked up, the
	// first one's decision has been carried out.
	if _, err := rsClient.Patch(ctx, rs.Name, types.MergePatchType, []byte(`{"metadata":{"annotations":{"hand/poke":"1"}}}`), metav1.PatchOptions{FieldManager: "kubectl-edit"}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 30*time.Second, "a second look-up", func() bool { return host.lookups.Load() > before+1 })
	if got := imageOf(); got == image {
		t.Fatal("repaired to a version the host has not delivered yet")
	}
	applyUntil(t, p, change(t, id, 2, d2), sdk.Applied)
	if got := imageOf(); got != image {
		t.Fatalf("image %q after the host's Apply of version 2", got)
	}
	apply(t, p, deleted(id, 3), sdk.Deleted)
	t.Logf("%d desired-state look-ups in all", host.lookups.Load())
}
