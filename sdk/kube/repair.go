package kube

import (
	"context"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"krane.dev/sdk"
)

// Repairer repairs managed objects as soon as an informer shows that
// someone else changed them (a hand edit, a hand delete), instead of at the
// host's next resync, which may be minutes away. For each such object it
// asks ctrl, through the host (sdk.DesiredStates), for the object's desired
// state, and re-applies it through the plugin's own Apply path, which
// writes only what drifted.
//
// What counts as someone else's change: an update that changes the
// object's generation (its spec), labels or annotations, or a delete,
// unless the resource version (for a delete: the UID) is one the plugin
// reported with Wrote (or Deleting). Status writes of the cluster's own
// controllers change none of these and cost nothing.
//
// Order is kept: a repair applies only the version the plugin last applied
// to that object (Applied). When ctrl already holds a newer version, or a
// delete, the host is about to deliver it in order, and the repair leaves
// it to the host. A repair holds Lock(id) while it checks that version and
// applies; a plugin that takes the same lock around its Apply (as the host
// never runs two Applies of one object at once, that is the only overlap)
// can never have a repair undo a newer Apply.
type Repairer struct {
	kind  string
	log   hclog.Logger
	apply func(context.Context, sdk.Change) error
	host  atomic.Pointer[sdk.Host]

	mu      sync.Mutex
	applied map[string]uint64 // id -> version last applied (not deleted)
	own     map[string]bool   // resource versions and UIDs of our own writes
	dirty   map[string]bool
	wake    chan struct{}

	repairs, skipped atomic.Int64

	locks idLocks
}

// NewRepairer returns a Repairer of kind. apply is the plugin's Apply of
// one change, under the same locks as the host's Applies.
func NewRepairer(kind string, log hclog.Logger, apply func(context.Context, sdk.Change) error) *Repairer {
	return &Repairer{
		kind: kind, log: log, apply: apply,
		applied: map[string]uint64{}, own: map[string]bool{}, dirty: map[string]bool{},
		wake: make(chan struct{}, 1),
	}
}

// SetHost sets the host services to ask (from ConfigureRequest.Host). A
// host without sdk.DesiredStates disables repair; the resync still
// corrects drift.
func (r *Repairer) SetHost(h sdk.Host) {
	if h == nil {
		r.host.Store(nil)
		return
	}
	r.host.Store(&h)
}

// Applied records that the plugin applied version of id; deleted forgets id
// (nothing to repair).
func (r *Repairer) Applied(id string, version uint64, deleted bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if deleted {
		delete(r.applied, id)
		return
	}
	r.applied[id] = version
}

// Wrote records an object the plugin itself just wrote (the API server's
// answer), so its watch event is not taken for someone else's change.
func (r *Repairer) Wrote(obj any) {
	if m, err := meta.Accessor(obj); err == nil && m.GetResourceVersion() != "" {
		r.mu.Lock()
		r.own["rv/"+m.GetResourceVersion()] = true
		r.mu.Unlock()
	}
}

// Deleting records an object the plugin is about to delete itself.
func (r *Repairer) Deleting(uid types.UID) {
	r.mu.Lock()
	r.own["uid/"+string(uid)] = true
	r.mu.Unlock()
}

// Counts returns how many repairs were applied and how many looked-up
// objects were left to the host (a newer version or a delete pending).
func (r *Repairer) Counts() (repaired, skipped int64) { return r.repairs.Load(), r.skipped.Load() }

// Handler is the informer event handler that notices foreign changes of
// objects labelled idLabel.
func (r *Repairer) Handler(idLabel string) cache.ResourceEventHandlerFuncs {
	return cache.ResourceEventHandlerFuncs{
		UpdateFunc: func(oldObj, newObj any) {
			o, err1 := meta.Accessor(oldObj)
			n, err2 := meta.Accessor(newObj)
			if err1 != nil || err2 != nil || o.GetResourceVersion() == n.GetResourceVersion() {
				return
			}
			if o.GetGeneration() == n.GetGeneration() && maps.Equal(o.GetLabels(), n.GetLabels()) && maps.Equal(o.GetAnnotations(), n.GetAnnotations()) {
				return // status, or metadata we do not manage
			}
			if n.GetDeletionTimestamp() != nil || r.takeOwn("rv/"+n.GetResourceVersion()) {
				return
			}
			r.mark(n.GetLabels()[idLabel])
		},
		DeleteFunc: func(obj any) {
			if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = tomb.Obj
			}
			m, err := meta.Accessor(obj)
			if err != nil || r.takeOwn("uid/"+string(m.GetUID())) {
				return
			}
			r.mark(m.GetLabels()[idLabel])
		},
	}
}

