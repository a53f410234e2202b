// Package clustertest is a ClusterService server for host tests: real gRPC
// on a real listener, in-memory desired state with ctrl's semantics
// (global versions, snapshot bootstrap with an explicit BootstrapComplete,
// a live stream of changes, keep-alives, bearer-token auth bound to one
// region). Tests write desired state with Put/Delete and read what the host
// reported back. ctrl's own server is tested against MySQL elsewhere; this
// one lets host tests run without ctrl.
package clustertest

import (
	"context"
	"fmt"
	"net"
	"sort"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	clusterv1 "krane.dev/proto/krane/cluster/v1"
)

// Server is a ClusterService for one region.
type Server struct {
	clusterv1.UnimplementedClusterServiceServer

	Region string
	Token  string

	addr string
	srv  *grpc.Server

	mu       sync.Mutex
	head     uint64
	objects  map[key]*clusterv1.ResourceChange
	changes  []*clusterv1.ResourceChange // in version order
	notify   chan struct{}
	reports  map[key][]*clusterv1.ReportStatusRequest
	streams  map[int]context.CancelFunc
	streamID int
	watches  []*clusterv1.WatchRequest
	refuse   bool
	refused  int
	batches  int
	// stalled holds every stream silent (no change, no keep-alive), as a
	// ctrl that is alive but not answering; stallChanged wakes them.
	stalled      bool
	stallChanged chan struct{}
	open         int // Watch and ListDesired calls being served
	openLists    int
	lists        int
	// Older ctrl (no ReportStatuses) and objects ctrl does not know.
	noBatches bool
	unknown   map[string]bool
	rejected  int
	// heartbeats received, oldest first.
	heartbeats       []*clusterv1.HeartbeatRequest
	refuseHeartbeats bool
	// KeepAlive is the idle keep-alive interval.
	KeepAlive time.Duration
	// generation names the history of versions (see Restore).
	generation int
	// refuseBootstraps Watch calls from version 0 are still to be refused
	// with RESOURCE_EXHAUSTED and a RetryInfo of bootstrapHint;
	// watchTimes holds when each Watch call arrived.
	refuseBootstraps int
	bootstrapHint    time.Duration
	watchTimes       []time.Time
}

type key struct{ kind, id string }

// Start serves a ClusterService for region on 127.0.0.1 until the test ends.
func Start(tb testing.TB, region, token string) *Server {
	tb.Helper()
	s := &Server{Region: region, Token: token, objects: map[key]*clusterv1.ResourceChange{}, notify: make(chan struct{}),
		reports: map[key][]*clusterv1.ReportStatusRequest{}, streams: map[int]context.CancelFunc{}, KeepAlive: time.Second,
		stallChanged: make(chan struct{})}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	s.addr = l.Addr().String()
	s.srv = grpc.NewServer(grpc.UnaryInterceptor(s.authUnary), grpc.StreamInterceptor(s.authStream))
	clusterv1.RegisterClusterServiceServer(s.srv, s)
	go func() { _ = s.srv.Serve(l) }()
	tb.Cleanup(s.srv.Stop)
	return s
}

// URL is the server's address for krane.hcl (plaintext).
func (s *Server) URL() string { return "http://" + s.addr }

// Put commits a desired state and returns its version.
func (s *Server) Put(kind, id string, spec proto.Message) uint64 {
	a, err := anypb.New(spec)
	if err != nil {
		panic(err)
	}
	return s.commit(&clusterv1.ResourceChange{Kind: kind, Id: id, Spec: a})
}

// PutJSON commits a JSON desired state (a google.protobuf.Struct spec).
func (s *Server) PutJSON(kind, id string, v map[string]any) uint64 {
	st, err := structpb.NewStruct(v)
	if err != nil {
		panic(err)
	}
	return s.Put(kind, id, st)
}

// Delete commits a soft delete and returns its version.
func (s *Server) Delete(kind, id string) uint64 {
	return s.commit(&clusterv1.ResourceChange{Kind: kind, Id: id, Deleted: true})
}

func (s *Server) commit(c *clusterv1.ResourceChange) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.head++
	c.Version = s.head
	s.objects[key{c.Kind, c.Id}] = c
	s.changes = append(s.changes, c)
	close(s.notify)
	s.notify = make(chan struct{})
	return c.Version
}

