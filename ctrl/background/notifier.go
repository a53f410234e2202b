package background

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"

	"krane.dev/ctrl/restateingress"
	"krane.dev/ctrl/rules"
	"krane.dev/ctrl/store"
	"krane.dev/ctrl/workflows"
	"krane.dev/shared/kinds"
)

// NotifierOptions configure a Notifier. Zero values take the defaults.
type NotifierOptions struct {
	Store   *store.Store
	Ingress *restateingress.Ingress
	Log     hclog.Logger
	// Registerer receives the metrics; nil registers none.
	Registerer prometheus.Registerer
	// ResyncInterval is how often every deploy in progress is looked at
	// again. Default 30s.
	ResyncInterval time.Duration
	// DefaultTimeout is deploy.timeout, for deployments that set none.
	DefaultTimeout time.Duration
	// SentinelTimeout is sentinel.deploy_timeout: how long a deploy may
	// stay deploying while it waits for a new sentinel.
	SentinelTimeout time.Duration
	// Workers evaluate queued deployments. Default 4.
	Workers int
	// QueueSize bounds the deployments waiting for a worker, and the
	// sentinels. Default 10000.
	QueueSize int
	// ResyncBatch is the page size of a resync pass's queries. Default
	// 1000.
	ResyncBatch int
	// DBTimeout bounds each database call (a stalled connection must not
	// stall the Notifier). Default 10s.
	DBTimeout time.Duration
}

// Notifier wakes deploy workflows and sentinel deploys. It is ctrl's
// clusterapi.StatusListener:
// an accepted report only queues the deployment (the call runs on the
// report's RPC); a worker then reads the database and, when the deploy is
// decided (every region running, or a failure), calls DeployWorkflow.Notify
// through Restate's ingress. The queue holds each deployment once however
// many reports arrive, and is bounded.
//
// A notification can still be lost: the queue was full, Restate was down
// for longer than the retries, ctrl restarted. So every ResyncInterval the
// Notifier also
//   - queues every deployment in status network again (a lost wake-up
//     costs one interval, not the whole timeout);
//   - starts the workflow again of every deployment pending for over a
//     minute (the API recorded it but could not reach Restate; starting an
//     existing workflow again is a no-op);
//   - counts deployments in progress past their deadline (a workflow
//     paused or killed in Restate), logs them, and exports the count as
//     krane_ctrl_deploys_overdue.
//
// Sentinels work the same way, in a queue of their own: a report (or an
// apply error) on a sentinel whose deploy is progressing is evaluated
// (rules.EvaluateSentinel); when it decides the deploy, SentinelService.NotifyReady
// or NotifyFailed is called for the deploy that owns the row
// (deploy_request). Every resync pass queues every progressing sentinel
// again. The Deploy's own database check after storing its awakeable
// covers reports that came before it waited (see SentinelService).
type Notifier struct {
	o   NotifierOptions
	log hclog.Logger

	deploys, sentinels *keyQueue

	// finished are deployments read at ready, failed or stopped: no deploy
	// of theirs waits any more (a deploy only moves forward), so their
	// clusters' reports need not be read (at a thousand clusters, every
	// change's reports would otherwise cost a read each). Bounded: cleared
	// when full, which only costs reads again.
	finishedMu sync.Mutex
	finished   map[string]struct{}

	// overdueLogged: deployments already logged as overdue (logged once,
	// counted in the gauge every pass). Only the resync pass touches it.
	overdueLogged map[string]bool
	// from: where the next resync pass starts each list (see rotate).
	// Only the resync pass touches it.
	from struct{ network, sentinels, orphans store.Updated }

	sent, failed, dropped prometheus.Counter
	overdue               prometheus.Gauge
	// sentinel notifications: woke a deploy, found none waiting, could not
	// be sent, dropped (queue full).
	sentinelWoken, sentinelIdle, sentinelFailed, sentinelDropped prometheus.Counter
}

// Grace periods and bounds of the resync pass.
const (
	orphanAfter  = time.Minute
	overdueGrace = 5 * time.Minute
	resyncBatch  = 1000
	// maxOrphanStarts bounds the workflows one pass starts (each is a call
	// to Restate); the next pass goes on from there.
	maxOrphanStarts = 100
)

