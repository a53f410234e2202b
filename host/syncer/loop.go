package syncer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"

	clusterv1 "krane.dev/proto/krane/cluster/v1"
	"krane.dev/sdk"
)

// PluginSource hands out the running plugin of a kind.
type PluginSource interface {
	// Acquire blocks until the plugin runs and returns it with a channel
	// that is closed when that plugin instance stops.
	Acquire(ctx context.Context) (sdk.Controller, <-chan struct{}, error)
}

// FailureReporter tells ctrl about changes that could not be applied.
type FailureReporter interface {
	ApplyFailed(kind, id string, version uint64, err error)
	// ApplyRecovered clears a failure reported at a version <= version:
	// the object was applied since, or desired state no longer names it.
	ApplyRecovered(kind, id string, version uint64)
	// Failing lists the objects of kind whose failure is reported and not
	// cleared.
	Failing(kind string) []string
}

// Options tune a loop.
type Options struct {
	Workers        int
	ResyncInterval time.Duration
	ReconnectMin   time.Duration
	ReconnectMax   time.Duration
	ApplyTimeout   time.Duration
	MaxPending     int
	// StreamTimeout is how long a stream from ctrl may stay silent: a
	// Watch delivers a change or a keep-alive at least every keep-alive
	// period of ctrl (15 s by default), so three periods of silence mean
	// ctrl or the link is stuck. The Watch is then torn down and resumed
	// from the cursor; a resync's listing gives up until the next pass.
	StreamTimeout time.Duration
	// Retry backs off retryable failures; after MaxAttempts the change is
	// parked like a permanent one. Park backs off retries of parked changes.
	Retry       Backoff
	Park        Backoff
	MaxAttempts int
	GC          GCOptions
}

// GCOptions is the deletion brake.
type GCOptions struct {
	MaxDeleteFraction float64
	MinDeletes        int
	AllowMassDelete   bool
}

// DefaultOptions are sane production defaults.
func DefaultOptions() Options {
	return Options{
		Workers: 16, ResyncInterval: time.Minute, ReconnectMin: time.Second, ReconnectMax: 5 * time.Second,
		ApplyTimeout: 30 * time.Second, MaxPending: 10000, StreamTimeout: 45 * time.Second,
		Retry: Backoff{Min: 200 * time.Millisecond, Max: 30 * time.Second}, MaxAttempts: 8,
		Park: Backoff{Min: 30 * time.Second, Max: 10 * time.Minute},
		GC:   GCOptions{MaxDeleteFraction: 0.25, MinDeletes: 5},
	}
}

// Loop syncs one kind.
type Loop struct {
	Kind    string
	Region  string
	Client  clusterv1.ClusterServiceClient
	Plugin  PluginSource
	Reports FailureReporter
	Log     hclog.Logger
	Metrics *Metrics

	opts atomic.Pointer[Options]

	mu           sync.Mutex
	q            *queue
	bootstrapped atomic.Bool // a complete bootstrap happened since start
	// newHistory: ctrl refused a cursor because its database went back in
	// time; until the next bootstrap's garbage collection, the versions the
	// inventory's objects carry are from the old history and say nothing.
	newHistory atomic.Bool
	resyncNow  chan struct{}
}

// errHistoryChanged ends a session whose cursor belongs to another history
// of ctrl's database: the next session bootstraps with a queue of its own,
// since every version the old one remembers is from the old history.
type errHistoryChanged struct{ err error }

func (e errHistoryChanged) Error() string {
	return "ctrl's database went back in time (restored or failed over): " + e.err.Error()
}

// NewLoop builds a loop; Run starts it.
func NewLoop(kind, region string, client clusterv1.ClusterServiceClient, plugin PluginSource, reports FailureReporter, log hclog.Logger, m *Metrics, opts Options) *Loop {
	l := &Loop{Kind: kind, Region: region, Client: client, Plugin: plugin, Reports: reports, Log: log.With("kind", kind), Metrics: m, resyncNow: make(chan struct{}, 1)}
	l.SetOptions(opts)
	return l
}

// SetOptions changes tunables of a running loop (config reload).
func (l *Loop) SetOptions(o Options) { l.opts.Store(&o) }

func (l *Loop) options() Options { return *l.opts.Load() }

// Bootstrapped reports whether a complete bootstrap has been applied.
func (l *Loop) Bootstrapped() bool { return l.bootstrapped.Load() }