// Restore takes the desired state back to what it was at version to, as a
// database restored from a backup taken then (or a replica that lagged):
// later changes are lost, their versions will be issued again, and the
// history gets a new generation. Open streams are dropped.
func (s *Server) Restore(to uint64) {
	s.mu.Lock()
	i := sort.Search(len(s.changes), func(i int) bool { return s.changes[i].Version > to })
	s.changes = s.changes[:i:i]
	s.objects = map[key]*clusterv1.ResourceChange{}
	for _, c := range s.changes {
		s.objects[key{c.Kind, c.Id}] = c
	}
	s.head = to
	s.generation++
	s.mu.Unlock()
	s.DropStreams()
}

func (s *Server) generationLocked() string { return fmt.Sprintf("gen-%d", s.generation) }

// Head is the newest version.
func (s *Server) Head() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.head
}

// DropStreams ends every open stream with Unavailable (a ctrl restart).
func (s *Server) DropStreams() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, cancel := range s.streams {
		cancel()
	}
}

// Stall makes every stream go silent, new ones included: no change, no
// keep-alive, no error, as from a ctrl that is stopped (SIGSTOP) or behind
// a black-holed link. Resume ends it.
func (s *Server) Stall() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stalled = true
}

// Resume ends a Stall: silent streams carry on where they were.
func (s *Server) Resume() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stalled = false
	close(s.stallChanged)
	s.stallChanged = make(chan struct{})
}

// waitUnstalled blocks while the server is stalled.
func (s *Server) waitUnstalled(ctx context.Context) error {
	for {
		s.mu.Lock()
		stalled, changed := s.stalled, s.stallChanged
		s.mu.Unlock()
		if !stalled {
			return nil
		}
		select {
		case <-ctx.Done():
			return status.Error(codes.Canceled, "stream closed while stalled")
		case <-changed:
		}
	}
}

// OpenStreams counts Watch and ListDesired calls being served now: a
// client that forgets a stream shows up here.
func (s *Server) OpenStreams() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.open
}

// OpenLists counts ListDesired calls being served now.
func (s *Server) OpenLists() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.openLists
}

// Lists counts ListDesired calls so far (one per resync).
func (s *Server) Lists() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lists
}

// Watches returns every Watch request so far (reconnects included).
func (s *Server) Watches() []*clusterv1.WatchRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*clusterv1.WatchRequest(nil), s.watches...)
}

// Reports returns every report received for an object, oldest first.
func (s *Server) Reports(kind, id string) []*clusterv1.ReportStatusRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*clusterv1.ReportStatusRequest(nil), s.reports[key{kind, id}]...)
}

// LatestReport returns the newest report for an object, or nil.
func (s *Server) LatestReport(kind, id string) *clusterv1.ReportStatusRequest {
	r := s.Reports(kind, id)
	if len(r) == 0 {
		return nil
	}
	return r[len(r)-1]
}

// RefuseBootstraps makes the next n Watch calls from version 0 fail as a
// ctrl at its bootstrap limit does: RESOURCE_EXHAUSTED with a RetryInfo
// of hint.
func (s *Server) RefuseBootstraps(n int, hint time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.refuseBootstraps, s.bootstrapHint = n, hint
}

// WatchTimes returns when each Watch call arrived, oldest first.
func (s *Server) WatchTimes() []time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Time(nil), s.watchTimes...)
}

