package controller_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"krane.dev/sdk"
)

// desiredHost plays ctrl behind the krane host: it answers
// GetDesiredState from what the test sets.
type desiredHost struct {
	mu      sync.Mutex
	changes map[string]sdk.Change
	lookups atomic.Int64
}

func (h *desiredHost) DecryptEnv(context.Context, string, []byte) (map[string]string, error) {
	return nil, errors.New("no credentials in this test")
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

// TestHandEditRepairedWithoutResync: a hand edit of a sentinel's
// Deployment and a hand delete of its Service are repaired by the plugin
// itself, from the desired state the host looks up in ctrl, with no Apply
// from the host (which would come only at the next resync); a newer
// version ctrl holds but the host has not delivered is left to the host.
func TestHandEditRepairedWithoutResync(t *testing.T) {
	c := sharedCluster(t)
	host := &desiredHost{changes: map[string]sdk.Change{}}
	h := startWith(t, c, `{}`, hclog.Info, host)
	ctx := context.Background()
	s := sentinel("snt_repair", "sentinel-repair", "env_repair", imageV1, 2)
	ch := change(t, s, 400)
	host.set(ch)
	h.apply(ch)
	waitFor(t, 10*time.Second, "unchanged", func() (bool, error) { return h.apply(ch) == sdk.Unchanged, nil })
	deployments := c.Client.AppsV1().Deployments(ns)
	replicas := func() int32 {
		d, err := deployments.Get(ctx, s.K8SName, metav1.GetOptions{})
		if err != nil {
			return -1
		}
		return *d.Spec.Replicas
	}
	edit := func(n string) {
		t.Helper()
		if _, err := deployments.Patch(ctx, s.K8SName, types.MergePatchType, []byte(`{"spec":{"replicas":`+n+`}}`), metav1.PatchOptions{FieldManager: "kubectl-edit"}); err != nil {
			t.Fatal(err)
		}
	}

	start := time.Now()
	edit("5")
	waitFor(t, 30*time.Second, "the hand-edited replicas taken back without an Apply", func() (bool, error) { return replicas() == 2, nil })
	t.Logf("hand edit of the Deployment -> repaired in %s", time.Since(start).Round(time.Millisecond))

	svc, err := c.Client.CoreV1().Services(ns).Get(ctx, s.K8SName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Client.CoreV1().Services(ns).Delete(ctx, s.K8SName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the hand-deleted Service back without an Apply", func() (bool, error) {
		got, err := c.Client.CoreV1().Services(ns).Get(ctx, s.K8SName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return err == nil && got.UID != svc.UID, err
	})

	// ctrl holds version 401, which the host has not delivered: the repair
	// must not overtake it, so the edit stays until the host applies it.
	s2 := sentinel("snt_repair", "sentinel-repair", "env_repair", imageV1, 3)
	host.set(change(t, s2, 401))
	before := host.lookups.Load()
	edit("7")
	waitFor(t, 30*time.Second, "the plugin to look the edited object up", func() (bool, error) { return host.lookups.Load() > before, nil })
	// Repairs run one at a time: once a second edit is looked up, the
	// first one's decision has been carried out.
	edit("8")
	waitFor(t, 30*time.Second, "a second look-up", func() (bool, error) { return host.lookups.Load() > before+1, nil })
	if got := replicas(); got != 8 {
		t.Fatalf("replicas %d: repaired to a version the host has not delivered yet", got)
	}
	if r := h.apply(change(t, s2, 401)); r != sdk.Applied {
		t.Fatalf("Apply of version 401 = %s", r)
	}
	if got := replicas(); got != 3 {
		t.Fatalf("replicas %d after the host's Apply of version 401", got)
	}
	h.delete(s.Id, 402)
	objectsGone(t, c, s.K8SName)
}
