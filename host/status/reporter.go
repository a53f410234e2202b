// Package status forwards what plugins observe in the cluster (and apply
// failures) to ctrl. Reports are coalesced per object (the latest wins,
// keeping an apply failure not yet sent), held in a bounded buffer, sent
// in batches (one ReportStatuses call for what queued up; ctrl stores the
// batches of many clusters in one transaction), retried with backoff
// behind a circuit breaker, and never block applying: a ctrl outage only
// delays them. When ctrl's report queue is full it answers
// RESOURCE_EXHAUSTED with a RetryInfo: the reporter then pauses every
// send for that long (plus jitter, so a fleet does not come back at
// once), without counting it against ctrl's health, and what it could not
// send stays queued and keeps coalescing.
package status

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/timestamppb"

	clusterv1 "krane.dev/proto/krane/cluster/v1"
	"krane.dev/sdk"
)

// Batching: a report waits at most linger for others to share its call,
// and a call carries at most maxBatch reports or about maxBatchBytes.
// Fifty milliseconds is nothing next to a pod starting, and under a
// bootstrap's thousands of reports it turns a call per object into a call
// per hundred.
const (
	linger        = 50 * time.Millisecond
	maxBatch      = 200
	maxBatchBytes = 1 << 20
)

type key struct{ kind, id string }

type entry struct {
	key       key
	req       *clusterv1.ReportStatusRequest
	queuedAt  time.Time
	attempts  int
	notBefore time.Time
}

// Reporter sends status reports to ctrl.
type Reporter struct {
	client  clusterv1.ClusterServiceClient
	log     hclog.Logger
	max     int
	timeout time.Duration

	mu        sync.Mutex
	pending   map[key]*entry
	order     []key // FIFO of keys in pending (a key appears once)
	failed    map[key]uint64
	wake      chan struct{}
	breaker   breaker
	unbatched bool // ctrl predates ReportStatuses: send one by one

	depth     prometheus.Gauge
	sent      *prometheus.CounterVec
	dropped   prometheus.Counter
	calls     prometheus.Counter
	throttled prometheus.Counter
}

// New returns a reporter holding at most max objects' reports.
func New(client clusterv1.ClusterServiceClient, log hclog.Logger, reg prometheus.Registerer, max int) *Reporter {
	r := &Reporter{
		client: client, log: log, max: max, timeout: 10 * time.Second,
		pending: map[key]*entry{}, failed: map[key]uint64{}, wake: make(chan struct{}, 1),
		breaker: breaker{threshold: 5, minOpen: time.Second, maxOpen: time.Minute},
		depth:   prometheus.NewGauge(prometheus.GaugeOpts{Name: "krane_host_report_queue_depth", Help: "Objects with a status report waiting to be sent."}),
		sent:    prometheus.NewCounterVec(prometheus.CounterOpts{Name: "krane_host_reports_total", Help: "Status reports sent to ctrl, by result (ok, error: sent again later, rejected: refused by ctrl as unknown or malformed, dropped)."}, []string{"result"}),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{Name: "krane_host_reports_dropped_total", Help: "Reports dropped because the buffer was full (the oldest goes)."}),
		calls:   prometheus.NewCounter(prometheus.CounterOpts{Name: "krane_host_report_calls_total", Help: "Calls to ctrl carrying status reports (a batch is one call)."}),
		throttled: prometheus.NewCounter(prometheus.CounterOpts{Name: "krane_host_report_throttled_total",
			Help: "Report calls ctrl refused because its report queue was full (sent again after its hint)."}),
	}
	reg.MustRegister(r.depth, r.sent, r.dropped, r.calls, r.throttled)
	return r
}

// SetClient points the reporter at a new ctrl connection (after a reload
// changed it); queued reports are kept.
func (r *Reporter) SetClient(c clusterv1.ClusterServiceClient) {
	r.mu.Lock()
	r.client = c
	r.mu.Unlock()
}

// Submit queues a plugin's report, replacing an older one for the object.
func (r *Reporter) Submit(rep sdk.StatusReport) {
	req := &clusterv1.ReportStatusRequest{Kind: rep.Kind, Id: rep.ID, ObservedVersion: rep.ObservedVersion, ObservedAt: timestamppb.New(rep.ObservedAt)}
	if a, ok := rep.Status.(*anypb.Any); ok {
		req.Status = a
	} else if rep.Status != nil {
		a, err := anypb.New(rep.Status)
		if err != nil {
			r.log.Error("cannot pack status report; dropping it", "kind", rep.Kind, "id", rep.ID, "error", err)
			return
		}
		req.Status = a
	}
	r.put(key{rep.Kind, rep.ID}, func(old *clusterv1.ReportStatusRequest) *clusterv1.ReportStatusRequest {
		if old != nil {
			req.ApplyError = old.ApplyError // keep an unsent failure
		}
		return req
	})
}

