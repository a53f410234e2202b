package bench

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"krane.dev/ctrl/auth"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
	"krane.dev/shared/kinds"
)

// The simulated clusters of the fleet benchmark: black-box gRPC clients
// with their own cluster tokens that apply nothing, so the cost measured is
// ctrl's. Each behaves toward ctrl as a krane host does: it follows the
// three built-in kinds, heartbeats every 30 s with its cursors and
// controllers, reports the status of every deployment change it receives
// (after a simulated apply, batched per 50 ms and at most 200 a call like
// krane's reporter), and every minute reports the status of every
// deployment it holds again (the plugins' status resync). The cost of the
// clients themselves is measured too (Load.Bench), since they share the
// machine with ctrl.

// design is how a simulated cluster learns about changes.
type design string

const (
	// streaming: one Watch per kind, open for the whole run.
	streaming design = "streaming"
	// polling: the reference platform's agents, reconnecting every
	// jittered 1-5 s and reading what is new since their cursor (a Watch
	// from the cursor, closed once caught up).
	polling design = "polling"
)

var fleetKinds = []string{kinds.Deployment, kinds.Sentinel, kinds.CiliumNetworkPolicy}

// clusterCreds are a cluster's token and identity on every call.
type clusterCreds struct{ token, region, cluster string }

func (c clusterCreds) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + c.token, auth.RegionHeader: c.region, auth.ClusterIDHeader: c.cluster}, nil
}
func (clusterCreds) RequireTransportSecurity() bool { return false }

// writeKey names one operator write: a deployment scaled to a replica
// count (counts cycle, and a deployment is written again long after any
// delivery of the previous count).
type writeKey struct {
	id       string
	replicas int32
}

// writeRec is one operator write and how many clusters received it.
type writeRec struct {
	sent      time.Time
	region    string
	inWindow  bool
	delivered atomic.Int32
	// acked is when the operator's call returned (unix ns; 0 before):
	// the commit lies between sent and acked.
	acked atomic.Int64
	// deliveredAt are the delivery times, matched with acked at the end.
	mu          sync.Mutex
	deliveredAt []time.Time
}

// fleetRun is the shared state of one measured arm.
type fleetRun struct {
	design design
	rng    *rand.Rand // seeded; jitter only
	rngMu  sync.Mutex

	writesMu sync.Mutex
	writes   map[writeKey]*writeRec

	streamErrors, polls, reports, reportErrors, throttled, heartbeats, heartbeatErrors atomic.Int64
	// rebootstraps are Watch calls from cursor 0 after a stream's first
	// bootstrap (a resume reads from its cursor).
	rebootstraps atomic.Int64
}

func (r *fleetRun) jitter(lo, hi time.Duration) time.Duration {
	r.rngMu.Lock()
	defer r.rngMu.Unlock()
	return lo + time.Duration(r.rng.Int64N(int64(hi-lo)+1))
}

// delivered records that a cluster received a deployment at a replica
// count (once per cluster and write: the caller dedups by version).
func (r *fleetRun) delivered(id string, replicas int32, at time.Time) {
	r.writesMu.Lock()
	w := r.writes[writeKey{id, replicas}]
	r.writesMu.Unlock()
	if w == nil || !w.inWindow {
		return
	}
	w.delivered.Add(1)
	w.mu.Lock()
	w.deliveredAt = append(w.deliveredAt, at)
	w.mu.Unlock()
}

// simCluster is one simulated cluster.
type simCluster struct {
	creds clusterCreds
	run   *fleetRun
	conn  *grpc.ClientConn
	cli   clusterv1.ClusterServiceClient

	// cursors are the streams' cursors, by fleetKinds index (heartbeats
	// carry them); caughtUp is when each stream last caught up after
	// (re)connecting (unix ns), for the reconnect storm.
	cursors  [3]atomic.Uint64
	caughtUp [3]atomic.Int64

	reportMu sync.Mutex
	pending  []*clusterv1.ReportStatusRequest
	// held is the latest status of each deployment the cluster runs,
	// reported again every minute.
	held     map[string]*clusterv1.ReportStatusRequest
	flushing bool
}

// reportBatch is what one report call carries at most (krane's reporter).
const reportBatch = 200

func dialCluster(addr string, creds clusterCreds, run *fleetRun) (*simCluster, error) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithPerRPCCredentials(creds), grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20)))
	if err != nil {
		return nil, err
	}
	return &simCluster{creds: creds, run: run, conn: conn, cli: clusterv1.NewClusterServiceClient(conn), held: map[string]*clusterv1.ReportStatusRequest{}}, nil
}

// start runs the cluster until ctx ends; bootstrapped is told once per
// kind when its first bootstrap is complete.
func (c *simCluster) start(ctx context.Context, wg *sync.WaitGroup, bootstrapped chan<- struct{}) {
	for i, kind := range fleetKinds {
		wg.Go(func() {
			if c.run.design == streaming {
				c.stream(ctx, i, kind, bootstrapped)
			} else {
				c.poll(ctx, i, kind, bootstrapped)
			}
		})
	}
	wg.Go(func() { c.heartbeat(ctx) })
	wg.Go(func() { c.resync(ctx) })
}

