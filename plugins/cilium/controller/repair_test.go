package controller_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"krane.dev/internal/testenv/kubeenv"
	"krane.dev/plugins/cilium/controller"
	"krane.dev/sdk"
	"krane.dev/sdk/plugintest"
)

// desiredHost plays ctrl behind the krane host: it answers
// GetDesiredState from what the test sets.
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

// TestHandEditRepairedWithoutResync: a hand edit and a hand delete of a
// policy are repaired by the plugin itself, from the desired state the
// host looks up in ctrl, with no Apply from the host (which would come only
// at the next resync); a newer version ctrl holds but the host has not
// delivered is left to the host.
func TestHandEditRepairedWithoutResync(t *testing.T) {
	cluster := kubeenv.Shared(t)
	host := &desiredHost{changes: map[string]sdk.Change{}}
	ctl := plugintest.New(t, controller.New(hclog.New(&hclog.LoggerOptions{Name: "cilium", Level: hclog.Warn})), plugintest.WithHost(host))
	ctx := context.Background()
	if _, err := ctl.Configure(ctx, &sdk.ConfigureRequest{Region: "local-a", ClusterID: "c1", Kube: sdk.KubeSource{Path: pluginKubeconfig(t, cluster)}, Config: json.RawMessage(testConfig)}); err != nil {
		t.Fatal(err)
	}
	const id = "pol-repair"
	v1 := change(t, id, 1, "team-b", "repair", webPolicy("web", "8080"))
	host.set(v1)
	if r, err := plugintest.Apply(ctx, ctl, v1); err != nil || r != sdk.Applied {
		t.Fatalf("Apply = %s, %v", r, err)
	}
	port := func() string {
		u, err := cnps(cluster, "team-b").Get(ctx, "repair", metav1.GetOptions{})
		if err != nil {
			return ""
		}
		return str(t, u, "spec", "ingress", 0, "toPorts", 0, "ports", 0, "port")
	}
	edit := func(p string) {
		t.Helper()
		patch := fmt.Sprintf(`[{"op": "replace", "path": "/spec/ingress/0/toPorts/0/ports/0/port", "value": %q}]`, p)
		if _, err := cnps(cluster, "team-b").Patch(ctx, "repair", types.JSONPatchType, []byte(patch), metav1.PatchOptions{FieldManager: "kubectl-edit"}); err != nil {
			t.Fatal(err)
		}
	}
	backTo := func(what, want string) {
		t.Helper()
		eventually(t, what, func() error {
			if got := port(); got != want {
				return fmt.Errorf("port %q", got)
			}
			return nil
		})
	}

	edit("9999")
	backTo("the hand-edited port taken back without an Apply", "8080")

	live, err := cnps(cluster, "team-b").Get(ctx, "repair", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := cnps(cluster, "team-b").Delete(ctx, "repair", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the hand-deleted policy back without an Apply", func() error {
		u, err := cnps(cluster, "team-b").Get(ctx, "repair", metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			return err
		case err != nil:
			return err
		case u.GetUID() == live.GetUID():
			return errors.New("still the deleted object")
		}
		return nil
	})

	// ctrl holds version 2, which the host has not delivered: the repair
	// must not overtake it.
	v2 := change(t, id, 2, "team-b", "repair", webPolicy("web", "8081"))
	host.set(v2)
	before := host.lookups.Load()
	edit("7777")
	eventually(t, "the plugin to look the edited policy up", func() error {
		if host.lookups.Load() == before {
			return errors.New("no look-up yet")
		}
		return nil
	})
	// Repairs run one at a time: once a second edit is looked up, the
	// first one's decision has been carried out.
	edit("7778")
	eventually(t, "a second look-up", func() error {
		if host.lookups.Load() <= before+1 {
			return errors.New("no second look-up yet")
		}
		return nil
	})
	if got := port(); got != "7778" {
		t.Fatalf("port %q: repaired to a version the host has not delivered yet", got)
	}
	if r, err := plugintest.Apply(ctx, ctl, v2); err != nil || r != sdk.Applied {
		t.Fatalf("Apply v2 = %s, %v", r, err)
	}
	backTo("version 2 applied", "8081")
	if r, err := plugintest.Apply(ctx, ctl, deletion(id, 3)); err != nil || r != sdk.Deleted {
		t.Fatalf("delete = %s, %v", r, err)
	}
}