// Cursor is the committed cursor (0 before the first session).
func (l *Loop) Cursor() uint64 {
	l.mu.Lock()
	q := l.q
	l.mu.Unlock()
	if q == nil {
		return 0
	}
	return q.Cursor()
}

// Resync asks for a resync now.
func (l *Loop) Resync() {
	select {
	case l.resyncNow <- struct{}{}:
	default:
	}
}

// Run syncs until ctx ends. Each plugin instance gets its own session,
// which starts with a bootstrap from version 0: a restarted plugin has lost
// nothing in the cluster, but the host no longer knows what it finished.
func (l *Loop) Run(ctx context.Context) {
	// The kind's counters exist from the start at 0, so a rate or an
	// alert over them (deploy/monitoring) has a series before the first
	// event.
	for _, c := range []*prometheus.CounterVec{l.Metrics.Reconnects, l.Metrics.Rebootstraps, l.Metrics.GCBrakeTrips, l.Metrics.GCDeletions, l.Metrics.ResyncWrites} {
		c.WithLabelValues(l.Kind)
	}
	for ctx.Err() == nil {
		ctl, stopped, err := l.Plugin.Acquire(ctx)
		if err != nil {
			return
		}
		sctx, cancel := context.WithCancel(ctx)
		go func() {
			select {
			case <-stopped:
				cancel()
			case <-sctx.Done():
			}
		}()
		// A session whose cursor ctrl refused is followed by another one,
		// which bootstraps again, on the same plugin instance.
		for l.session(sctx, ctl) && sctx.Err() == nil {
			l.Metrics.Rebootstraps.WithLabelValues(l.Kind).Inc()
		}
		cancel()
	}
}

// session syncs until ctx ends or ctrl refuses its cursor (then it
// returns true).
func (l *Loop) session(ctx context.Context, ctl sdk.Controller) (again bool) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	o := l.options()
	q := newQueue(o.Retry, o.Park, o.MaxAttempts)
	l.mu.Lock()
	l.q = q
	l.mu.Unlock()
	var wg sync.WaitGroup
	for range o.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l.work(ctx, ctl, q)
		}()
	}
	defer wg.Wait()
	defer cancel() // before the wait: the workers and resyncs stop

	// applied is closed once the first bootstrap of this session is applied
	// and garbage-collected; resyncs start only then.
	applied := make(chan struct{})
	var once sync.Once
	markApplied := func() { once.Do(func() { close(applied) }) }
	// bootstrapped runs the garbage collection of a bootstrap once it is
	// applied; the session waits for it like for its workers.
	bootstrapped := func(max uint64, snapshot map[string]struct{}) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l.afterBootstrap(ctx, ctl, q, max, snapshot, markApplied)
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		l.resyncLoop(ctx, ctl, q, applied)
	}()

	// complete is set when a BootstrapComplete marker arrives: from then on
	// the queue holds the full snapshot and reconnects resume from the
	// cursor; before it, a broken stream restarts the bootstrap from 0.
	complete := false
	// gen is the database generation of this session's versions, as the
	// bootstrap's stream stated it.
	gen := ""
	for ctx.Err() == nil {
		after := q.Cursor()
		if !complete {
			after = 0
		}
		err := l.stream(ctx, q, after, &gen, &complete, bootstrapped)
		if ctx.Err() != nil {
			return false
		}
		var hc errHistoryChanged
		if errors.As(err, &hc) {
			l.newHistory.Store(true)
			l.Log.Warn("ctrl refused the cursor: its database went back in time; bootstrapping this kind again (apply what the database holds, garbage-collect what it does not)",
				"error", hc.err, "cursor", q.Cursor(), "generation", gen)
			return true
		}
		l.Metrics.Reconnects.WithLabelValues(l.Kind).Inc()
		wait := Jitter(o.ReconnectMin, o.ReconnectMax)
		if hint, ok := retryHint(err); ok {
			// ctrl asked for this wait (its bootstrap limit in a
			// reconnect storm); a quarter more at random spreads the
			// hosts it refused at once.
			wait = max(wait, Jitter(hint, hint+hint/4))
		}
		l.Log.Warn("watch stream ended, reconnecting", "error", err, "cursor", q.Cursor(), "in", wait.Round(time.Millisecond))
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
		o = l.options()
	}
	return false
}