// takeOwn reports (and forgets) whether key was recorded as our own write.
// Entries of writes whose event never comes (a later write overtook it in
// the watch) are dropped when the map grows large; the cost is one
// needless look-up, never a missed repair.
func (r *Repairer) takeOwn(key string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.own[key] {
		delete(r.own, key)
		return true
	}
	if len(r.own) > 10000 {
		clear(r.own)
	}
	return false
}

func (r *Repairer) mark(id string) {
	if id == "" {
		return
	}
	r.mu.Lock()
	_, known := r.applied[id]
	if known {
		r.dirty[id] = true
	}
	r.mu.Unlock()
	if known {
		select {
		case r.wake <- struct{}{}:
		default:
		}
	}
}

// Run repairs marked objects until ctx ends, one at a time (a hand edit is
// rare; a storm of them must not flood ctrl).
func (r *Repairer) Run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.wake:
		}
		r.mu.Lock()
		ids := make([]string, 0, len(r.dirty))
		for id := range r.dirty {
			ids = append(ids, id)
		}
		clear(r.dirty)
		r.mu.Unlock()
		for _, id := range ids {
			r.repair(ctx, id)
		}
	}
}

// repairTimeout bounds one look-up and apply.
const repairTimeout = 30 * time.Second

func (r *Repairer) repair(ctx context.Context, id string) {
	hp := r.host.Load()
	if hp == nil {
		return
	}
	ds, ok := (*hp).(sdk.DesiredStates)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, repairTimeout)
	defer cancel()
	start := time.Now()
	ch, err := ds.GetDesiredState(ctx, r.kind, id)
	if err != nil {
		r.log.Warn("on-demand repair: desired state lookup failed; the next resync repairs it", "kind", r.kind, "id", id, "error", err)
		return
	}
	unlock := r.Lock(id)
	defer unlock()
	r.mu.Lock()
	v, known := r.applied[id]
	r.mu.Unlock()
	if !known || ch.Deleted || ch.Version != v {
		// A delete or a newer version is on its way through the host, in
		// order; applying it here could overtake an older one still queued.
		r.skipped.Add(1)
		r.log.Debug("on-demand repair left to the host", "kind", r.kind, "id", id, "applied", v, "desired", ch.Version, "deleted", ch.Deleted)
		return
	}
	if err := r.apply(ctx, ch); err != nil {
		r.log.Warn("on-demand repair failed; the next resync retries it", "kind", r.kind, "id", id, "version", ch.Version, "error", err)
		return
	}
	r.repairs.Add(1)
	r.log.Info("changed by someone else: repaired from ctrl's desired state", "kind", r.kind, "id", id, "version", ch.Version, "took", time.Since(start))
}

// Apply is the whole of a repairing plugin's sdk.Controller Apply: it
// holds Lock(id) while apply runs, so a repair never interleaves with the
// host's Apply of the same object, and records what apply did (Applied;
// a Deleted result forgets the id), so a repair re-applies only the
// version the host delivered last. A failed apply records nothing: the
// host retries it, and until then a repair re-applies the previous
// version, which is what the cluster last held by right.
//
//	func (c *Controller) Apply(ctx context.Context, req *sdk.ApplyRequest) (*sdk.ApplyResponse, error) {
//		return c.repair.Apply(ctx, req, c.apply)
//	}
//
// apply is the same function the Repairer was made with, returning the
// result as well; it runs with the id's lock held and must not take it
// again.
func (r *Repairer) Apply(ctx context.Context, req *sdk.ApplyRequest, apply func(context.Context, sdk.Change) (sdk.Result, error)) (*sdk.ApplyResponse, error) {
	ch := req.Change
	unlock := r.Lock(ch.ID)
	defer unlock()
	res, err := apply(ctx, ch)
	if err == nil {
		r.Applied(ch.ID, ch.Version, res == sdk.Deleted)
	}
	return sdk.Done(res, err)
}

// Lock serialises work on one object id: the plugin's Apply of id, and
// this Repairer's repair of it. Call the returned func to unlock.
func (r *Repairer) Lock(id string) (unlock func()) { return r.locks.lock(id) }

// idLocks is a mutex per id; an entry lives only while someone holds or
// waits for it.
type idLocks struct {
	mu    sync.Mutex
	locks map[string]*idLock
}

type idLock struct {
	sync.Mutex
	refs int
}

func (k *idLocks) lock(id string) func() {
	k.mu.Lock()
	if k.locks == nil {
		k.locks = map[string]*idLock{}
	}
	l := k.locks[id]
	if l == nil {
		l = &idLock{}
		k.locks[id] = l
	}
	l.refs++
	k.mu.Unlock()
	l.Lock()
	return func() {
		l.Unlock()
		k.mu.Lock()
		if l.refs--; l.refs == 0 {
			delete(k.locks, id)
		}
		k.mu.Unlock()
	}
}
