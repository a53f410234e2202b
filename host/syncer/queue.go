package syncer

import (
	"container/heap"
	"context"
	"slices"
	"sync"
	"time"

	"krane.dev/sdk"
)

// taskKind says why a change is applied.
type taskKind int

const (
	fromStream taskKind = iota // a committed change, counted by the cursor
	repair                     // resync: re-apply current desired state, repairs drift
	collect                    // garbage collection of an object desired state no longer names
)

type task struct {
	change sdk.Change
	kind   taskKind
}

// object is the queue's state for one id.
type object struct {
	pending  *task // the newest desired state not yet started
	running  *task
	covered  []uint64 // stream versions folded into pending/running, not yet done
	applied  uint64   // newest version applied (or parked) for this id
	parked   *task    // permanent failure, retried slowly until a newer version comes
	attempts int
	retryAt  time.Time
	queued   bool
}

// queue orders a kind's applies; it keeps invariants 2 to 4 of the package
// documentation:
//   - one apply in flight per object, and only ever a newer version than the
//     last one applied or parked, so a stale apply never undoes a newer one;
//   - a newer change replaces an older pending or parked one (the latest
//     desired state is what matters, not every intermediate step);
//   - a parked object is not work: it never holds back the stream;
//   - Cursor() is the highest version V such that every stream change <= V
//     is applied or parked: restarting the stream from V loses nothing.
type queue struct {
	mu          sync.Mutex
	objects     map[string]*object
	ready       []string
	wake        chan struct{}
	outstanding versionHeap
	finished    map[uint64]bool // versions done but still in the heap (lazy removal)
	received    uint64
	streamed    uint64 // the current stream has delivered everything up to here
	busy        int    // objects with work other than a parked retry (invariant 3)
	parked      int    // objects whose latest change is parked
	capacity    chan struct{}
	backoff     Backoff
	parkBackoff Backoff
	maxAttempts int
	now         func() time.Time
}

func newQueue(retry, park Backoff, maxAttempts int) *queue {
	return &queue{
		objects:     map[string]*object{},
		wake:        make(chan struct{}, 1),
		finished:    map[uint64]bool{},
		capacity:    make(chan struct{}, 1),
		backoff:     retry,
		parkBackoff: park,
		maxAttempts: maxAttempts,
		now:         time.Now,
	}
}

// Add queues a change received from the stream (in version order).
func (q *queue) Add(ch sdk.Change) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.received = max(q.received, ch.Version)
	q.streamed = max(q.streamed, ch.Version)
	o := q.object(ch.ID)
	defer q.track(o)()
	if ch.Version <= o.applied || slices.Contains(o.covered, ch.Version) {
		return // replayed after a reconnect: already applied, parked or queued
	}
	heap.Push(&q.outstanding, ch.Version)
	o.covered = append(o.covered, ch.Version)
	if t := o.newest(); t != nil && t.change.Version >= ch.Version {
		// A resync listed this state (or a newer one) before the stream
		// delivered it, and its repair is queued or running: the repair
		// carries the change, and the cursor waits for it.
		return
	}
	q.setPending(o, &task{change: ch, kind: fromStream})
	o.parked = nil // a newer version replaces the parked one
	o.attempts = 0
	o.retryAt = time.Time{}
	q.schedule(ch.ID, o)
}

// Repair queues the current desired state from a resync, unless something
// newer is already applied, pending or running. A parked object is
// retried now with it, instead of after its long park backoff: "retried
// with backoff and at resync" (invariant 3).
func (q *queue) Repair(ch sdk.Change) { q.offer(ch, repair) }

// Collect queues the deletion of an object no longer desired as of version
// ch.Version, unless it was applied at a later version since.
func (q *queue) Collect(ch sdk.Change) { q.offer(ch, collect) }

