package clusterapi

import (
	"context"
	"errors"
	"sync"
	"time"
)

// errQueueFull refuses items while a batcher's queue is full;
// errShareFull refuses a cluster's items while its share of it is.
var (
	errQueueFull = errors.New("the queue is full")
	errShareFull = errors.New("this cluster's share of the queue is full")
)

// batcher writes what every cluster that calls this ctrl sends (status
// reports, heartbeats) in shared transactions: callers queue their items,
// one loop takes whatever queued up — at most one batch every linger, so
// that under load one transaction carries the items of many clusters,
// while a lone item after a quiet spell goes at once — and answers each
// caller when the transaction that carried its items has committed (or
// failed). The queue is bounded, in items and in bytes: a caller whose
// items do not fit is refused at once (errQueueFull) and retries later, so
// a database that slows down makes the clusters wait instead of ctrl's
// memory grow.
//
// The queue is shared by every cluster, so no one cluster may take more
// than its share of it (perKey items, perKeyBytes bytes; errShareFull):
// a cluster sending many calls at once while the database is slow fills
// its share and is told to wait, while the others' calls still fit. And a
// batch takes one call of each waiting cluster in turn (round robin, from
// where the last batch stopped), so a cluster with many calls queued
// does not delay the others' behind all of its own.
type batcher[In, Out any] struct {
	write    func(context.Context, []In) ([]Out, error)
	linger   time.Duration
	maxBatch int
	capacity int
	// size weighs an item (its bytes): the queue holds at most
	// capacityBytes, a batch about batchBytes.
	size          func(In) int
	capacityBytes int
	perKey        int
	perKeyBytes   int
	observe       func(items int, took time.Duration, err error)
	// gauge is told the items queued and in flight whenever they change
	// (-1: unchanged).
	gauge func(queued, inFlight int)

	mu          sync.Mutex
	byKey       map[string]*keyQueue[In, Out]
	turn        []string // keys with jobs waiting, in the order a batch takes them
	queued      int      // items waiting
	queuedBytes int
	closed      bool // run has returned
	wake        chan struct{}
}

// keyQueue is one key's (cluster's) waiting jobs.
type keyQueue[In, Out any] struct {
	jobs         []*batchJob[In, Out]
	items, bytes int
}

// errStopping refuses items once the batcher has stopped.
var errStopping = errors.New("ctrl is stopping")

// batchJob is one caller's items and, once done is closed, their
// results.
type batchJob[In, Out any] struct {
	items   []In
	bytes   int
	results []Out
	err     error
	done    chan struct{}
}

// newBatcher makes a batcher; one key may hold at most perKey of its
// capacity items and perKey/capacity of its bytes.
func newBatcher[In, Out any](write func(context.Context, []In) ([]Out, error), linger time.Duration, maxBatch, capacity, perKey int,
	size func(In) int, capacityBytes int, observe func(int, time.Duration, error), gauge func(queued, inFlight int)) *batcher[In, Out] {
	perKey = min(max(perKey, 1), capacity)
	return &batcher[In, Out]{write: write, linger: linger, maxBatch: maxBatch, capacity: capacity, size: size, capacityBytes: capacityBytes,
		perKey: perKey, perKeyBytes: int(int64(capacityBytes) * int64(perKey) / int64(capacity)),
		observe: observe, gauge: gauge, byKey: map[string]*keyQueue[In, Out]{}, wake: make(chan struct{}, 1)}
}

// batchBytes ends a batch early when its items weigh this much.
const batchBytes = 16 << 20