// rotate visits the rows of a paged list, starting where the previous pass
// of it stopped (*from) and wrapping around once, until every row was seen
// or visit returns false; then *from is where the next pass starts (at the
// refused row). Each page is read with the per-call deadline. It returns
// false when a page could not be read (logged).
func (n *Notifier) rotate(ctx context.Context, what string, from *store.Updated, page func(ctx context.Context, after store.Updated) ([]store.Updated, error), visit func(store.Updated) bool) bool {
	start, after, wrapped := *from, *from, false
	for {
		pctx, cancel := context.WithTimeout(ctx, n.o.DBTimeout)
		rows, err := page(pctx, after)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				n.log.Warn("resync: cannot list "+what+"; the next pass retries", "error", err)
			}
			return false
		}
		for _, r := range rows {
			if wrapped && !r.Before(start) {
				*from = store.Updated{}
				return true
			}
			if !visit(r) {
				*from = after
				return true
			}
			after = r
		}
		if len(rows) < n.o.ResyncBatch {
			if wrapped || start == (store.Updated{}) {
				*from = store.Updated{}
				return true
			}
			wrapped, after = true, store.Updated{}
		}
	}
}

// NewNotifier returns a Notifier; Run starts it.
func NewNotifier(o NotifierOptions) *Notifier {
	if o.Log == nil {
		o.Log = hclog.NewNullLogger()
	}
	if o.ResyncInterval <= 0 {
		o.ResyncInterval = 30 * time.Second
	}
	if o.DefaultTimeout <= 0 {
		o.DefaultTimeout = 5 * time.Minute
	}
	if o.Workers <= 0 {
		o.Workers = 4
	}
	if o.QueueSize <= 0 {
		o.QueueSize = 10000
	}
	if o.ResyncBatch <= 0 {
		o.ResyncBatch = resyncBatch
	}
	if o.DBTimeout <= 0 {
		o.DBTimeout = 10 * time.Second
	}
	notifications := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "krane_ctrl_deploy_notifications_total",
		Help: "Wake-ups of deploy workflows after status reports, by result (sent, failed after retries, dropped because the queue was full).",
	}, []string{"result"})
	overdue := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "krane_ctrl_deploys_overdue",
		Help: "Deployments still in progress well past their deadline: their workflow is paused, killed or stuck in Restate.",
	})
	sentinelNotifications := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "krane_ctrl_sentinel_notifications_total",
		Help: "Notices to SentinelService after sentinel reports decided a deploy, by result (woken: a deploy was waiting; idle: none was; failed after retries; dropped because the queue was full).",
	}, []string{"result"})
	if o.Registerer != nil {
		o.Registerer.MustRegister(notifications, overdue, sentinelNotifications)
	}
	n := &Notifier{
		o: o, log: o.Log.Named("deploy-notifier"), overdueLogged: map[string]bool{},
		sent: notifications.WithLabelValues("sent"), failed: notifications.WithLabelValues("failed"),
		dropped: notifications.WithLabelValues("dropped"), overdue: overdue,
		sentinelWoken: sentinelNotifications.WithLabelValues("woken"), sentinelIdle: sentinelNotifications.WithLabelValues("idle"),
		sentinelFailed: sentinelNotifications.WithLabelValues("failed"), sentinelDropped: sentinelNotifications.WithLabelValues("dropped"),
	}
	n.deploys = newKeyQueue(o.QueueSize, func(id string) {
		n.dropped.Inc()
		n.log.Warn("deploy notification queue is full; the resync pass will catch up", "deployment", id, "size", o.QueueSize)
	})
	n.sentinels = newKeyQueue(o.QueueSize, func(id string) {
		n.sentinelDropped.Inc()
		n.log.Warn("sentinel notification queue is full; the resync pass will catch up", "sentinel", id, "size", o.QueueSize)
	})
	return n
}

// keyQueue holds each key at most once until a worker takes it; it is
// bounded, and full means the key is dropped (the resync pass queues it
// again).
type keyQueue struct {
	mu      sync.Mutex
	pending map[string]bool
	ch      chan string
	size    int
	dropped func(key string)
}

func newKeyQueue(size int, dropped func(string)) *keyQueue {
	return &keyQueue{pending: map[string]bool{}, ch: make(chan string, size), size: size, dropped: dropped}
}

// add queues key; false when the queue was full and it was dropped.
func (q *keyQueue) add(key string) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.pending[key] {
		return true
	}
	if len(q.pending) >= q.size {
		q.dropped(key)
		return false
	}
	q.pending[key] = true
	q.ch <- key // never blocks: the channel holds exactly the pending keys
	return true
}