func (q *queue) offer(ch sdk.Change, kind taskKind) {
	q.mu.Lock()
	defer q.mu.Unlock()
	o := q.object(ch.ID)
	defer q.track(o)()
	if ch.Version < o.applied || o.running != nil || (o.pending != nil && o.pending != o.parked) {
		return
	}
	// Either nothing is queued, or only the parked change's slow retry:
	// this task takes its place and runs now. If it fails for good as well
	// it is parked in its turn.
	q.setPending(o, &task{change: ch, kind: kind})
	o.retryAt = time.Time{}
	q.schedule(ch.ID, o)
}

// MarkReceived records that the stream has delivered everything up to v
// (a bootstrap's max version).
func (q *queue) MarkReceived(v uint64) {
	q.mu.Lock()
	q.received = max(q.received, v)
	q.streamed = max(q.streamed, v)
	q.mu.Unlock()
}

// Cursor is the committed cursor (invariant 4).
func (q *queue) Cursor() uint64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	for q.outstanding.Len() > 0 && q.finished[q.outstanding[0]] {
		delete(q.finished, heap.Pop(&q.outstanding).(uint64))
	}
	if q.outstanding.Len() == 0 {
		return q.received
	}
	return q.outstanding[0] - 1
}

// Applied returns the newest version applied for id (0 if none).
func (q *queue) Applied(id string) (applied uint64, busy bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	o, ok := q.objects[id]
	if !ok {
		return 0, false
	}
	return o.applied, o.pending != nil || o.running != nil
}

// Holds reports whether the queue has work for id or holds it parked.
func (q *queue) Holds(id string) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.holdsLocked(id)
}

func (q *queue) holdsLocked(id string) bool {
	o, ok := q.objects[id]
	return ok && (o.pending != nil || o.running != nil || o.parked != nil)
}

// Parked counts objects whose latest change failed permanently.
func (q *queue) Parked() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.parked
}

// Resume records that a new stream resumes after version v: it may replay
// every change above v, including some the queue has finished since.
func (q *queue) Resume(v uint64) {
	q.mu.Lock()
	q.streamed = v
	q.mu.Unlock()
}

// Forget drops the entries of objects that are finished at or below floor:
// nothing queued, running or parked, and their last change applied at a
// version <= floor. Without it the map holds every id ever seen.
//
// What an entry remembers is its applied version, which keeps older
// changes from undoing newer ones. Once that version is <= floor, no older
// change can come, provided that floor is at most what the current stream
// has delivered (it delivers in version order, so it replays nothing below
// that; the floor is lowered to it here) and that every resync listing whose repairs may still come started
// after the cursor reached floor (each object is listed at a version >= the
// one applied). So the caller passes the cursor read before such a listing.
func (q *queue) Forget(floor uint64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	floor = min(floor, q.streamed)
	for id, o := range q.objects {
		if o.pending == nil && o.running == nil && o.parked == nil && len(o.covered) == 0 && !o.queued && o.applied <= floor {
			delete(q.objects, id)
		}
	}
}