// follow reads one Watch until it ends or, with untilCaughtUp, until the
// stream says it has caught up (BootstrapComplete or KeepAlive); it
// returns the new cursor.
func (c *simCluster) follow(ctx context.Context, ki int, kind string, cursor uint64, untilCaughtUp bool, seen map[string]uint64, bootstrapped func()) (uint64, error) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := c.cli.Watch(sctx, &clusterv1.WatchRequest{Kind: kind, AfterVersion: cursor})
	if err != nil {
		return cursor, err
	}
	inBootstrap := cursor == 0
	caught := false
	caughtUp := func() {
		if !caught {
			caught = true
			c.caughtUp[ki].Store(time.Now().UnixNano())
		}
	}
	for {
		ev, err := st.Recv()
		if err != nil {
			return cursor, err
		}
		switch e := ev.GetEvent().(type) {
		case *clusterv1.WatchEvent_Change:
			ch := e.Change
			if ch.GetVersion() > cursor && !inBootstrap {
				cursor = ch.GetVersion()
				c.cursors[ki].Store(cursor)
			}
			if kind == kinds.Deployment && ch.GetVersion() > seen[ch.GetId()] {
				seen[ch.GetId()] = ch.GetVersion()
				// A bootstrap's objects are applied and held (their status
				// goes with the next resync); a live change is reported now.
				c.received(ch, !inBootstrap)
			}
		case *clusterv1.WatchEvent_BootstrapComplete:
			inBootstrap = false
			cursor = max(cursor, e.BootstrapComplete.GetMaxVersion())
			c.cursors[ki].Store(cursor)
			caughtUp()
			bootstrapped()
			if untilCaughtUp {
				return cursor, nil
			}
		case *clusterv1.WatchEvent_KeepAlive:
			caughtUp()
			if untilCaughtUp {
				return cursor, nil
			}
		}
	}
}

// stream keeps one Watch open, reconnecting from its cursor if it breaks.
func (c *simCluster) stream(ctx context.Context, ki int, kind string, bootstrapped chan<- struct{}) {
	var cursor uint64
	seen := map[string]uint64{}
	var once sync.Once
	for first := true; ctx.Err() == nil; first = false {
		if cursor == 0 && !first {
			c.run.rebootstraps.Add(1)
		}
		var err error
		cursor, err = c.follow(ctx, ki, kind, cursor, false, seen, func() { once.Do(func() { bootstrapped <- struct{}{} }) })
		if ctx.Err() != nil {
			return
		}
		c.run.streamErrors.Add(1)
		// As krane's loop: ctrl's retry hint (a bootstrap refused in a
		// storm) plus up to a quarter more, else the jittered reconnect.
		wait := c.run.jitter(time.Second, 5*time.Second)
		if hint, ok := retryHint(err); ok {
			wait = hint + c.run.jitter(0, hint/4)
		}
		sleepCtxBench(ctx, wait)
	}
}

// poll is the reference design: every jittered 1-5 s, read what is new
// since the cursor and hang up.
func (c *simCluster) poll(ctx context.Context, ki int, kind string, bootstrapped chan<- struct{}) {
	var cursor uint64
	seen := map[string]uint64{}
	var once sync.Once
	sleepCtxBench(ctx, c.run.jitter(0, 5*time.Second)) // spread the first polls
	for ctx.Err() == nil {
		var err error
		c.run.polls.Add(1)
		cursor, err = c.follow(ctx, ki, kind, cursor, true, seen, func() { once.Do(func() { bootstrapped <- struct{}{} }) })
		if err != nil && ctx.Err() == nil && !errors.Is(err, context.Canceled) {
			c.run.streamErrors.Add(1)
		}
		sleepCtxBench(ctx, c.run.jitter(time.Second, 5*time.Second))
	}
}

// received handles a deployment change: it holds the object's status
// (for the resync) and, for a live change (report), counts the delivery
// and queues a status report, sent after a simulated apply.
func (c *simCluster) received(ch *clusterv1.ResourceChange, report bool) {
	now := time.Now()
	var d clusterv1.Deployment
	if !ch.GetDeleted() {
		if err := ch.GetSpec().UnmarshalTo(&d); err != nil {
			return
		}
	}
	if report {
		c.run.delivered(ch.GetId(), d.GetReplicas(), now)
	}
	st := &clusterv1.DeploymentStatus{DeploymentId: ch.GetId(), K8SName: d.GetK8SName(), DesiredReplicas: d.GetReplicas(),
		ReadyReplicas: d.GetReplicas(), AvailableReplicas: d.GetReplicas(), Deleted: ch.GetDeleted()}
	for i := range d.GetReplicas() {
		st.Instances = append(st.Instances, &clusterv1.Instance{K8SName: fmt.Sprintf("%s-%d", d.GetK8SName(), i),
			Address: "10.0.0.1:8080", Status: clusterv1.Instance_STATUS_RUNNING, CpuMillicores: d.GetWorkload().GetCpuMillicores(), MemoryMib: d.GetWorkload().GetMemoryMib()})
	}
	status, err := anypb.New(st)
	if err != nil {
		return
	}
	req := &clusterv1.ReportStatusRequest{Kind: kinds.Deployment, Id: ch.GetId(), ObservedVersion: ch.GetVersion(), ObservedAt: timestamppb.New(now), Status: status}
	c.reportMu.Lock()
	if ch.GetDeleted() {
		delete(c.held, ch.GetId())
	} else {
		c.held[ch.GetId()] = req
	}
	if !report {
		c.reportMu.Unlock()
		return
	}
	c.pending = append(c.pending, req)
	start := !c.flushing
	c.flushing = true
	c.reportMu.Unlock()
	if start {
		// The apply and krane's 50 ms linger, then one call for what queued.
		time.AfterFunc(c.run.jitter(50*time.Millisecond, 150*time.Millisecond), c.flush)
	}
}