// ApplyFailed reports a parked change upstream.
func (r *Reporter) ApplyFailed(kind, id string, version uint64, err error) {
	k := key{kind, id}
	ae := &clusterv1.ApplyError{Version: version, Message: err.Error(), Permanent: sdk.IsPermanent(err)}
	var pe *sdk.PermanentError
	if errors.As(err, &pe) {
		ae.Field = pe.Field
	}
	r.mu.Lock()
	r.failed[k] = version
	r.mu.Unlock()
	r.put(k, func(old *clusterv1.ReportStatusRequest) *clusterv1.ReportStatusRequest {
		if old == nil {
			old = &clusterv1.ReportStatusRequest{Kind: kind, Id: id, ObservedVersion: version, ObservedAt: timestamppb.Now()}
		}
		old.ApplyError = ae
		return old
	})
}

// ApplyRecovered clears a reported failure once a later apply succeeded
// (or desired state no longer names the object). A recovery older than
// the failure is stale and ignored.
func (r *Reporter) ApplyRecovered(kind, id string, version uint64) {
	k := key{kind, id}
	r.mu.Lock()
	failedAt, had := r.failed[k]
	if had && version >= failedAt {
		delete(r.failed, k)
	}
	r.mu.Unlock()
	if !had || version < failedAt {
		return
	}
	r.put(k, func(old *clusterv1.ReportStatusRequest) *clusterv1.ReportStatusRequest {
		if old == nil {
			old = &clusterv1.ReportStatusRequest{Kind: kind, Id: id, ObservedVersion: version, ObservedAt: timestamppb.Now()}
		}
		old.ApplyError = &clusterv1.ApplyError{Version: version}
		return old
	})
}

// Failing lists the objects of kind with a failure reported and not
// cleared.
func (r *Reporter) Failing(kind string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var ids []string
	for k := range r.failed {
		if k.kind == kind {
			ids = append(ids, k.id)
		}
	}
	return ids
}

func (r *Reporter) put(k key, merge func(*clusterv1.ReportStatusRequest) *clusterv1.ReportStatusRequest) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if e, ok := r.pending[k]; ok {
		e.req = merge(e.req)
		e.attempts, e.notBefore = 0, time.Time{}
	} else {
		if len(r.pending) >= r.max {
			oldest := r.order[0]
			r.order = r.order[1:]
			delete(r.pending, oldest)
			r.dropped.Inc()
		}
		r.pending[k] = &entry{key: k, req: merge(nil), queuedAt: time.Now()}
		r.order = append(r.order, k)
	}
	r.depth.Set(float64(len(r.pending)))
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// Depth is the number of objects with a report waiting.
func (r *Reporter) Depth() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.pending)
}

// Run sends reports with n concurrent senders until ctx ends.
func (r *Reporter) Run(ctx context.Context, n int) {
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.send(ctx)
		}()
	}
	wg.Wait()
}

func (r *Reporter) send(ctx context.Context) {
	for {
		if wait := r.breaker.wait(time.Now()); wait > 0 {
			if !sleep(ctx, wait) {
				return
			}
			continue
		}
		batch, wait, lingering := r.take(time.Now(), false)
		if len(batch) == 0 {
			// Nothing was sent, so a probe slot taken above must be given
			// back: otherwise the breaker waits for a probe that never ends
			// and reports stay paused after ctrl recovers.
			r.breaker.release()
			if lingering {
				// Reports are waiting for company: new ones need not wake
				// us (each wake-up would scan the queue again).
				if !sleep(ctx, wait) {
					return
				}
				continue
			}
			select {
			case <-ctx.Done():
				return
			case <-r.wake:
			case <-time.After(wait):
			}
			continue
		}
		again, err := r.deliver(ctx, batch)
		if err == nil {
			r.breaker.success()
			r.retry(again)
			continue
		}
		if ctx.Err() != nil {
			// Stopped mid-call (a reload, a shutdown): the batch goes back
			// as it was, to be sent on the next connection or by Flush.
			r.breaker.release()
			r.putBack(again)
			return
		}
		if wait, ok := retryAfter(err); ok {
			// ctrl sheds load: every sender waits, nothing is dropped.
			wait += time.Duration(rand.Int64N(int64(wait/2) + 1))
			r.breaker.pause(time.Now().Add(wait))
			r.throttled.Inc()
			r.log.Debug("ctrl's report queue is full; pausing reports", "for", wait, "queued", r.Depth()+len(again))
			r.putBack(again)
			continue
		}
		if r.breaker.failure(time.Now()) {
			r.log.Warn("ctrl is not accepting status reports; pausing reports (applying continues)", "error", err, "queued", r.Depth()+len(again))
		}
		r.retry(again)
	}
}