// stream reads one Watch stream until it fails or falls silent. gen is the
// database generation the cursor belongs to; a bootstrap sets it.
func (l *Loop) stream(ctx context.Context, q *queue, after uint64, gen *string, complete *bool, bootstrapped func(max uint64, snapshot map[string]struct{})) error {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	q.Resume(after)
	wd := newWatchdog(l.options().StreamTimeout, cancel)
	defer wd.got()
	wd.wait()
	req := &clusterv1.WatchRequest{Kind: l.Kind, Region: l.Region, AfterVersion: after}
	if after > 0 {
		req.Generation = *gen
	}
	st, err := l.Client.Watch(sctx, req)
	if status.Code(err) == codes.OutOfRange {
		return errHistoryChanged{err}
	}
	if err != nil {
		return wd.explain("open watch", fmt.Errorf("open watch: %w", err))
	}
	l.Log.Debug("watching", "after_version", after)
	var live map[string]struct{}
	if after == 0 {
		live = map[string]struct{}{}
	}
	for {
		wd.wait()
		ev, err := st.Recv()
		wd.got()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return errors.New("ctrl closed the stream")
			}
			if status.Code(err) == codes.OutOfRange {
				// The cursor is ahead of ctrl's head, or from another
				// generation of its database.
				return errHistoryChanged{err}
			}
			return wd.explain("watch", err)
		}
		switch e := ev.Event.(type) {
		case *clusterv1.WatchEvent_Change:
			ch := changeFromProto(e.Change)
			if ch.Kind != "" && ch.Kind != l.Kind {
				l.Log.Error("ctrl sent a change of another kind; ignoring it", "got_kind", ch.Kind, "id", ch.ID)
				continue
			}
			ch.Kind = l.Kind
			if live != nil && !ch.Deleted {
				live[ch.ID] = struct{}{}
			}
			if err := q.WaitCapacity(ctx, ch.ID, l.options().MaxPending); err != nil {
				return err
			}
			q.Add(ch)
		case *clusterv1.WatchEvent_BootstrapComplete:
			max := e.BootstrapComplete.GetMaxVersion()
			q.MarkReceived(max)
			l.Metrics.Head.WithLabelValues(l.Kind).Set(float64(max))
			if live != nil {
				*gen = e.BootstrapComplete.GetGeneration()
				l.Log.Info("bootstrap received", "objects", len(live), "max_version", max, "generation", *gen)
				*complete = true
				snapshot := live
				live = nil
				bootstrapped(max, snapshot)
			}
		case *clusterv1.WatchEvent_KeepAlive:
			if g := e.KeepAlive.GetGeneration(); g != "" && *gen != "" && g != *gen {
				return errHistoryChanged{fmt.Errorf("the stream states database generation %s, the cursor belongs to %s", g, *gen)}
			}
			l.Metrics.Head.WithLabelValues(l.Kind).Set(float64(e.KeepAlive.GetHeadVersion()))
		}
		cur := q.Cursor()
		l.Metrics.Cursor.WithLabelValues(l.Kind).Set(float64(cur))
	}
}

// afterBootstrap waits until the bootstrap is applied (or parked), then
// garbage-collects what the snapshot did not name.
func (l *Loop) afterBootstrap(ctx context.Context, ctl sdk.Controller, q *queue, max uint64, live map[string]struct{}, done func()) {
	if err := waitCursor(ctx, q, max); err != nil {
		return
	}
	// After ctrl's database went back in time, the inventory's objects
	// carry versions of the old history, possibly above this snapshot's:
	// they do not keep an object the restored database does not hold.
	newHistory := l.newHistory.Load()
	if l.collect(ctx, ctl, q, max, live, "bootstrap", newHistory) && newHistory {
		l.newHistory.Store(false)
	}
	l.bootstrapped.Store(true)
	done()
	l.Log.Info("bootstrap applied", "objects", len(live), "cursor", q.Cursor(), "parked", q.Parked())
}

