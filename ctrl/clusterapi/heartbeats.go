package clusterapi

import (
	"context"
	"errors"
	"sync"
	"time"

	"krane.dev/ctrl/store"
)

// beatWriter stores heartbeats apart from the status reports: they are
// tiny, and they decide which clusters are live, so no amount of reports
// waiting for the database may refuse or delay one.
//
//   - It holds at most one heartbeat per cluster: a cluster's heartbeat
//     replaces its earlier one still waiting (the later one says all the
//     earlier said), and both callers are answered by the write of the
//     later. Its size is bounded by the number of clusters, not by a
//     queue that reports could fill, so it refuses nothing.
//   - One write per linger stores every waiting heartbeat
//     (store.HeartbeatsUnlessBusy), and never waits for a row lock: a
//     cluster whose row a report batch of that cluster holds is answered
//     at once (its reports being stored show it alive), and its heartbeat
//     stays for the next write unless a later one replaced it.
type beatWriter struct {
	write    func(context.Context, []store.ClusterHeartbeat) ([]error, error)
	linger   time.Duration
	maxBatch int
	observe  func(items int, took time.Duration, err error)
	gauge    func(queued, inFlight int)
	deferred func(n int)

	mu      sync.Mutex
	pending map[string]*beat // by cluster; not yet taken by a write
	order   []string         // pending's clusters, oldest first
	closed  bool
	wake    chan struct{}
}

// beat is one cluster's newest waiting heartbeat and the callers that
// wait for its write (done closes once err is set).
type beat struct {
	hb   store.ClusterHeartbeat
	done chan struct{}
	err  error
}

func newBeatWriter(write func(context.Context, []store.ClusterHeartbeat) ([]error, error), linger time.Duration, maxBatch int,
	observe func(int, time.Duration, error), gauge func(queued, inFlight int), deferred func(int)) *beatWriter {
	return &beatWriter{write: write, linger: linger, maxBatch: maxBatch, observe: observe, gauge: gauge, deferred: deferred,
		pending: map[string]*beat{}, wake: make(chan struct{}, 1)}
}

// add stores hb with the next write and returns its outcome: nil (stored,
// or deferred because the cluster's row is busy with its reports),
// store.ErrNotFound for a cluster not registered in its region, or the
// write's error.
func (w *beatWriter) add(ctx context.Context, hb store.ClusterHeartbeat) error {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return errStopping
	}
	b := w.pending[hb.ClusterID]
	if b == nil {
		b = &beat{done: make(chan struct{})}
		w.pending[hb.ClusterID] = b
		w.order = append(w.order, hb.ClusterID)
	}
	b.hb = hb
	w.gauge(len(w.pending), -1)
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
	select {
	case <-b.done:
		return b.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// depth is the number of clusters whose heartbeat waits.
func (w *beatWriter) depth() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.pending)
}

// run writes heartbeats until ctx ends; those waiting then fail with
// ctx's error.
func (w *beatWriter) run(ctx context.Context) {
	var last time.Time
	for {
		select {
		case <-ctx.Done():
			w.failAll(ctx.Err())
			return
		case <-w.wake:
		}
		for {
			if wait := w.linger - time.Since(last); wait > 0 {
				t := time.NewTimer(wait)
				select {
				case <-ctx.Done():
					t.Stop()
					w.failAll(ctx.Err())
					return
				case <-t.C:
				}
			}
			batch := w.take()
			if len(batch) == 0 {
				break
			}
			last = time.Now()
			w.flush(ctx, batch)
		}
	}
}

// take removes up to maxBatch waiting heartbeats, oldest first.
func (w *beatWriter) take() []*beat {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := min(len(w.order), w.maxBatch)
	batch := make([]*beat, 0, n)
	for _, id := range w.order[:n] {
		batch = append(batch, w.pending[id])
		delete(w.pending, id)
	}
	w.order = w.order[n:]
	w.gauge(len(w.pending), len(batch))
	return batch
}

// flush writes one batch and answers its callers. A heartbeat deferred
// for a busy row goes back to wait for the next write, unless its
// cluster sent a later one meanwhile (which replaces it).
func (w *beatWriter) flush(ctx context.Context, batch []*beat) {
	hbs := make([]store.ClusterHeartbeat, len(batch))
	for i, b := range batch {
		hbs[i] = b.hb
	}
	begin := time.Now()
	results, err := w.write(context.WithoutCancel(ctx), hbs)
	w.observe(len(hbs), time.Since(begin), err)
	again := 0
	w.mu.Lock()
	for i, b := range batch {
		switch {
		case err != nil:
			b.err = err
		case errors.Is(results[i], store.ErrClusterBusy):
			if _, later := w.pending[b.hb.ClusterID]; !later && !w.closed {
				w.pending[b.hb.ClusterID] = &beat{hb: b.hb, done: make(chan struct{})}
				w.order = append(w.order, b.hb.ClusterID)
				again++
			}
		default:
			b.err = results[i]
		}
		close(b.done)
	}
	w.gauge(len(w.pending), 0)
	w.mu.Unlock()
	if again > 0 {
		w.deferred(again)
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}
}

func (w *beatWriter) failAll(err error) {
	w.mu.Lock()
	pending := w.pending
	w.pending, w.order, w.closed = map[string]*beat{}, nil, true
	w.mu.Unlock()
	for _, b := range pending {
		b.err = err
		close(b.done)
	}
}
