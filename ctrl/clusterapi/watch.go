package clusterapi

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"krane.dev/ctrl/auth"
	"krane.dev/ctrl/store"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
	"krane.dev/shared/kinds"
)

// sink is how one RPC puts events on its wire.
type sink struct {
	change func(store.Change) error
	// wire, when set, sends a change in the generic wire form (built once
	// per change for every stream of a feed).
	wire func(*clusterv1.ResourceChange) error
	// bootstrapComplete and keepAlive are nil for RPCs without such
	// messages (the typed watches).
	// generation is the database generation of the stream's versions.
	bootstrapComplete func(head uint64, generation string) error
	keepAlive         func(head uint64, generation string) error
}

// follow says what a stream does after its snapshot (if any).
type follow int

const (
	// followAlways streams changes after the snapshot (Watch).
	followAlways follow = iota
	// followNever closes after the snapshot (ListDesired).
	followNever
	// followIfResuming: a request from version 0 gets the snapshot and a
	// clean close; a request from a cursor streams changes (typed watches).
	followIfResuming
)

// serve runs one desired-state stream of kind in region from cursor after,
// which the client holds from a stream of database generation generation
// (empty: not known).
func (s *Server) serve(ctx context.Context, kind, region string, after uint64, generation string, f follow, out sink) error {
	gauge := s.m.activeStreams.WithLabelValues(region, s.kindLabel(kind))
	gauge.Inc()
	defer gauge.Dec()

	// A cursor from another history of the database is refused before it
	// is believed (or anchors the shared feed): its versions were, or will
	// be, issued again to other changes.
	if f == followNever {
		after = 0
	}
	who, _ := caller(ctx)
	// A bootstrap takes its place before anything reads the database, so
	// a host refused in a reconnect storm costs ctrl no query.
	bootstrap := after == 0 || f == followNever
	release := func() {}
	if bootstrap {
		var err error
		if release, err = s.admitBootstrap(ctx, who, kind, region); err != nil {
			return err
		}
	}
	released := false
	defer func() {
		if !released {
			release()
		}
	}()
	gen, err := s.store.CheckCursor(ctx, who.ClusterID, region, after, generation)
	if err != nil {
		var ce *store.CursorError
		if errors.As(err, &ce) {
			why := "other-generation"
			if ce.After > ce.Head {
				why = "ahead-of-head"
			}
			s.m.cursorRefused.WithLabelValues(region, why).Inc()
			s.log.Warn("refusing a stream whose cursor belongs to another history of the database; the host bootstraps this kind again",
				"cluster", who.ClusterID, "kind", kind, "region", region, "after_version", after, "head", ce.Head, "generation", generation,
				"current_generation", ce.Current, "new_generation_now", ce.Detected)
			return status.Error(codes.OutOfRange, ce.Error())
		}
		return fmt.Errorf("cannot check the stream's cursor: %w", err)
	}

	cursor := after
	if bootstrap {
		head, err := s.snapshot(ctx, kind, region, out)
		release()
		released = true
		if err != nil {
			return err
		}
		if out.bootstrapComplete != nil {
			if err := out.bootstrapComplete(head, gen); err != nil {
				return err
			}
		}
		if f != followAlways {
			return nil
		}
		cursor = head
	}
	return s.stream(ctx, kind, region, cursor, gen, after > 0, out)
}

// admitBootstrap takes one of the MaxBootstraps places of a snapshot,
// waiting in line for one while fewer than BootstrapQueue wait, or
// refuses the stream with RESOURCE_EXHAUSTED and a RetryInfo of
// BootstrapRetry plus up to as much again at random (so the hosts refused
// in one reconnect storm do not all come back at the same moment). The
// caller calls release once its snapshot is sent.
func (s *Server) admitBootstrap(ctx context.Context, who auth.Identity, kind, region string) (release func(), err error) {
	if s.bootstraps == nil {
		return func() {}, nil
	}
	if !s.takeBootstrapPlace(ctx) {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		s.m.bootstrapRefuse.Inc()
		wait := s.bootstrapRetry + rand.N(s.bootstrapRetry)
		st := status.Newf(codes.ResourceExhausted, "ctrl is sending %d bootstraps (full snapshots) already, its limit; the snapshot of %s in region %q for cluster %q was not started: reconnect from version 0 after %s",
			cap(s.bootstraps), kind, region, who.ClusterID, wait.Round(time.Millisecond))
		if d, err := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(wait)}); err == nil {
			st = d
		}
		return nil, st.Err()
	}
	s.m.bootstraps.Inc()
	if s.beforeSnapshot != nil {
		s.beforeSnapshot()
	}
	return func() {
		s.m.bootstraps.Dec()
		<-s.bootstraps
	}, nil
}