func (s *Server) Watch(req *clusterv1.WatchRequest, st clusterv1.ClusterService_WatchServer) error {
	ctx, done := s.track(st.Context())
	defer done()
	s.mu.Lock()
	s.watches = append(s.watches, req)
	s.watchTimes = append(s.watchTimes, time.Now())
	if req.GetAfterVersion() == 0 && s.refuseBootstraps > 0 {
		s.refuseBootstraps--
		hint := s.bootstrapHint
		s.mu.Unlock()
		refusal, err := status.New(codes.ResourceExhausted, "ctrl is sending its limit of bootstraps; reconnect later").
			WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(hint)})
		if err != nil {
			return err
		}
		return refusal.Err()
	}
	s.mu.Unlock()
	cursor := req.GetAfterVersion()
	if err := s.waitUnstalled(ctx); err != nil {
		return err
	}
	s.mu.Lock()
	gen, head := s.generationLocked(), s.head
	s.mu.Unlock()
	if cursor > 0 && (cursor > head || req.GetGeneration() != "" && req.GetGeneration() != gen) {
		return status.Errorf(codes.OutOfRange, "cursor %d (generation %q) is from another history: head %d, generation %s", cursor, req.GetGeneration(), head, gen)
	}
	if cursor == 0 {
		snap, head := s.snapshot(req.GetKind())
		for _, c := range snap {
			if err := st.Send(&clusterv1.WatchEvent{Event: &clusterv1.WatchEvent_Change{Change: c}}); err != nil {
				return err
			}
		}
		if err := st.Send(&clusterv1.WatchEvent{Event: &clusterv1.WatchEvent_BootstrapComplete{BootstrapComplete: &clusterv1.BootstrapComplete{MaxVersion: head, Generation: gen}}}); err != nil {
			return err
		}
		cursor = head
	}
	for {
		s.mu.Lock()
		var batch []*clusterv1.ResourceChange
		i := sort.Search(len(s.changes), func(i int) bool { return s.changes[i].Version > cursor })
		for _, c := range s.changes[i:] {
			if c.Kind == req.GetKind() {
				batch = append(batch, c)
			}
		}
		if len(s.changes) > 0 {
			cursor = max(cursor, s.changes[len(s.changes)-1].Version)
		}
		notify, head := s.notify, s.head
		s.mu.Unlock()
		if err := s.waitUnstalled(ctx); err != nil {
			return err
		}
		for _, c := range batch {
			if err := st.Send(&clusterv1.WatchEvent{Event: &clusterv1.WatchEvent_Change{Change: c}}); err != nil {
				return err
			}
		}
		select {
		case <-ctx.Done():
			return status.Error(codes.Unavailable, "stream closed by the server")
		case <-notify:
		case <-time.After(s.KeepAlive):
			if err := s.waitUnstalled(ctx); err != nil {
				return err
			}
			ka := &clusterv1.KeepAlive{HeadVersion: head, ServerTime: timestamppb.Now(), Generation: gen}
			if err := st.Send(&clusterv1.WatchEvent{Event: &clusterv1.WatchEvent_KeepAlive{KeepAlive: ka}}); err != nil {
				return err
			}
		}
	}
}

func (s *Server) ListDesired(req *clusterv1.ListDesiredRequest, st clusterv1.ClusterService_ListDesiredServer) error {
	ctx, done := s.track(st.Context())
	defer done()
	s.mu.Lock()
	s.lists++
	s.openLists++
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.openLists--
		s.mu.Unlock()
	}()
	if err := s.waitUnstalled(ctx); err != nil {
		return err
	}
	snap, head := s.snapshot(req.GetKind())
	for _, c := range snap {
		if err := st.Send(&clusterv1.WatchEvent{Event: &clusterv1.WatchEvent_Change{Change: c}}); err != nil {
			return err
		}
	}
	return st.Send(&clusterv1.WatchEvent{Event: &clusterv1.WatchEvent_BootstrapComplete{BootstrapComplete: &clusterv1.BootstrapComplete{MaxVersion: head}}})
}

func (s *Server) GetDesiredState(_ context.Context, req *clusterv1.GetDesiredStateRequest) (*clusterv1.ResourceChange, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.objects[key{req.GetKind(), req.GetId()}]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "%s %s not found", req.GetKind(), req.GetId())
	}
	return c, nil
}

// RefuseReports makes ReportStatus fail with Unavailable (ctrl down) or
// accept again.
func (s *Server) RefuseReports(refuse bool) {
	s.mu.Lock()
	s.refuse = refuse
	s.mu.Unlock()
}

// Refused counts report calls refused so far.
func (s *Server) Refused() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.refused
}

func (s *Server) ReportStatus(_ context.Context, req *clusterv1.ReportStatusRequest) (*clusterv1.ReportStatusResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.refuse {
		s.refused++
		return nil, status.Error(codes.Unavailable, "ctrl is down")
	}
	if err := s.record(req); err != nil {
		return nil, err
	}
	return &clusterv1.ReportStatusResponse{Accepted: true}, nil
}

// record keeps a report, or refuses one on an object ctrl does not know.
// The caller holds s.mu.
func (s *Server) record(req *clusterv1.ReportStatusRequest) error {
	if s.unknown[req.GetId()] {
		s.rejected++
		return status.Errorf(codes.NotFound, "no %s %q", req.GetKind(), req.GetId())
	}
	k := key{req.GetKind(), req.GetId()}
	s.reports[k] = append(s.reports[k], req)
	return nil
}

