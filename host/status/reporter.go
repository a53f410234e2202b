// Package status forwards what plugins observe in the cluster (and apply
// failures) to ctrl. Reports are coalesced per object (the latest wins),
// held in a bounded buffer, retried with backoff behind a circuit breaker,
// and never block applying: a ctrl outage only delays them.
package status

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/timestamppb"

	clusterv1 "krane.dev/proto/krane/cluster/v1"
	"krane.dev/sdk"
)

type key struct{ kind, id string }

type entry struct {
	req       *clusterv1.ReportStatusRequest
	attempts  int
	notBefore time.Time
}

// Reporter sends status reports to ctrl.
type Reporter struct {
	client  clusterv1.ClusterServiceClient
	log     hclog.Logger
	max     int
	timeout time.Duration

	mu      sync.Mutex
	pending map[key]*entry
	order   []key // FIFO of keys in pending (a key appears once)
	failed  map[key]uint64
	wake    chan struct{}
	breaker breaker

	depth   prometheus.Gauge
	sent    *prometheus.CounterVec
	dropped prometheus.Counter
}

// New returns a reporter holding at most max objects' reports.
func New(client clusterv1.ClusterServiceClient, log hclog.Logger, reg prometheus.Registerer, max int) *Reporter {
	r := &Reporter{
		client: client, log: log, max: max, timeout: 10 * time.Second,
		pending: map[key]*entry{}, failed: map[key]uint64{}, wake: make(chan struct{}, 1),
		breaker: breaker{threshold: 5, minOpen: time.Second, maxOpen: time.Minute},
		depth:   prometheus.NewGauge(prometheus.GaugeOpts{Name: "krane_host_report_queue_depth", Help: "Objects with a status report waiting to be sent."}),
		sent:    prometheus.NewCounterVec(prometheus.CounterOpts{Name: "krane_host_reports_total", Help: "Status reports sent to ctrl, by result."}, []string{"result"}),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{Name: "krane_host_reports_dropped_total", Help: "Reports dropped because the buffer was full (the oldest goes)."}),
	}
	reg.MustRegister(r.depth, r.sent, r.dropped)
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

// ApplyRecovered clears a reported failure once a later apply succeeded.
func (r *Reporter) ApplyRecovered(kind, id string, version uint64) {
	k := key{kind, id}
	r.mu.Lock()
	_, had := r.failed[k]
	delete(r.failed, k)
	r.mu.Unlock()
	if !had {
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
		r.pending[k] = &entry{req: merge(nil)}
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
		k, e, wait := r.take()
		if e == nil {
			// Nothing was sent, so a probe slot taken above must be given
			// back: otherwise the breaker waits for a probe that never ends
			// and reports stay paused after ctrl recovers.
			r.breaker.release()
			select {
			case <-ctx.Done():
				return
			case <-r.wake:
			case <-time.After(wait):
			}
			continue
		}
		r.mu.Lock()
		client := r.client
		r.mu.Unlock()
		cctx, cancel := context.WithTimeout(ctx, r.timeout)
		_, err := client.ReportStatus(cctx, e.req)
		cancel()
		if err == nil {
			r.breaker.success()
			r.sent.WithLabelValues("ok").Inc()
			continue
		}
		if ctx.Err() != nil {
			r.breaker.release()
			return
		}
		r.sent.WithLabelValues("error").Inc()
		if r.breaker.failure(time.Now()) {
			r.log.Warn("ctrl is not accepting status reports; pausing reports (applying continues)", "error", err, "queued", r.Depth())
		}
		r.retry(k, e)
	}
}

// take removes the oldest sendable entry; when none is due it returns how
// long to wait.
func (r *Reporter) take() (key, *entry, time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	wait := time.Second
	for i, k := range r.order {
		e := r.pending[k]
		if e.notBefore.After(now) {
			if d := e.notBefore.Sub(now); d < wait {
				wait = d
			}
			continue
		}
		r.order = append(r.order[:i:i], r.order[i+1:]...)
		delete(r.pending, k)
		r.depth.Set(float64(len(r.pending)))
		return k, e, 0
	}
	return key{}, nil, wait
}

// retry puts a failed report back unless a newer one arrived meanwhile.
func (r *Reporter) retry(k key, e *entry) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, newer := r.pending[k]; newer {
		return
	}
	e.attempts++
	d := time.Duration(1<<min(e.attempts, 6)) * 100 * time.Millisecond
	e.notBefore = time.Now().Add(d)
	r.pending[k] = e
	r.order = append(r.order, k)
	r.depth.Set(float64(len(r.pending)))
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