// takeBootstrapPlace takes a place at once, or waits for one (until ctx
// ends) when fewer than bootstrapQueue already wait.
func (s *Server) takeBootstrapPlace(ctx context.Context) bool {
	select {
	case s.bootstraps <- struct{}{}:
		return true
	default:
	}
	if s.bootstrapWaiting.Add(1) > s.bootstrapQueue {
		s.bootstrapWaiting.Add(-1)
		return false
	}
	defer s.bootstrapWaiting.Add(-1)
	select {
	case s.bootstraps <- struct{}{}:
		return true
	case <-ctx.Done():
		return false
	}
}

// snapshot sends every live row of kind in region from one consistent
// snapshot, page by page, and returns the version it is consistent with.
func (s *Server) snapshot(ctx context.Context, kind, region string, out sink) (uint64, error) {
	start := time.Now()
	sn, err := s.store.OpenSnapshot(ctx, kind, region)
	if err != nil {
		return 0, fmt.Errorf("cannot start the snapshot: %w", err)
	}
	defer sn.Close()
	label := s.kindLabel(kind)
	rows := s.m.rowsStreamed.WithLabelValues(region, label, "bootstrap")
	queries := s.m.watchQuery.WithLabelValues(label, "bootstrap")
	sent := 0
	for !sn.Done() {
		qStart := time.Now()
		page, err := sn.Next(ctx, s.pageSize)
		queries.Observe(time.Since(qStart).Seconds())
		if err != nil {
			return 0, fmt.Errorf("snapshot page failed; reconnect from version 0: %w", err)
		}
		for _, c := range page {
			if !s.convertible(c, region) {
				continue
			}
			if err := out.change(c); err != nil {
				return 0, err
			}
			sent++
			rows.Inc()
		}
	}
	elapsed := time.Since(start)
	s.m.bootstrapStream.WithLabelValues(label).Observe(elapsed.Seconds())
	s.log.Debug("snapshot sent", "kind", kind, "region", region, "rows", sent, "head", sn.Head(), "duration", elapsed)
	return sn.Head(), nil
}

// stream sends every change with version > cursor as it commits, until the
// client goes away, the server stops, or the database fails. With
// announce, it sends a KeepAlive as soon as it has caught up, so a client
// resuming from a cursor knows it has everything up to the head.
func (s *Server) stream(ctx context.Context, kind, region string, cursor uint64, gen string, announce bool, out sink) error {
	key := store.HeadKey{Region: region, Kind: kind}
	f := s.feeds.acquire(key)
	defer s.feeds.release(f)
	ticker := time.NewTicker(s.keepAlive)
	defer ticker.Stop()
	keepAliveDue := announce
	var recheck time.Time
	for {
		// Take the wake-up channel before reading, so a commit that lands
		// after the read still wakes us.
		wake := s.poller.wait(key)
		if s.poller.isFailing() {
			recheck = time.Now() // the heads say nothing: ask the database
		}
		var err error
		if cursor, err = s.catchUp(ctx, f, key, cursor, recheck, out); err != nil {
			return err
		}
		recheck = time.Time{}
		if keepAliveDue && out.keepAlive != nil {
			if err := out.keepAlive(max(cursor, s.poller.head(key)), gen); err != nil {
				return err
			}
		}
		keepAliveDue = false
		select {
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		case <-s.stopping:
			return status.Errorf(codes.Unavailable, "ctrl is shutting down; reconnect with after_version=%d", cursor)
		case <-wake:
		case <-ticker.C:
			// A safety net behind the head poller: the feed re-reads the
			// database if no read of it started within the interval (one
			// query per feed, whatever its streams).
			keepAliveDue, recheck = true, time.Now().Add(-s.keepAlive)
		}
	}
}

