package controller

import (
	"context"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"krane.dev/internal/kinds"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
	"krane.dev/sdk"
	"krane.dev/sdk/kube"
)

// statusTick is how often pending status changes are sent: every change
// within one tick collapses into one report per policy.
const statusTick = 200 * time.Millisecond

// statusBook keeps what the cluster cannot tell: the last failed apply of
// each policy (the API server keeps no trace of a rejected write) and the
// policies deleted through Apply. Everything else is read from the
// informer when a report is built.
type statusBook struct {
	mu       sync.Mutex
	failures map[string]failure
	deleted  map[string]uint64 // id -> version of the delete
	dirty    map[string]struct{}
}

type failure struct {
	version uint64
	message string
}

func newStatusBook() *statusBook {
	return &statusBook{failures: map[string]failure{}, deleted: map[string]uint64{}, dirty: map[string]struct{}{}}
}

func (b *statusBook) failed(id string, version uint64, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.failures[id] = failure{version: version, message: err.Error()}
	delete(b.deleted, id)
	b.dirty[id] = struct{}{}
}

func (b *statusBook) applied(id string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.failures, id)
	delete(b.deleted, id)
	b.dirty[id] = struct{}{}
}

func (b *statusBook) removed(id string, version uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.failures, id)
	b.deleted[id] = version
	b.dirty[id] = struct{}{}
}

func (b *statusBook) touch(id string) {
	if id == "" {
		return
	}
	b.mu.Lock()
	b.dirty[id] = struct{}{}
	b.mu.Unlock()
}

// drain returns the ids whose status may have changed.
func (b *statusBook) drain() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	ids := make([]string, 0, len(b.dirty))
	for id := range b.dirty {
		ids = append(ids, id)
	}
	clear(b.dirty)
	return ids
}

// touchAll marks every policy the book holds anything about, and extra,
// as dirty, so a new status stream starts with the full picture.
func (b *statusBook) touchAll(extra []string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for id := range b.failures {
		b.dirty[id] = struct{}{}
	}
	for id := range b.deleted {
		b.dirty[id] = struct{}{}
	}
	for _, id := range extra {
		b.dirty[id] = struct{}{}
	}
}

func (b *statusBook) lookup(id string) (f failure, failed bool, delVersion uint64, deleted bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	f, failed = b.failures[id]
	delVersion, deleted = b.deleted[id]
	return f, failed, delVersion, deleted
}

func (b *statusBook) forgetDeleted(id string) {
	b.mu.Lock()
	delete(b.deleted, id)
	b.mu.Unlock()
}

type report struct {
	version uint64
	status  *clusterv1.CiliumNetworkPolicyStatus
}

// WatchStatus sends a krane.cluster.v1.CiliumNetworkPolicyStatus per
// policy when it changes: applied (the policy is in the cluster and its
// last apply succeeded), rejected (the last apply failed: message says
// why, e.g. the API server's answer), or deleted (once, when it is gone).
func (c *Controller) WatchStatus(ctx context.Context, send func(sdk.StatusReport) error) error {
	sent := map[string]report{}
	first := true
	tick := time.NewTicker(statusTick)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		cl := c.cluster()
		if first {
			// Start with the full picture: policies may have been applied
			// before this stream was opened.
			c.status.touchAll(cl.ids())
			first = false
		}
		for _, id := range c.status.drain() {
			r, ok := c.statusOf(cl, id, sent)
			if !ok {
				continue
			}
			if last, seen := sent[id]; seen && last.version == r.version && proto.Equal(last.status, r.status) {
				continue
			}
			if err := send(sdk.StatusReport{Kind: kinds.CiliumNetworkPolicy, ID: id, ObservedVersion: r.version, ObservedAt: time.Now(), Status: r.status}); err != nil {
				return err
			}
			if r.status.GetDeleted() {
				// Reported once; a later event for the id has nothing to say.
				delete(sent, id)
				c.status.forgetDeleted(id)
			} else {
				sent[id] = r
			}
		}
	}
}

// statusOf builds one policy's report; ok is false when there is nothing
// to say (never seen, or its deletion was already reported).
func (c *Controller) statusOf(cl *cluster, id string, sent map[string]report) (report, bool) {
	var live *unstructured.Unstructured
	if objs := cl.byID(id); len(objs) > 0 {
		live = objs[0]
	}
	f, failed, delVersion, deleted := c.status.lookup(id)
	st := &clusterv1.CiliumNetworkPolicyStatus{Id: id}
	switch {
	case failed:
		st.Message = f.message
		return report{version: f.version, status: st}, true
	case live != nil:
		st.Applied = true
		return report{version: kube.AppliedVersion(live.GetAnnotations()), status: st}, true
	case deleted:
		st.Deleted = true
		return report{version: delVersion, status: st}, true
	}
	if last, ok := sent[id]; ok {
		// It was there and is gone without a delete from ctrl (deleted by
		// hand): say so, the next resync puts it back.
		st.Deleted = true
		return report{version: last.version, status: st}, true
	}
	return report{}, false
}