// deliver sends a batch. It returns the entries to send again and, when
// the call failed as a whole, its error. A report ctrl refuses on its own
// (an object it does not know, a malformed status) is dropped: sending it
// again cannot help.
func (r *Reporter) deliver(ctx context.Context, batch []*entry) ([]*entry, error) {
	r.mu.Lock()
	client, unbatched := r.client, r.unbatched
	r.mu.Unlock()
	if !unbatched {
		req := &clusterv1.ReportStatusesRequest{Reports: make([]*clusterv1.ReportStatusRequest, len(batch))}
		for i, e := range batch {
			req.Reports[i] = e.req
		}
		cctx, cancel := context.WithTimeout(ctx, r.timeout)
		resp, err := client.ReportStatuses(cctx, req)
		cancel()
		r.calls.Inc()
		switch {
		case status.Code(err) == codes.Unimplemented:
			r.log.Info("ctrl does not take batched status reports (it is older than this host); sending them one by one")
			r.mu.Lock()
			r.unbatched = true
			r.mu.Unlock()
		case err != nil:
			r.sent.WithLabelValues("error").Add(float64(len(batch)))
			return batch, err
		case len(resp.GetResults()) != len(batch):
			r.sent.WithLabelValues("error").Add(float64(len(batch)))
			return batch, fmt.Errorf("ctrl answered %d results for %d status reports", len(resp.GetResults()), len(batch))
		default:
			var again []*entry
			for i, res := range resp.GetResults() {
				if e := r.judge(batch[i], status.Error(codes.Code(res.GetCode()), res.GetMessage())); e != nil {
					again = append(again, e)
				}
			}
			return again, nil
		}
	}
	for i, e := range batch {
		cctx, cancel := context.WithTimeout(ctx, r.timeout)
		_, err := client.ReportStatus(cctx, e.req)
		cancel()
		r.calls.Inc()
		if c := status.Code(err); c != codes.OK && c != codes.NotFound && c != codes.InvalidArgument {
			r.sent.WithLabelValues("error").Add(float64(len(batch) - i))
			return batch[i:], err
		}
		r.judge(e, err)
	}
	return nil, nil
}

// judge counts one report's outcome; it returns the entry when it must be
// sent again.
func (r *Reporter) judge(e *entry, err error) *entry {
	switch status.Code(err) {
	case codes.OK:
		r.sent.WithLabelValues("ok").Inc()
		return nil
	case codes.NotFound, codes.InvalidArgument:
		r.sent.WithLabelValues("rejected").Inc()
		r.log.Warn("ctrl refused a status report; dropping it", "kind", e.key.kind, "id", e.key.id,
			"observed_version", e.req.GetObservedVersion(), "error", status.Convert(err).Message())
		return nil
	default:
		r.sent.WithLabelValues("error").Inc()
		return e
	}
}

// take removes the oldest due entries, up to a batch, once the oldest of
// them has lingered long enough or the batch is full. With nothing to send
// it returns how long to wait, and whether reports are lingering. With
// flush, every entry is due and none lingers.
func (r *Reporter) take(now time.Time, flush bool) ([]*entry, time.Duration, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	wait := time.Second
	var due []int // positions in r.order
	size := 0
	for i, k := range r.order {
		e := r.pending[k]
		if !flush && e.notBefore.After(now) {
			wait = min(wait, e.notBefore.Sub(now))
			continue
		}
		n := proto.Size(e.req)
		if len(due) == maxBatch || (len(due) > 0 && size+n > maxBatchBytes) {
			size = maxBatchBytes // full
			break
		}
		size += n
		due = append(due, i)
	}
	if len(due) == 0 {
		return nil, wait, false
	}
	if waited := now.Sub(r.pending[r.order[due[0]]].queuedAt); !flush && len(due) < maxBatch && size < maxBatchBytes && waited < linger {
		return nil, min(wait, linger-waited), true
	}
	batch := make([]*entry, len(due))
	for j, i := range due {
		batch[j] = r.pending[r.order[i]]
		delete(r.pending, r.order[i])
	}
	if due[len(due)-1] == len(due)-1 {
		// The common case, a prefix: no copying.
		r.order = r.order[len(due):]
	} else {
		kept := r.order[:due[0]]
		next := 0
		for i := due[0]; i < len(r.order); i++ {
			if next < len(due) && due[next] == i {
				next++
				continue
			}
			kept = append(kept, r.order[i])
		}
		r.order = kept
	}
	r.depth.Set(float64(len(r.pending)))
	return batch, 0, false
}

