package kube

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"krane.dev/sdk"
)

// desiredHost answers GetDesiredState with one change, as ctrl behind the
// host would.
type desiredHost struct{ ch sdk.Change }

func (desiredHost) DecryptEnv(context.Context, string, []byte) (map[string]string, error) {
	return nil, errors.New("no secrets in this test")
}

func (h desiredHost) GetDesiredState(context.Context, string, string) (sdk.Change, error) {
	return h.ch, nil
}

// heldBy reports whether someone holds the Repairer's lock of id.
func heldBy(r *Repairer, id string) bool {
	r.locks.mu.Lock()
	defer r.locks.mu.Unlock()
	l := r.locks.locks[id]
	if l == nil {
		return false
	}
	if l.TryLock() {
		l.Unlock()
		return false
	}
	return true
}

func appliedVersion(r *Repairer, id string) (uint64, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	v, ok := r.applied[id]
	return v, ok
}

// Repairer.Apply, the whole of a repairing plugin's Apply: apply runs
// under the id's lock (a repair cannot interleave), its result is the
// answer, and what it did is recorded for repairs: a success the version,
// a Deleted result forgets the id, a failure nothing. A hand edit after a
// successful Apply is repaired to exactly that version.
func TestRepairerApplyLocksAndRecords(t *testing.T) {
	const id = "cm-1"
	repaired := make(chan sdk.Change, 1)
	r := NewRepairer("cm.test", hclog.NewNullLogger(), func(_ context.Context, ch sdk.Change) error {
		repaired <- ch
		return nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go r.Run(ctx)

	apply := func(res sdk.Result, err error) func(context.Context, sdk.Change) (sdk.Result, error) {
		return func(_ context.Context, ch sdk.Change) (sdk.Result, error) {
			if !heldBy(r, ch.ID) {
				t.Errorf("apply of %s version %d ran without the id's lock: a repair could interleave", ch.ID, ch.Version)
			}
			return res, err
		}
	}
	req := func(version uint64, deleted bool) *sdk.ApplyRequest {
		return &sdk.ApplyRequest{Change: sdk.Change{Kind: "cm.test", ID: id, Version: version, Deleted: deleted}}
	}

	resp, err := r.Apply(ctx, req(3, false), apply(sdk.Applied, nil))
	if err != nil || resp.Result != sdk.Applied {
		t.Fatalf("Apply of version 3 = %v, %v; want applied", resp, err)
	}
	if v, ok := appliedVersion(r, id); !ok || v != 3 {
		t.Fatalf("after Apply of version 3 the Repairer holds %d (%v); want 3", v, ok)
	}
	if heldBy(r, id) {
		t.Fatal("the id's lock is still held after Apply returned")
	}

	// A hand edit: repaired from ctrl's desired state, which is the
	// version just applied.
	r.SetHost(desiredHost{ch: req(3, false).Change})
	cm := func(rv string, gen int64) *corev1.ConfigMap {
		return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "cm", Namespace: "ns", ResourceVersion: rv, Generation: gen, Labels: map[string]string{IDLabel: id}}}
	}
	r.Handler(IDLabel).UpdateFunc(cm("10", 1), cm("11", 2))
	select {
	case ch := <-repaired:
		if ch.Version != 3 {
			t.Fatalf("repaired to version %d; want 3, the one Apply recorded", ch.Version)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the hand edit was not repaired")
	}

	boom := errors.New("the API server refused")
	resp, err = r.Apply(ctx, req(4, false), apply(0, boom))
	if !errors.Is(err, boom) || resp != nil {
		t.Fatalf("failed Apply of version 4 = %v, %v; want the apply's error", resp, err)
	}
	if v, _ := appliedVersion(r, id); v != 3 {
		t.Fatalf("after a failed Apply of version 4 the Repairer holds %d; want still 3", v)
	}

	resp, err = r.Apply(ctx, req(5, true), apply(sdk.Deleted, nil))
	if err != nil || resp.Result != sdk.Deleted {
		t.Fatalf("Apply of the delete = %v, %v; want deleted", resp, err)
	}
	if v, ok := appliedVersion(r, id); ok {
		t.Fatalf("after a delete the Repairer still holds version %s for %s: it would repair a deleted object", strconv.FormatUint(v, 10), id)
	}
}