// resync reports every held status again each minute, from a jittered
// start, as the plugins' status resync does.
func (c *simCluster) resync(ctx context.Context) {
	sleepCtxBench(ctx, c.run.jitter(0, time.Minute))
	for ctx.Err() == nil {
		now := timestamppb.Now()
		c.reportMu.Lock()
		queued := map[string]bool{}
		for _, r := range c.pending {
			queued[r.GetId()] = true
		}
		for id, r := range c.held {
			if !queued[id] {
				c.pending = append(c.pending, &clusterv1.ReportStatusRequest{Kind: r.GetKind(), Id: id,
					ObservedVersion: r.GetObservedVersion(), ObservedAt: now, Status: r.GetStatus()})
			}
		}
		start := !c.flushing && len(c.pending) > 0
		if start {
			c.flushing = true
		}
		c.reportMu.Unlock()
		if start {
			time.AfterFunc(c.run.jitter(50*time.Millisecond, 150*time.Millisecond), c.flush)
		}
		sleepCtxBench(ctx, time.Minute)
	}
}

func (c *simCluster) flush() {
	c.reportMu.Lock()
	n := min(len(c.pending), reportBatch)
	batch := c.pending[:n:n]
	c.pending = c.pending[n:]
	c.reportMu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c.run.reports.Add(int64(len(batch)))
	_, err := c.cli.ReportStatuses(ctx, &clusterv1.ReportStatusesRequest{Reports: batch})
	if st, ok := status.FromError(err); ok && st.Code() == codes.ResourceExhausted {
		// As krane's reporter: wait the hint, then send what is newest of
		// each object (the refused batch merged under what queued since).
		c.run.throttled.Add(1)
		wait := time.Second
		for _, d := range st.Details() {
			if ri, ok := d.(*errdetails.RetryInfo); ok {
				wait = ri.GetRetryDelay().AsDuration()
			}
		}
		c.reportMu.Lock()
		newer := map[string]bool{}
		for _, r := range c.pending {
			newer[r.GetId()] = true
		}
		for _, r := range batch {
			if !newer[r.GetId()] {
				c.pending = append(c.pending, r)
			}
		}
		c.reportMu.Unlock()
		time.AfterFunc(wait+c.run.jitter(0, wait/2), c.flush)
		return
	}
	if err != nil {
		c.run.reportErrors.Add(1)
	}
	c.reportMu.Lock()
	if len(c.pending) > 0 {
		// Reports queued while this call was out: their own call.
		time.AfterFunc(c.run.jitter(50*time.Millisecond, 150*time.Millisecond), c.flush)
	} else {
		c.flushing = false
	}
	c.reportMu.Unlock()
}

func (c *simCluster) heartbeat(ctx context.Context) {
	sleepCtxBench(ctx, c.run.jitter(0, 30*time.Second))
	for ctx.Err() == nil {
		hctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		cursors := map[string]uint64{}
		for i, k := range fleetKinds {
			cursors[k] = c.cursors[i].Load()
		}
		_, err := c.cli.Heartbeat(hctx, &clusterv1.HeartbeatRequest{AgentVersion: "fleet-sim", Cursors: cursors, HostReport: true,
			Parked: map[string]int32{}, Controllers: simControllers})
		cancel()
		c.run.heartbeats.Add(1)
		if err != nil && ctx.Err() == nil {
			c.run.heartbeatErrors.Add(1)
		}
		sleepCtxBench(ctx, 30*time.Second)
	}
}

// retryHint is the RetryInfo ctrl attached to a refusal.
func retryHint(err error) (time.Duration, bool) {
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.ResourceExhausted {
		return 0, false
	}
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			return ri.GetRetryDelay().AsDuration(), true
		}
	}
	return 0, false
}

// simControllers are what a simulated host says it runs.
var simControllers = []*clusterv1.ControllerStatus{
	{Name: "deployment", PluginVersion: "fleet-sim", Kinds: []string{kinds.Deployment}, Running: true},
	{Name: "sentinel", PluginVersion: "fleet-sim", Kinds: []string{kinds.Sentinel}, Running: true},
	{Name: "cilium", PluginVersion: "fleet-sim", Kinds: []string{kinds.CiliumNetworkPolicy}, Running: true},
}

func sleepCtxBench(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