// taken marks a key received from ch as no longer pending: a report from
// now on queues it again.
func (q *keyQueue) taken(key string) {
	q.mu.Lock()
	delete(q.pending, key)
	q.mu.Unlock()
}

// DeploymentReported queues the deployment for evaluation, unless its
// deploy is known to be over.
func (n *Notifier) DeploymentReported(_ context.Context, deploymentID, _ string) {
	n.finishedMu.Lock()
	_, done := n.finished[deploymentID]
	n.finishedMu.Unlock()
	if !done {
		n.deploys.add(deploymentID)
	}
}

// maxFinished bounds Notifier.finished.
const maxFinished = 100000

func (n *Notifier) markFinished(id string) {
	n.finishedMu.Lock()
	defer n.finishedMu.Unlock()
	if n.finished == nil || len(n.finished) >= maxFinished {
		n.finished = map[string]struct{}{}
	}
	n.finished[id] = struct{}{}
}

// SentinelReported queues the sentinel for evaluation.
func (n *Notifier) SentinelReported(_ context.Context, sentinelID string) {
	n.sentinels.add(sentinelID)
}

// Run works until ctx is done.
func (n *Notifier) Run(ctx context.Context) {
	var wg sync.WaitGroup
	for range n.o.Workers {
		wg.Go(func() {
			for {
				select {
				case <-ctx.Done():
					return
				case id := <-n.deploys.ch:
					n.deploys.taken(id)
					n.evaluate(ctx, id)
				case id := <-n.sentinels.ch:
					n.sentinels.taken(id)
					n.evaluateSentinel(ctx, id)
				}
			}
		})
	}
	t := time.NewTicker(n.o.ResyncInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			wg.Wait()
			return
		case <-t.C:
			n.resync(ctx)
		}
	}
}

// evaluate notifies the deployment's workflow when its deploy is decided.
func (n *Notifier) evaluate(ctx context.Context, id string) {
	dctx, cancel := context.WithTimeout(ctx, n.o.DBTimeout)
	defer cancel()
	d, err := n.o.Store.GetDeployment(dctx, id)
	if err != nil {
		if ctx.Err() == nil {
			n.log.Warn("cannot read a reported deployment; the resync pass will retry", "deployment", id, "error", err)
		}
		return
	}
	if d.Status != store.StatusDeploying && d.Status != store.StatusNetwork {
		if !slices.Contains(store.InProgress, d.Status) {
			n.markFinished(id)
		}
		return
	}
	states, err := n.o.Store.RegionStates(dctx, id)
	if err != nil {
		n.log.Warn("cannot read a reported deployment's regions; the resync pass will retry", "deployment", id, "error", err)
		return
	}
	o := rules.Evaluate(states[id])
	if !o.Decided() {
		return
	}
	backoff := 250 * time.Millisecond
	for attempt := 1; ; attempt++ {
		err := restateingress.NotifyDeploy(ctx, n.o.Ingress, id, o)
		if err == nil {
			n.sent.Inc()
			n.log.Debug("notified a deploy", "deployment", id, "result", o.Result)
			return
		}
		if attempt == 5 || ctx.Err() != nil {
			n.failed.Inc()
			n.log.Warn("cannot notify a deploy workflow through Restate; the resync pass will retry", "deployment", id, "error", err)
			return
		}
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
		backoff *= 2
	}
}

// evaluateSentinel tells the sentinel's deploy when a report decided it.
func (n *Notifier) evaluateSentinel(ctx context.Context, id string) {
	dctx, cancel := context.WithTimeout(ctx, n.o.DBTimeout)
	defer cancel()
	row, err := n.o.Store.GetSentinel(dctx, id)
	if err != nil {
		if ctx.Err() == nil && !errors.Is(err, store.ErrNotFound) {
			n.log.Warn("cannot read a reported sentinel; the resync pass will retry", "sentinel", id, "error", err)
		}
		return
	}
	if row.DeployStatus != store.SentinelProgressing {
		return
	}
	errs, err := n.o.Store.ApplyErrors(dctx, kinds.Sentinel, row.Region, id)
	if err != nil {
		n.log.Warn("cannot read a reported sentinel's apply errors; the resync pass will retry", "sentinel", id, "error", err)
		return
	}
	o := rules.EvaluateSentinel(row, errs)
	if !o.Decided() {
		return
	}
	notice := workflows.SentinelNotice{Request: row.DeployRequest, Result: o.Result, Message: o.Message}
	backoff := 250 * time.Millisecond
	for attempt := 1; ; attempt++ {
		res, err := restateingress.NotifySentinel(ctx, n.o.Ingress, id, notice)
		if err == nil {
			if res.Woken {
				n.sentinelWoken.Inc()
			} else {
				n.sentinelIdle.Inc()
			}
			n.log.Debug("notified a sentinel deploy", "sentinel", id, "result", o.Result, "woken", res.Woken)
			return
		}
		if attempt == 5 || ctx.Err() != nil {
			n.sentinelFailed.Inc()
			n.log.Warn("cannot notify a sentinel deploy through Restate; the resync pass will retry", "sentinel", id, "error", err)
			return
		}
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
		backoff *= 2
	}
}