// WaitCapacity blocks while max objects have work queued, so the stream
// is read no faster than changes are applied. A change of an object the
// queue already holds never waits: it replaces what is queued and adds no
// object, and it may be the very change that unparks it.
func (q *queue) WaitCapacity(ctx context.Context, id string, max int) error {
	for {
		q.mu.Lock()
		holds, busy := q.holdsLocked(id), q.busy
		q.mu.Unlock()
		if holds || busy < max {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-q.capacity:
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Next blocks until a task is ready, and marks it running.
func (q *queue) Next(ctx context.Context) (*task, error) {
	for {
		q.mu.Lock()
		for len(q.ready) > 0 {
			id := q.ready[0]
			q.ready = q.ready[1:]
			o := q.objects[id]
			o.queued = false
			if o.running != nil || o.pending == nil {
				continue
			}
			o.running, o.pending = o.pending, nil
			t := o.running
			if len(q.ready) > 0 {
				q.signal()
			}
			q.mu.Unlock()
			return t, nil
		}
		q.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-q.wake:
		}
	}
}

// outcome of one apply.
type outcome int

const (
	succeeded outcome = iota
	retryable
	permanent
)

// Done records the outcome of a task returned by Next and reports whether
// the object is now parked.
func (q *queue) Done(t *task, out outcome) (parked bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	id := t.change.ID
	o := q.objects[id]
	defer q.track(o)()
	o.running = nil
	v := t.change.Version
	switch out {
	case succeeded:
		if v > o.applied {
			o.applied = v
		}
		q.finish(o, v)
		o.parked, o.attempts = nil, 0
	case retryable:
		o.attempts++
		if o.pending != nil {
			break // a newer change supersedes this one; it will cover v
		}
		if o.attempts < q.maxAttempts {
			q.setPending(o, t)
			o.retryAt = q.now().Add(q.backoff.Delay(o.attempts))
			break
		}
		fallthrough // retried long enough: park it so the cursor moves on
	case permanent:
		if out == permanent {
			o.attempts++
		}
		if v > o.applied {
			o.applied = v
		}
		q.finish(o, v)
		o.parked = t
		if o.pending == nil {
			// Parked changes are retried, slowly, in case the failure was
			// not forever after all (a namespace appeared, a quota grew).
			q.setPending(o, t)
			o.retryAt = q.now().Add(q.parkBackoff.Delay(o.attempts))
		}
		parked = true
	}
	q.schedule(id, o)
	return parked
}

func (q *queue) object(id string) *object {
	o, ok := q.objects[id]
	if !ok {
		o = &object{}
		q.objects[id] = o
	}
	return o
}

func (q *queue) setPending(o *object, t *task) { o.pending = t }

// track keeps the counts of objects with work (for WaitCapacity) and of
// parked objects: call it before changing o and run the returned func
// after. A parked object waiting for its slow retry is not work: counted,
// a few parked objects would stop the stream (invariant 3).
func (q *queue) track(o *object) func() {
	before, wasParked := o.active(), o.parked != nil
	return func() {
		after, isParked := o.active(), o.parked != nil
		switch {
		case after && !before:
			q.busy++
		case before && !after:
			q.busy--
			select {
			case q.capacity <- struct{}{}:
			default:
			}
		}
		switch {
		case isParked && !wasParked:
			q.parked++
		case wasParked && !isParked:
			q.parked--
		}
	}
}

// newest is o's newest task queued or running, if any.
func (o *object) newest() *task {
	switch {
	case o.pending != nil && o.pending != o.parked:
		return o.pending
	case o.running != nil:
		return o.running
	}
	return nil
}

// active reports whether o has work other than the slow retry of a parked
// change.
func (o *object) active() bool {
	return o.running != nil || (o.pending != nil && o.pending != o.parked)
}

// finish marks o's stream versions <= v done.
func (q *queue) finish(o *object, v uint64) {
	kept := o.covered[:0]
	for _, c := range o.covered {
		if c <= v {
			q.finished[c] = true
		} else {
			kept = append(kept, c)
		}
	}
	o.covered = kept
}

func (q *queue) schedule(id string, o *object) {
	if o.queued || o.running != nil || o.pending == nil {
		return
	}
	if wait := o.retryAt.Sub(q.now()); wait > 0 {
		due := o.retryAt
		time.AfterFunc(wait, func() {
			q.mu.Lock()
			defer q.mu.Unlock()
			if o.retryAt.Equal(due) {
				o.retryAt = time.Time{}
				q.schedule(id, o)
			}
		})
		return
	}
	o.queued = true
	q.ready = append(q.ready, id)
	q.signal()
}

func (q *queue) signal() {
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// versionHeap is a min-heap of versions.
type versionHeap []uint64

func (h versionHeap) Len() int           { return len(h) }
func (h versionHeap) Less(i, j int) bool { return h[i] < h[j] }
func (h versionHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *versionHeap) Push(x any)        { *h = append(*h, x.(uint64)) }
func (h *versionHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