// add writes key's items (key: the calling cluster) in a shared
// transaction and returns their results once it committed; errQueueFull
// when the queue cannot take them, errShareFull when key's share cannot. A
// key with nothing waiting always gets one call in (its items may exceed
// its share alone), so a large call is delayed, never refused forever.
func (in *batcher[In, Out]) add(ctx context.Context, key string, items []In) ([]Out, error) {
	if len(items) == 0 {
		return nil, nil
	}
	j := &batchJob[In, Out]{items: items, done: make(chan struct{})}
	for _, it := range items {
		j.bytes += in.size(it)
	}
	in.mu.Lock()
	if in.closed {
		in.mu.Unlock()
		return nil, errStopping
	}
	if in.queued > 0 && (in.queued+len(items) > in.capacity || in.queuedBytes+j.bytes > in.capacityBytes) {
		in.mu.Unlock()
		return nil, errQueueFull
	}
	q := in.byKey[key]
	if q == nil {
		q = &keyQueue[In, Out]{}
		in.byKey[key] = q
		in.turn = append(in.turn, key)
	} else if q.items+len(items) > in.perKey || q.bytes+j.bytes > in.perKeyBytes {
		in.mu.Unlock()
		return nil, errShareFull
	}
	q.jobs = append(q.jobs, j)
	q.items += len(items)
	q.bytes += j.bytes
	in.queued += len(items)
	in.queuedBytes += j.bytes
	in.gauge(in.queued, -1)
	in.mu.Unlock()
	select {
	case in.wake <- struct{}{}:
	default:
	}
	select {
	case <-j.done:
		return j.results, j.err
	case <-ctx.Done():
		// The items are still written with their batch; the caller,
		// gone, sends them again, which is harmless.
		return nil, ctx.Err()
	}
}

// depth is the number of items waiting.
func (in *batcher[In, Out]) depth() int {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.queued
}

// run stores batches until ctx ends; queued jobs then fail with ctx's
// error.
func (in *batcher[In, Out]) run(ctx context.Context) {
	var last time.Time
	for {
		select {
		case <-ctx.Done():
			in.failAll(ctx.Err())
			return
		case <-in.wake:
		}
		for {
			// Let items gather: one transaction per linger at most.
			if wait := in.linger - time.Since(last); wait > 0 {
				t := time.NewTimer(wait)
				select {
				case <-ctx.Done():
					t.Stop()
					in.failAll(ctx.Err())
					return
				case <-t.C:
				}
			}
			jobs := in.take()
			if len(jobs) == 0 {
				break
			}
			last = time.Now()
			in.flush(ctx, jobs)
		}
	}
}

// take removes the jobs of the next batch, one job of each waiting key in
// turn: whole jobs, up to maxBatch items and batchBytes (a larger job goes
// alone).
func (in *batcher[In, Out]) take() []*batchJob[In, Out] {
	in.mu.Lock()
	defer in.mu.Unlock()
	var jobs []*batchJob[In, Out]
	size, bytes := 0, 0
	for len(in.turn) > 0 {
		key := in.turn[0]
		q := in.byKey[key]
		j := q.jobs[0]
		if len(jobs) > 0 && (size+len(j.items) > in.maxBatch || bytes+j.bytes > batchBytes) {
			break
		}
		jobs = append(jobs, j)
		size += len(j.items)
		bytes += j.bytes
		q.jobs[0] = nil
		q.jobs = q.jobs[1:]
		q.items -= len(j.items)
		q.bytes -= j.bytes
		in.turn = in.turn[1:]
		if len(q.jobs) > 0 {
			in.turn = append(in.turn, key) // its next job waits for the others' turn
		} else {
			delete(in.byKey, key)
		}
	}
	in.queued -= size
	in.queuedBytes -= bytes
	in.gauge(in.queued, size)
	return jobs
}

// flush writes one batch and answers its callers. A ctrl stopping lets
// the batch in flight finish.
func (in *batcher[In, Out]) flush(ctx context.Context, jobs []*batchJob[In, Out]) {
	var all []In
	for _, j := range jobs {
		all = append(all, j.items...)
	}
	begin := time.Now()
	results, err := in.write(context.WithoutCancel(ctx), all)
	in.observe(len(all), time.Since(begin), err)
	in.gauge(-1, 0)
	off := 0
	for _, j := range jobs {
		if err != nil {
			j.err = err
		} else {
			j.results = results[off : off+len(j.items)]
		}
		off += len(j.items)
		close(j.done)
	}
}

func (in *batcher[In, Out]) failAll(err error) {
	in.mu.Lock()
	var jobs []*batchJob[In, Out]
	for _, q := range in.byKey {
		jobs = append(jobs, q.jobs...)
	}
	in.byKey, in.turn, in.queued, in.queuedBytes, in.closed = map[string]*keyQueue[In, Out]{}, nil, 0, 0, true
	in.mu.Unlock()
	for _, j := range jobs {
		j.err = err
		close(j.done)
	}
}