// ActLikeOlderCtrl makes ReportStatuses unimplemented, as in a ctrl that
// predates it.
func (s *Server) ActLikeOlderCtrl() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.noBatches = true
}

// Forget makes reports on id answer NOT_FOUND, as for an object ctrl does
// not have; Rejected counts them.
func (s *Server) Forget(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.unknown == nil {
		s.unknown = map[string]bool{}
	}
	s.unknown[id] = true
}

// Rejected counts reports answered NOT_FOUND.
func (s *Server) Rejected() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rejected
}

// ReportStatuses records a batch as ReportStatus records each report (a
// refusal refuses the whole call, as a ctrl without its database would).
func (s *Server) ReportStatuses(_ context.Context, req *clusterv1.ReportStatusesRequest) (*clusterv1.ReportStatusesResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.refuse {
		s.refused++
		return nil, status.Error(codes.Unavailable, "ctrl is down")
	}
	if s.noBatches {
		return nil, status.Error(codes.Unimplemented, "unknown method ReportStatuses")
	}
	out := &clusterv1.ReportStatusesResponse{}
	for _, r := range req.GetReports() {
		if err := s.record(r); err != nil {
			st := status.Convert(err)
			out.Results = append(out.Results, &clusterv1.ReportStatusResult{Code: int32(st.Code()), Message: st.Message()})
			continue
		}
		out.Results = append(out.Results, &clusterv1.ReportStatusResult{Accepted: true})
	}
	s.batches++
	return out, nil
}

// Batches counts ReportStatuses calls so far.
func (s *Server) Batches() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.batches
}

func (s *Server) Heartbeat(_ context.Context, req *clusterv1.HeartbeatRequest) (*clusterv1.HeartbeatResponse, error) {
	s.mu.Lock()
	refuse := s.refuseHeartbeats
	if !refuse {
		s.heartbeats = append(s.heartbeats, proto.Clone(req).(*clusterv1.HeartbeatRequest))
	}
	s.mu.Unlock()
	if refuse {
		return nil, status.Error(codes.Unavailable, "heartbeats refused (test)")
	}
	return &clusterv1.HeartbeatResponse{HeadVersion: s.Head()}, nil
}

// RefuseHeartbeats makes Heartbeat fail with UNAVAILABLE (as a ctrl whose
// database is down) while on.
func (s *Server) RefuseHeartbeats(on bool) {
	s.mu.Lock()
	s.refuseHeartbeats = on
	s.mu.Unlock()
}

// Heartbeats returns the heartbeats received so far, oldest first.
func (s *Server) Heartbeats() []*clusterv1.HeartbeatRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*clusterv1.HeartbeatRequest(nil), s.heartbeats...)
}

// snapshot returns the live objects of kind, ordered by version, and head.
func (s *Server) snapshot(kind string) ([]*clusterv1.ResourceChange, uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*clusterv1.ResourceChange
	for k, c := range s.objects {
		if k.kind == kind && !c.Deleted {
			out = append(out, c)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	return out, s.head
}

func (s *Server) track(ctx context.Context) (context.Context, func()) {
	ctx, cancel := context.WithCancel(ctx)
	s.mu.Lock()
	s.streamID++
	id := s.streamID
	s.streams[id] = cancel
	s.open++
	s.mu.Unlock()
	return ctx, func() {
		cancel()
		s.mu.Lock()
		delete(s.streams, id)
		s.open--
		s.mu.Unlock()
	}
}

func (s *Server) check(ctx context.Context) error {
	md, _ := metadata.FromIncomingContext(ctx)
	if got := md.Get("authorization"); len(got) != 1 || got[0] != "Bearer "+s.Token {
		return status.Error(codes.Unauthenticated, "missing or wrong bearer token")
	}
	if r := md.Get("x-krane-region"); len(r) == 1 && r[0] != s.Region {
		return status.Errorf(codes.PermissionDenied, "token is for region %s, not %s", s.Region, r[0])
	}
	return nil
}

func (s *Server) authUnary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if err := s.check(ctx); err != nil {
		return nil, err
	}
	return h(ctx, req)
}

func (s *Server) authStream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	if err := s.check(ss.Context()); err != nil {
		return err
	}
	return h(srv, ss)
}