// catchUp sends the changes after cursor up to the head the poller has
// seen (with recheck set, also everything a read started after recheck
// finds), from the feed where the cursor is inside its window and from the
// database where it is behind. It returns the new cursor.
func (s *Server) catchUp(ctx context.Context, f *feed, key store.HeadKey, cursor uint64, recheck time.Time, out sink) (uint64, error) {
	kind, region := key.Kind, key.Region
	label := s.kindLabel(kind)
	rows := s.m.rowsStreamed.WithLabelValues(region, label, "stream")
	send := func(c store.Change, fe *feedEntry) error {
		if !s.convertible(c, region) {
			return nil // skipped, and the cursor moves past it: it must not block the stream
		}
		var err error
		if fe != nil {
			err = out.feedChange(fe)
		} else {
			err = out.change(c)
		}
		if err == nil {
			rows.Inc()
		}
		return err
	}
	resume := func(err error) error {
		return fmt.Errorf("%s: %w", "reading changes failed; reconnect with after_version="+strconv.FormatUint(cursor, 10), err)
	}
	// The target is read before asOf: every version up to it committed
	// before asOf.
	goal := fetchGoal{target: s.poller.head(key), asOf: time.Now(), recheck: recheck}
	for {
		if entries, ok := f.after(cursor); ok {
			for _, e := range entries {
				if err := send(e.c, e); err != nil {
					return cursor, err
				}
				cursor = e.c.Version
			}
			s.m.delivered.WithLabelValues("feed").Add(float64(len(entries)))
			if f.done(cursor, goal) {
				return cursor, nil
			}
			if err := f.fetch(ctx, s, kind, region, goal); err != nil {
				return cursor, resume(err)
			}
			continue
		}
		// Behind the window (or no window yet): read the database.
		qStart := time.Now()
		page, err := s.store.ChangesAfter(ctx, kind, region, cursor, s.pageSize)
		s.m.watchQuery.WithLabelValues(label, "stream").Observe(time.Since(qStart).Seconds())
		if err != nil {
			return cursor, resume(err)
		}
		for _, c := range page {
			if err := send(c, nil); err != nil {
				return cursor, err
			}
			cursor = c.Version
		}
		s.m.delivered.WithLabelValues("database").Add(float64(len(page)))
		if len(page) == s.pageSize {
			continue
		}
		// Caught up with everything committed before the read: this
		// stream's cursor is a sound start for the pair's window.
		f.anchor(cursor)
		if entries, ok := f.after(cursor); !ok || len(entries) == 0 {
			return cursor, nil
		}
	}
}

// feedChange sends a change taken from a feed.
func (out sink) feedChange(e *feedEntry) error {
	if out.wire == nil {
		return out.change(e.c)
	}
	rc, err := e.resourceChange()
	if err != nil {
		return err
	}
	return out.wire(rc)
}

// convertible logs and counts a row that cannot be converted; such a row is
// skipped (see the package documentation).
func (s *Server) convertible(c store.Change, region string) bool {
	if c.Err == nil {
		return true
	}
	s.m.skippedRows.WithLabelValues(s.kindLabel(c.Kind)).Inc()
	s.log.Error("skipping a desired-state row that cannot be converted; fix the row and write it again (it gets a new version)",
		"kind", c.Kind, "region", region, "id", c.ID, "version", c.Version, "error", c.Err)
	return false
}

// resourceChange is the generic wire form: no payload for deletes.
func resourceChange(c store.Change) (*clusterv1.ResourceChange, error) {
	rc := &clusterv1.ResourceChange{Kind: c.Kind, Id: c.ID, Version: c.Version, Deleted: c.Deleted, Traceparent: c.TraceParent}
	if !c.Deleted {
		spec, err := anypb.New(c.Spec)
		if err != nil {
			return nil, status.Errorf(codes.Internal, "pack %s %s: %v", c.Kind, c.ID, err)
		}
		rc.Spec = spec
	}
	return rc, nil
}

func genericSink(send func(*clusterv1.WatchEvent) error) sink {
	wire := func(rc *clusterv1.ResourceChange) error {
		return send(&clusterv1.WatchEvent{Event: &clusterv1.WatchEvent_Change{Change: rc}})
	}
	return sink{
		change: func(c store.Change) error {
			rc, err := resourceChange(c)
			if err != nil {
				return err
			}
			return wire(rc)
		},
		wire: wire,
		bootstrapComplete: func(head uint64, gen string) error {
			return send(&clusterv1.WatchEvent{Event: &clusterv1.WatchEvent_BootstrapComplete{BootstrapComplete: &clusterv1.BootstrapComplete{MaxVersion: head, Generation: gen}}})
		},
		keepAlive: func(head uint64, gen string) error {
			return send(&clusterv1.WatchEvent{Event: &clusterv1.WatchEvent_KeepAlive{KeepAlive: &clusterv1.KeepAlive{HeadVersion: head, ServerTime: timestamppb.Now(), Generation: gen}}})
		},
	}
}