// resync is the periodic pass described on Notifier. Each of its lists
// is paged through (keyset on the time a row last changed), and the passes
// rotate: one that stops early (the queue is full, or enough orphans were
// started) resumes there the next time. So rows that never change (deploys
// whose clusters never report) cannot keep the rows behind them out, and
// every database call has a deadline: a database that stops answering
// costs a pass, not the Notifier.
func (n *Notifier) resync(ctx context.Context) {
	now := time.Now()
	n.rotate(ctx, "network deployments", &n.from.network, func(ctx context.Context, after store.Updated) ([]store.Updated, error) {
		return n.o.Store.DeploymentsInStatus(ctx, store.StatusNetwork, now, after, n.o.ResyncBatch)
	}, func(u store.Updated) bool { return n.deploys.add(u.ID) })
	n.rotate(ctx, "deploying sentinels", &n.from.sentinels, func(ctx context.Context, after store.Updated) ([]store.Updated, error) {
		return n.o.Store.SentinelsDeploying(ctx, after, n.o.ResyncBatch)
	}, func(u store.Updated) bool { return n.sentinels.add(u.ID) })

	started := 0
	n.rotate(ctx, "pending deployments", &n.from.orphans, func(ctx context.Context, after store.Updated) ([]store.Updated, error) {
		return n.o.Store.DeploymentsInStatus(ctx, store.StatusPending, now.Add(-orphanAfter), after, n.o.ResyncBatch)
	}, func(u store.Updated) bool {
		if started == maxOrphanStarts {
			return false
		}
		started++
		dctx, cancel := context.WithTimeout(ctx, n.o.DBTimeout)
		d, err := n.o.Store.GetDeployment(dctx, u.ID)
		cancel()
		if err != nil {
			return true
		}
		req := workflows.DeployRequest{Deployment: d.Spec, Regions: d.Regions, TimeoutSeconds: d.TimeoutSeconds}
		if _, err := restateingress.StartDeploy(ctx, n.o.Ingress, req); err != nil {
			n.log.Warn("deploy resync: cannot start the workflow of a pending deployment", "deployment", u.ID, "error", err)
		}
		return true
	})

	overdue := map[string]bool{}
	for _, status := range []string{store.StatusDeploying, store.StatusNetwork} {
		var from store.Updated // every row: the gauge counts them all
		ok := n.rotate(ctx, status+" deployments", &from, func(ctx context.Context, after store.Updated) ([]store.Updated, error) {
			return n.o.Store.DeploymentsInStatus(ctx, status, now.Add(-overdueGrace), after, n.o.ResyncBatch)
		}, func(u store.Updated) bool {
			dctx, cancel := context.WithTimeout(ctx, n.o.DBTimeout)
			d, err := n.o.Store.GetDeployment(dctx, u.ID)
			cancel()
			if err != nil {
				return true
			}
			deadline := d.UpdatedAt.Add(overdueGrace)
			if status == store.StatusDeploying {
				deadline = deadline.Add(n.o.SentinelTimeout) // the wait for new sentinels
			}
			if status == store.StatusNetwork {
				timeout := n.o.DefaultTimeout
				if d.TimeoutSeconds > 0 {
					timeout = time.Duration(d.TimeoutSeconds) * time.Second
				}
				deadline = deadline.Add(timeout)
			}
			if now.After(deadline) {
				overdue[u.ID] = true
				if !n.overdueLogged[u.ID] {
					n.log.Error("a deploy is overdue: its workflow is not making progress (paused or killed in Restate?); "+
						"find it with `restate invocations ls` (workflow DeployWorkflow, key = the deployment id) and resume it",
						"deployment", u.ID, "status", status, "since", d.UpdatedAt)
				}
			}
			return true
		})
		if !ok {
			return // the count would be short: keep the last one
		}
	}
	n.overdue.Set(float64(len(overdue)))
	n.overdueLogged = overdue
}