// putBack returns entries taken for a call that did not happen or was cut
// short, at the head of the queue and without a retry delay, each unless
// a newer report for its object arrived meanwhile.
func (r *Reporter) putBack(entries []*entry) {
	if len(entries) == 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	var keys []key
	for _, e := range entries {
		if n, newer := r.pending[e.key]; newer {
			keepFailure(n, e)
			continue
		}
		r.pending[e.key] = e
		keys = append(keys, e.key)
	}
	r.order = append(keys, r.order...)
	r.depth.Set(float64(len(r.pending)))
}

// Flush sends every queued report now, in batches, until none is left or
// ctx ends, and returns how many are left. A graceful shutdown calls it
// after Run has stopped, so that what the plugins last reported is not
// lost with the process.
func (r *Reporter) Flush(ctx context.Context) (left int, err error) {
	for {
		batch, _, _ := r.take(time.Now(), true)
		if len(batch) == 0 {
			return 0, nil
		}
		again, err := r.deliver(ctx, batch)
		r.putBack(again)
		if err == nil && len(again) > 0 {
			err = fmt.Errorf("ctrl refused %d status reports for now", len(again))
		}
		if err != nil {
			return r.Depth(), err
		}
	}
}

// retry puts failed reports back, each unless a newer one arrived
// meanwhile, after a backoff that grows with its attempts.
func (r *Reporter) retry(entries []*entry) {
	if len(entries) == 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	for _, e := range entries {
		if n, newer := r.pending[e.key]; newer {
			keepFailure(n, e)
			continue
		}
		e.attempts++
		e.notBefore = now.Add(time.Duration(1<<min(e.attempts, 6)) * 100 * time.Millisecond)
		e.queuedAt = now
		r.pending[e.key] = e
		r.order = append(r.order, e.key)
	}
	r.depth.Set(float64(len(r.pending)))
}

// keepFailure merges an unsent entry into the newer one that replaces it:
// the newer status wins, and an apply failure (or its clearing) the newer
// one does not carry is kept, so coalescing loses nothing.
func keepFailure(newer, old *entry) {
	if newer.req.ApplyError == nil && old.req.ApplyError != nil {
		newer.req.ApplyError = old.req.ApplyError
	}
}

// retryAfter is the wait a RESOURCE_EXHAUSTED answer asks for (its
// RetryInfo; one second without one).
func retryAfter(err error) (time.Duration, bool) {
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.ResourceExhausted {
		return 0, false
	}
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok && ri.GetRetryDelay().IsValid() {
			return min(max(ri.GetRetryDelay().AsDuration(), 10*time.Millisecond), time.Minute), true
		}
	}
	return time.Second, true
}

func sleep(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

// breaker opens after threshold consecutive failures, for minOpen doubling
// up to maxOpen; then one probe goes through (half-open).
type breaker struct {
	mu               sync.Mutex
	threshold        int
	minOpen, maxOpen time.Duration
	failures         int
	openUntil        time.Time
	openFor          time.Duration
	probeOutstanding bool
}

func (b *breaker) wait(now time.Time) time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	if now.Before(b.openUntil) {
		return b.openUntil.Sub(now)
	}
	if b.failures >= b.threshold {
		if b.probeOutstanding {
			return 100 * time.Millisecond
		}
		b.probeOutstanding = true
	}
	return 0
}

// failure records a failure and reports whether the breaker just opened.
func (b *breaker) failure(now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.failures++
	b.probeOutstanding = false
	if b.failures < b.threshold {
		return false
	}
	if b.openFor == 0 {
		b.openFor = b.minOpen
	} else {
		b.openFor = min(2*b.openFor, b.maxOpen)
	}
	b.openUntil = now.Add(b.openFor)
	return b.failures == b.threshold
}

// pause holds every send until until, whatever the breaker's state.
func (b *breaker) pause(until time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.probeOutstanding = false
	if until.After(b.openUntil) {
		b.openUntil = until
	}
}

// release gives back a probe slot taken by wait without a send.
func (b *breaker) release() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.probeOutstanding = false
}

func (b *breaker) success() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.failures, b.openFor, b.probeOutstanding = 0, 0, false
	b.openUntil = time.Time{}
}
