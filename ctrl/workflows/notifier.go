package workflows

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/restatedev/sdk-go/ingress"

	"krane.dev/ctrl/deployspec"
	"krane.dev/ctrl/store"
	"krane.dev/internal/kinds"
)

// NotifierOptions configure a Notifier. Zero values take the defaults.
type NotifierOptions struct {
	Store   *store.Store
	Ingress *ingress.Client
	Log     hclog.Logger
	// Registerer receives the metrics; nil registers none.
	Registerer prometheus.Registerer
	// ResyncInterval is how often every deploy in progress is looked at
	// again. Default 30s.
	ResyncInterval time.Duration
	// DefaultTimeout is deploy.timeout, for deployments that set none.
	DefaultTimeout time.Duration
	// Workers evaluate queued deployments. Default 4.
	Workers int
	// QueueSize bounds the deployments waiting for a worker, and the
	// sentinels. Default 10000.
	QueueSize int
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
// (EvaluateSentinel); when it decides the deploy, SentinelService.NotifyReady
// or NotifyFailed is called for the deploy that owns the row
// (deploy_request). Every resync pass queues every progressing sentinel
// again. The Deploy's own database check after storing its awakeable
// covers reports that came before it waited (see SentinelService).
type Notifier struct {
	o   NotifierOptions
	log hclog.Logger

	deploys, sentinels *keyQueue

	// overdueLogged: deployments already logged as overdue (logged once,
	// counted in the gauge every pass). Only the resync pass touches it.
	overdueLogged map[string]bool

	sent, failed, dropped prometheus.Counter
	overdue               prometheus.Gauge
	// sentinel notifications: woke a deploy, found none waiting, could not
	// be sent, dropped (queue full).
	sentinelWoken, sentinelIdle, sentinelFailed, sentinelDropped prometheus.Counter
}

// Grace periods of the resync pass.
const (
	orphanAfter  = time.Minute
	overdueGrace = 5 * time.Minute
	resyncBatch  = 1000
)

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

func (q *keyQueue) add(key string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.pending[key] {
		return
	}
	if len(q.pending) >= q.size {
		q.dropped(key)
		return
	}
	q.pending[key] = true
	q.ch <- key // never blocks: the channel holds exactly the pending keys
}

// taken marks a key received from ch as no longer pending: a report from
// now on queues it again.
func (q *keyQueue) taken(key string) {
	q.mu.Lock()
	delete(q.pending, key)
	q.mu.Unlock()
}

// DeploymentReported queues the deployment for evaluation.
func (n *Notifier) DeploymentReported(_ context.Context, deploymentID, _ string) {
	n.deploys.add(deploymentID)
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
	d, err := n.o.Store.GetDeployment(ctx, id)
	if err != nil {
		if ctx.Err() == nil {
			n.log.Warn("cannot read a reported deployment; the resync pass will retry", "deployment", id, "error", err)
		}
		return
	}
	if d.Status != store.StatusDeploying && d.Status != store.StatusNetwork {
		return
	}
	states, err := n.o.Store.RegionStates(ctx, id)
	if err != nil {
		n.log.Warn("cannot read a reported deployment's regions; the resync pass will retry", "deployment", id, "error", err)
		return
	}
	o := Evaluate(states[id])
	if !o.Decided() {
		return
	}
	backoff := 250 * time.Millisecond
	for attempt := 1; ; attempt++ {
		err := NotifyDeploy(ctx, n.o.Ingress, id, o)
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
	row, err := n.o.Store.GetSentinel(ctx, id)
	if err != nil {
		if ctx.Err() == nil && !errors.Is(err, store.ErrNotFound) {
			n.log.Warn("cannot read a reported sentinel; the resync pass will retry", "sentinel", id, "error", err)
		}
		return
	}
	if row.DeployStatus != store.SentinelProgressing {
		return
	}
	errs, err := n.o.Store.ApplyErrors(ctx, kinds.Sentinel, row.Region, id)
	if err != nil {
		n.log.Warn("cannot read a reported sentinel's apply errors; the resync pass will retry", "sentinel", id, "error", err)
		return
	}
	o := EvaluateSentinel(row, errs)
	if !o.Decided() {
		return
	}
	notice := SentinelNotice{Request: row.DeployRequest, Result: o.Result, Message: o.Message}
	backoff := 250 * time.Millisecond
	for attempt := 1; ; attempt++ {
		res, err := NotifySentinel(ctx, n.o.Ingress, id, notice)
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

// resync is the periodic pass described on Notifier.
func (n *Notifier) resync(ctx context.Context) {
	now := time.Now()
	network, err := n.o.Store.DeploymentsInStatus(ctx, store.StatusNetwork, now, resyncBatch)
	if err != nil {
		n.log.Warn("deploy resync: cannot list deployments", "error", err)
		return
	}
	for _, id := range network {
		n.deploys.add(id)
	}
	deploying, err := n.o.Store.SentinelsDeploying(ctx, resyncBatch)
	if err != nil {
		n.log.Warn("sentinel resync: cannot list deploying sentinels", "error", err)
	}
	for _, id := range deploying {
		n.sentinels.add(id)
	}

	orphans, err := n.o.Store.DeploymentsInStatus(ctx, store.StatusPending, now.Add(-orphanAfter), 100)
	if err != nil {
		n.log.Warn("deploy resync: cannot list pending deployments", "error", err)
		return
	}
	for _, id := range orphans {
		d, err := n.o.Store.GetDeployment(ctx, id)
		if err != nil {
			continue
		}
		req := DeployRequest{Deployment: deployspec.FromStore(d), Regions: d.Regions, TimeoutSeconds: d.TimeoutSeconds}
		if _, err := StartDeploy(ctx, n.o.Ingress, req); err != nil {
			n.log.Warn("deploy resync: cannot start the workflow of a pending deployment", "deployment", id, "error", err)
		}
	}

	overdue := map[string]bool{}
	for _, status := range []string{store.StatusDeploying, store.StatusNetwork} {
		ids, err := n.o.Store.DeploymentsInStatus(ctx, status, now.Add(-overdueGrace), resyncBatch)
		if err != nil {
			n.log.Warn("deploy resync: cannot list deployments", "error", err)
			return
		}
		for _, id := range ids {
			d, err := n.o.Store.GetDeployment(ctx, id)
			if err != nil {
				continue
			}
			deadline := d.UpdatedAt.Add(overdueGrace)
			if status == store.StatusNetwork {
				timeout := n.o.DefaultTimeout
				if d.TimeoutSeconds > 0 {
					timeout = time.Duration(d.TimeoutSeconds) * time.Second
				}
				deadline = deadline.Add(timeout)
			}
			if now.After(deadline) {
				overdue[id] = true
				if n.overdueLogged[id] {
					continue
				}
				n.log.Error("a deploy is overdue: its workflow is not making progress (paused or killed in Restate?); "+
					"find it with `restate invocations ls` (workflow DeployWorkflow, key = the deployment id) and resume it",
					"deployment", id, "status", status, "since", d.UpdatedAt)
			}
		}
	}
	n.overdue.Set(float64(len(overdue)))
	n.overdueLogged = overdue
}
