package clusterapi

import (
	"context"
	"errors"
	"sync"
	"time"
)

// errQueueFull refuses items while a batcher's queue is full.
var errQueueFull = errors.New("the queue is full")

// batcher writes what every cluster that calls this ctrl sends (status
// reports, heartbeats) in shared transactions: callers queue their items,
// one loop takes whatever queued up — at most one batch every linger, so
// that under load one transaction carries the items of many clusters,
// while a lone item after a quiet spell goes at once — and answers each
// caller when the transaction that carried its items has committed (or
// failed). The queue is bounded, in items and in bytes: a caller whose
// items do not fit is
// refused at once (errQueueFull) and retries later, so a database that
// slows down makes the clusters wait instead of ctrl's memory grow.
type batcher[In, Out any] struct {
	write    func(context.Context, []In) ([]Out, error)
	linger   time.Duration
	maxBatch int
	capacity int
	// size weighs an item (its bytes): the queue holds at most
	// capacityBytes, a batch about batchBytes.
	size          func(In) int
	capacityBytes int
	observe       func(items int, took time.Duration, err error)
	// gauge is told the items queued and in flight whenever they change
	// (-1: unchanged).
	gauge func(queued, inFlight int)

	mu          sync.Mutex
	queue       []*batchJob[In, Out]
	queued      int // items in queue
	queuedBytes int
	closed      bool // run has returned
	wake        chan struct{}
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

func newBatcher[In, Out any](write func(context.Context, []In) ([]Out, error), linger time.Duration, maxBatch, capacity int,
	size func(In) int, capacityBytes int, observe func(int, time.Duration, error), gauge func(queued, inFlight int)) *batcher[In, Out] {
	return &batcher[In, Out]{write: write, linger: linger, maxBatch: maxBatch, capacity: capacity, size: size, capacityBytes: capacityBytes,
		observe: observe, gauge: gauge, wake: make(chan struct{}, 1)}
}

// batchBytes ends a batch early when its items weigh this much.
const batchBytes = 16 << 20

// add writes items in a shared transaction and returns their results
// once it committed; errQueueFull when the queue cannot take them.
func (in *batcher[In, Out]) add(ctx context.Context, items []In) ([]Out, error) {
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
	in.queue = append(in.queue, j)
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

// take removes the jobs of the next batch: whole jobs, up to maxBatch
// items and batchBytes (a larger job goes alone).
func (in *batcher[In, Out]) take() []*batchJob[In, Out] {
	in.mu.Lock()
	defer in.mu.Unlock()
	n, size, bytes := 0, 0, 0
	for n < len(in.queue) && (n == 0 || size+len(in.queue[n].items) <= in.maxBatch && bytes+in.queue[n].bytes <= batchBytes) {
		size += len(in.queue[n].items)
		bytes += in.queue[n].bytes
		n++
	}
	jobs := in.queue[:n:n]
	in.queue = in.queue[n:]
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
	jobs := in.queue
	in.queue, in.queued, in.queuedBytes, in.closed = nil, 0, 0, true
	in.mu.Unlock()
	for _, j := range jobs {
		j.err = err
		close(j.done)
	}
}