// Watch streams one kind's desired state in the caller's region.
func (s *Server) Watch(req *clusterv1.WatchRequest, stream clusterv1.ClusterService_WatchServer) error {
	ctx := stream.Context()
	id, err := caller(ctx)
	if err != nil {
		return err
	}
	region, err := regionFor(id, req.GetRegion())
	if err != nil {
		return err
	}
	if err := checkKind(req.GetKind()); err != nil {
		return err
	}
	return s.serve(ctx, req.GetKind(), region, req.GetAfterVersion(), req.GetGeneration(), followAlways, genericSink(stream.Send))
}

// ListDesired streams a consistent snapshot of one kind, then closes.
func (s *Server) ListDesired(req *clusterv1.ListDesiredRequest, stream clusterv1.ClusterService_ListDesiredServer) error {
	ctx := stream.Context()
	id, err := caller(ctx)
	if err != nil {
		return err
	}
	region, err := regionFor(id, req.GetRegion())
	if err != nil {
		return err
	}
	if err := checkKind(req.GetKind()); err != nil {
		return err
	}
	return s.serve(ctx, req.GetKind(), region, 0, "", followNever, genericSink(stream.Send))
}

// typedWatch serves the seeds' typed watches on the same machinery.
func (s *Server) typedWatch(ctx context.Context, kind, requestedRegion string, after uint64, send func(store.Change) error) error {
	id, err := caller(ctx)
	if err != nil {
		return err
	}
	region, err := regionFor(id, requestedRegion)
	if err != nil {
		return err
	}
	return s.serve(ctx, kind, region, after, "", followIfResuming, sink{change: send})
}

// WatchDeployments is the typed watch of kind "deployment".
func (s *Server) WatchDeployments(req *clusterv1.WatchDeploymentsRequest, stream clusterv1.ClusterService_WatchDeploymentsServer) error {
	return s.typedWatch(stream.Context(), kinds.Deployment, req.GetRegion(), req.GetVersionLastSeen(), func(c store.Change) error {
		return stream.Send(deploymentState(c))
	})
}

// WatchSentinels is the typed watch of kind "sentinel".
func (s *Server) WatchSentinels(req *clusterv1.WatchSentinelsRequest, stream clusterv1.ClusterService_WatchSentinelsServer) error {
	return s.typedWatch(stream.Context(), kinds.Sentinel, req.GetRegion(), req.GetVersionLastSeen(), func(c store.Change) error {
		return stream.Send(sentinelState(c))
	})
}

// WatchCiliumNetworkPolicies is the typed watch of kind
// "ciliumnetworkpolicy".
func (s *Server) WatchCiliumNetworkPolicies(req *clusterv1.WatchCiliumNetworkPoliciesRequest, stream clusterv1.ClusterService_WatchCiliumNetworkPoliciesServer) error {
	return s.typedWatch(stream.Context(), kinds.CiliumNetworkPolicy, req.GetRegion(), req.GetVersionLastSeen(), func(c store.Change) error {
		return stream.Send(ciliumState(c))
	})
}

func deploymentState(c store.Change) *clusterv1.DeploymentState {
	d := c.Spec.(*clusterv1.Deployment)
	if c.Deleted {
		return &clusterv1.DeploymentState{Version: c.Version, State: &clusterv1.DeploymentState_Delete{
			Delete: &clusterv1.DeleteDeployment{Id: c.ID, K8SNamespace: d.GetK8SNamespace(), K8SName: d.GetK8SName()}}}
	}
	return &clusterv1.DeploymentState{Version: c.Version, State: &clusterv1.DeploymentState_Apply{Apply: d}}
}

func sentinelState(c store.Change) *clusterv1.SentinelState {
	sn := c.Spec.(*clusterv1.Sentinel)
	if c.Deleted {
		return &clusterv1.SentinelState{Version: c.Version, State: &clusterv1.SentinelState_Delete{
			Delete: &clusterv1.DeleteSentinel{Id: c.ID, K8SName: sn.GetK8SName()}}}
	}
	return &clusterv1.SentinelState{Version: c.Version, State: &clusterv1.SentinelState_Apply{Apply: sn}}
}

func ciliumState(c store.Change) *clusterv1.CiliumNetworkPolicyState {
	p := c.Spec.(*clusterv1.CiliumNetworkPolicy)
	if c.Deleted {
		return &clusterv1.CiliumNetworkPolicyState{Version: c.Version, State: &clusterv1.CiliumNetworkPolicyState_Delete{
			Delete: &clusterv1.DeleteCiliumNetworkPolicy{Id: c.ID, K8SNamespace: p.GetK8SNamespace(), K8SName: p.GetK8SName()}}}
	}
	return &clusterv1.CiliumNetworkPolicyState{Version: c.Version, State: &clusterv1.CiliumNetworkPolicyState_Apply{Apply: p}}
}