func waitCursor(ctx context.Context, q *queue, v uint64) error {
	for q.Cursor() < v {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	return nil
}

// collect deletes inventory objects that the snapshot at version `asOf`
// did not name, subject to the brake. With oldVersions, the versions the
// inventory reports are from an older history of ctrl's database and keep
// nothing. It reports whether the pass ran to the end (nothing to delete,
// or deletions queued).
func (l *Loop) collect(ctx context.Context, ctl sdk.Controller, q *queue, asOf uint64, desired map[string]struct{}, why string, oldVersions bool) bool {
	o := l.options()
	l.clearFailures(q, asOf, desired)
	ictx, cancel := context.WithTimeout(ctx, o.ApplyTimeout)
	inv, err := ctl.Inventory(ictx, &sdk.InventoryRequest{Kind: l.Kind})
	cancel()
	if err != nil {
		l.Log.Error("inventory failed; skipping garbage collection this time", "error", err, "pass", why)
		return false
	}
	items := inv.Items
	var doomed []sdk.InventoryItem
	for _, it := range items {
		if _, ok := desired[it.ID]; ok || it.ID == "" {
			continue
		}
		// Created or changed by a change newer than the snapshot: keep it.
		if applied, busy := q.Applied(it.ID); busy || applied > asOf || (it.Version > asOf && !oldVersions) {
			continue
		}
		doomed = append(doomed, it)
	}
	if len(doomed) == 0 {
		return true
	}
	allowed := max(o.GC.MinDeletes, int(o.GC.MaxDeleteFraction*float64(len(items))))
	if len(doomed) > allowed && !o.GC.AllowMassDelete {
		l.Metrics.GCBrakeTrips.WithLabelValues(l.Kind).Inc()
		l.Log.Error("garbage collection brake tripped: refusing to delete objects that desired state no longer names",
			"pass", why, "would_delete", len(doomed), "managed", len(items), "allowed", allowed,
			"example", doomed[0].ID,
			"fix", "if this is intended, set gc { allow_mass_delete = true } in krane.hcl (or KRANE_GC__ALLOW_MASS_DELETE=true) and reload, then turn it off again")
		return false
	}
	for _, it := range doomed {
		q.Collect(sdk.Change{Kind: l.Kind, ID: it.ID, Version: asOf, Deleted: true})
	}
	l.Metrics.GCDeletions.WithLabelValues(l.Kind).Add(float64(len(doomed)))
	l.Log.Info("garbage collecting objects desired state no longer names", "pass", why, "count", len(doomed), "managed", len(items))
	return true
}

// clearFailures clears the reported failures of objects that desired state
// at asOf no longer names and that this session holds no work or parked
// change for (a delete that failed stays reported): nothing will apply
// them again, and they may never have reached the cluster for garbage
// collection to find. A failure reported after asOf is newer and stays.
func (l *Loop) clearFailures(q *queue, asOf uint64, desired map[string]struct{}) {
	if l.Reports == nil {
		return
	}
	for _, id := range l.Reports.Failing(l.Kind) {
		if _, ok := desired[id]; !ok && !q.Holds(id) {
			l.Reports.ApplyRecovered(l.Kind, id, asOf)
		}
	}
}

// resyncLoop re-reads desired state every interval (jittered) after the
// first complete bootstrap, re-applies it (plugins answer UNCHANGED cheaply
// when nothing drifted) and collects what should not exist.
func (l *Loop) resyncLoop(ctx context.Context, ctl sdk.Controller, q *queue, bootstrapped <-chan struct{}) {
	select {
	case <-ctx.Done():
		return
	case <-bootstrapped:
	}
	for {
		iv := l.options().ResyncInterval
		select {
		case <-ctx.Done():
			return
		case <-time.After(Jitter(iv*9/10, iv*11/10)):
		case <-l.resyncNow:
		}
		if err := l.resync(ctx, ctl, q); err != nil && ctx.Err() == nil {
			l.Log.Warn("resync failed; will retry at the next interval", "error", err)
		}
	}
}

func (l *Loop) resync(ctx context.Context, ctl sdk.Controller, q *queue) error {
	start := time.Now()
	// The listing below starts after the cursor reached this floor: see
	// Forget for why that makes forgetting finished objects safe.
	q.Forget(q.Cursor())
	// The listing stops being read at its BootstrapComplete: cancelling
	// is what releases the stream (and the goroutine gRPC keeps for it).
	// A pass takes at most one interval, and a silent listing is abandoned
	// sooner, so a stuck ctrl cannot hold resyncs (and parked retries).
	o := l.options()
	lctx, cancel := context.WithTimeout(ctx, o.ResyncInterval)
	defer cancel()
	wd := newWatchdog(o.StreamTimeout, cancel)
	defer wd.got()
	wd.wait()
	st, err := l.Client.ListDesired(lctx, &clusterv1.ListDesiredRequest{Kind: l.Kind, Region: l.Region})
	if err != nil {
		return wd.explain("list desired", fmt.Errorf("list desired: %w", err))
	}
	desired := map[string]struct{}{}
	for {
		wd.wait()
		ev, err := st.Recv()
		wd.got()
		if err != nil {
			return wd.explain("list desired", fmt.Errorf("list desired: %w", err))
		}
		if c := ev.GetChange(); c != nil {
			ch := changeFromProto(c)
			ch.Kind = l.Kind
			desired[ch.ID] = struct{}{}
			q.Repair(ch)
			continue
		}
		if b := ev.GetBootstrapComplete(); b != nil {
			l.collect(ctx, ctl, q, b.GetMaxVersion(), desired, "resync", l.newHistory.Load())
			break
		}
	}
	l.Metrics.ResyncSeconds.WithLabelValues(l.Kind).Observe(time.Since(start).Seconds())
	l.Metrics.Parked.WithLabelValues(l.Kind).Set(float64(q.Parked()))
	return nil
}

// work applies tasks until ctx ends.
func (l *Loop) work(ctx context.Context, ctl sdk.Controller, q *queue) {
	for {
		t, err := q.Next(ctx)
		if err != nil {
			return
		}
		o := l.options()
		actx, cancel := context.WithTimeout(ctx, o.ApplyTimeout)
		actx, span := l.startApplySpan(actx, t)
		start := time.Now()
		resp, err := ctl.Apply(actx, &sdk.ApplyRequest{Change: t.change})
		cancel()
		if ctx.Err() != nil {
			endApplySpan(span, resp.GetResult(), ctx.Err(), false)
			// The session is ending (plugin restart, shutdown) and its
			// queue with it: the next session re-bootstraps. Recording an
			// outcome here could only mislead: counted as an attempt, a
			// change could be parked unreported and the cursor pass it.
			return
		}
		out := succeeded
		switch {
		case err == nil:
		case sdk.IsPermanent(err):
			out = permanent
		default:
			out = retryable
		}
		parked := q.Done(t, out)
		endApplySpan(span, resp.GetResult(), err, parked)
		l.observe(t, resp.GetResult(), err, parked, time.Since(start))
		l.Metrics.Parked.WithLabelValues(l.Kind).Set(float64(q.Parked()))
	}
}

func (l *Loop) observe(t *task, res sdk.Result, err error, parked bool, took time.Duration) {
	source := [...]string{fromStream: "stream", repair: "resync", collect: "gc"}[t.kind]
	result := res.String()
	if err != nil {
		result = "error"
		if sdk.IsPermanent(err) {
			result = "permanent_error"
		}
	}
	l.Metrics.Applies.WithLabelValues(l.Kind, source, result).Inc()
	l.Metrics.ApplySeconds.WithLabelValues(l.Kind, result).Observe(took.Seconds())
	c := t.change
	switch {
	case err == nil:
		if t.kind == repair && res == sdk.Applied {
			l.Metrics.ResyncWrites.WithLabelValues(l.Kind).Inc()
			l.Log.Info("resync repaired drift", "id", c.ID, "version", c.Version)
		}
		if l.Reports != nil {
			l.Reports.ApplyRecovered(l.Kind, c.ID, c.Version)
		}
		l.Log.Trace("applied", "id", c.ID, "version", c.Version, "result", result, "took", took)
	case parked:
		l.Log.Error("change parked: it will be retried rarely and whenever a newer version arrives", "id", c.ID, "version", c.Version, "error", err)
		if l.Reports != nil {
			l.Reports.ApplyFailed(l.Kind, c.ID, c.Version, err)
		}
	default:
		l.Log.Warn("apply failed; retrying with backoff", "id", c.ID, "version", c.Version, "error", err)
	}
}

func changeFromProto(c *clusterv1.ResourceChange) sdk.Change {
	ch := sdk.Change{Kind: c.GetKind(), ID: c.GetId(), Version: c.GetVersion(), Deleted: c.GetDeleted(), TraceParent: c.GetTraceparent()}
	if a := c.GetSpec(); a != nil {
		ch.Spec = specFromAny(a)
	}
	return ch
}

func specFromAny(a *anypb.Any) sdk.Spec {
	return sdk.Spec{TypeURL: a.GetTypeUrl(), Value: a.GetValue()}
}

// retryHint is the wait ctrl asked for when it refused a stream
// (RESOURCE_EXHAUSTED or UNAVAILABLE with a RetryInfo), at most a minute.
func retryHint(err error) (time.Duration, bool) {
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.ResourceExhausted && st.Code() != codes.Unavailable {
		return 0, false
	}
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok && ri.GetRetryDelay().IsValid() {
			return min(ri.GetRetryDelay().AsDuration(), time.Minute), true
		}
	}
	return 0, false
}
