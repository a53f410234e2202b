package clusterapi

import (
	"context"
	"errors"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"krane.dev/ctrl/auth"
	"krane.dev/ctrl/store"
	"krane.dev/internal/kinds"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
)

// desired reads one object of kind in the caller's region.
func (s *Server) desired(ctx context.Context, kind, id string) (store.Change, error) {
	who, err := caller(ctx)
	if err != nil {
		return store.Change{}, err
	}
	if err := checkKind(kind); err != nil {
		return store.Change{}, err
	}
	if id == "" {
		return store.Change{}, status.Error(codes.InvalidArgument, "an object id is required")
	}
	c, err := s.store.Desired(ctx, kind, who.Region, id)
	if errors.Is(err, store.ErrNotFound) {
		return store.Change{}, errorf(codes.NotFound, "no %s %q in region %q", kind, id, who.Region)
	}
	if err != nil {
		return store.Change{}, storeError(ctx, err, "reading the desired state failed")
	}
	if c.Err != nil {
		s.log.Error("desired-state row cannot be converted", "kind", kind, "region", who.Region, "id", id, "version", c.Version, "error", c.Err)
		return store.Change{}, errorf(codes.Internal, "the desired state of %s %q (version %d) is corrupt in ctrl's database; an operator must fix it", kind, id, c.Version)
	}
	return c, nil
}

// GetDesiredState returns one object's current desired state.
func (s *Server) GetDesiredState(ctx context.Context, req *clusterv1.GetDesiredStateRequest) (*clusterv1.ResourceChange, error) {
	c, err := s.desired(ctx, req.GetKind(), req.GetId())
	if err != nil {
		return nil, err
	}
	return resourceChange(c)
}

// GetDesiredDeploymentState is the typed GetDesiredState of a deployment.
func (s *Server) GetDesiredDeploymentState(ctx context.Context, req *clusterv1.GetDesiredDeploymentStateRequest) (*clusterv1.DeploymentState, error) {
	c, err := s.desired(ctx, kinds.Deployment, req.GetDeploymentId())
	if err != nil {
		return nil, err
	}
	return deploymentState(c), nil
}

// GetDesiredSentinelState is the typed GetDesiredState of a sentinel.
func (s *Server) GetDesiredSentinelState(ctx context.Context, req *clusterv1.GetDesiredSentinelStateRequest) (*clusterv1.SentinelState, error) {
	c, err := s.desired(ctx, kinds.Sentinel, req.GetSentinelId())
	if err != nil {
		return nil, err
	}
	return sentinelState(c), nil
}

// observation orders a report; a report without a time counts as observed
// when it arrived.
func observation(version uint64, at *timestamppb.Timestamp) store.Observation {
	t := time.Now()
	if at != nil && at.IsValid() && (at.GetSeconds() != 0 || at.GetNanos() != 0) {
		t = at.AsTime()
	}
	return store.Observation{Version: version, At: t}
}

// ReportStatus records actual state of one object.
func (s *Server) ReportStatus(ctx context.Context, req *clusterv1.ReportStatusRequest) (*clusterv1.ReportStatusResponse, error) {
	kind, id := req.GetKind(), req.GetId()
	if err := checkKind(kind); err != nil {
		return nil, err
	}
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "an object id is required")
	}
	if ae := req.GetApplyError(); ae != nil {
		who, err := caller(ctx)
		if err != nil {
			return nil, err
		}
		if err := s.store.ReportApplyError(ctx, kind, who.Region, who.ClusterID, id, ae); err != nil {
			return nil, storeError(ctx, err, "recording the apply error failed")
		}
		if ae.GetMessage() != "" {
			s.log.Warn("cluster cannot apply a change", "kind", kind, "id", id, "region", who.Region, "cluster", who.ClusterID,
				"version", ae.GetVersion(), "permanent", ae.GetPermanent(), "field", ae.GetField(), "error", ae.GetMessage())
		}
		if req.GetStatus() == nil {
			s.m.reports.WithLabelValues(kind, "apply_error").Inc()
			// A permanent apply error can decide a deploy: wake its waiter.
			s.notify(ctx, who, kind, id)
			return &clusterv1.ReportStatusResponse{Accepted: true}, nil
		}
	}
	var msg proto.Message
	switch kind {
	case kinds.Deployment:
		msg = &clusterv1.DeploymentStatus{}
	case kinds.Sentinel:
		msg = &clusterv1.SentinelStatus{}
	case kinds.CiliumNetworkPolicy:
		msg = &clusterv1.CiliumNetworkPolicyStatus{}
	}
	if msg != nil {
		if req.GetStatus() == nil || req.GetStatus().UnmarshalTo(msg) != nil {
			s.m.reports.WithLabelValues(kind, "invalid").Inc()
			return nil, errorf(codes.InvalidArgument, "the status of a %s must be a %s", kind, msg.ProtoReflect().Descriptor().FullName())
		}
	}
	accepted, err := s.report(ctx, kind, id, observation(req.GetObservedVersion(), req.GetObservedAt()), msg, req.GetStatus())
	if err != nil {
		return nil, err
	}
	return &clusterv1.ReportStatusResponse{Accepted: accepted}, nil
}

// ReportDeploymentStatus is the typed ReportStatus of a deployment.
func (s *Server) ReportDeploymentStatus(ctx context.Context, req *clusterv1.ReportDeploymentStatusRequest) (*clusterv1.ReportDeploymentStatusResponse, error) {
	st := req.GetStatus()
	if st.GetDeploymentId() == "" {
		return nil, status.Error(codes.InvalidArgument, "status.deployment_id is required")
	}
	accepted, err := s.report(ctx, kinds.Deployment, st.GetDeploymentId(), observation(req.GetObservedVersion(), req.GetObservedAt()), st, nil)
	if err != nil {
		return nil, err
	}
	return &clusterv1.ReportDeploymentStatusResponse{Accepted: accepted}, nil
}

// ReportSentinelStatus is the typed ReportStatus of a sentinel.
func (s *Server) ReportSentinelStatus(ctx context.Context, req *clusterv1.ReportSentinelStatusRequest) (*clusterv1.ReportSentinelStatusResponse, error) {
	st := req.GetStatus()
	if st.GetSentinelId() == "" {
		return nil, status.Error(codes.InvalidArgument, "status.sentinel_id is required")
	}
	accepted, err := s.report(ctx, kinds.Sentinel, st.GetSentinelId(), observation(req.GetObservedVersion(), req.GetObservedAt()), st, nil)
	if err != nil {
		return nil, err
	}
	return &clusterv1.ReportSentinelStatusResponse{Accepted: accepted}, nil
}

// report stores one status report. msg is the decoded status of a built-in
// kind; raw is the packed status of a generic kind.
func (s *Server) report(ctx context.Context, kind, id string, obs store.Observation, msg proto.Message, raw *anypb.Any) (bool, error) {
	who, err := caller(ctx)
	if err != nil {
		return false, err
	}
	label := s.kindLabel(kind)
	var accepted bool
	switch st := msg.(type) {
	case *clusterv1.DeploymentStatus:
		if st.GetDeploymentId() == "" {
			st.DeploymentId = id
		}
		if st.GetDeploymentId() != id {
			return false, errorf(codes.InvalidArgument, "the report is for deployment %q but its status names %q", id, st.GetDeploymentId())
		}
		accepted, err = s.store.ReportDeployment(ctx, who.Region, who.ClusterID, obs, st)
	case *clusterv1.SentinelStatus:
		if st.GetSentinelId() == "" {
			st.SentinelId = id
		}
		if st.GetSentinelId() != id {
			return false, errorf(codes.InvalidArgument, "the report is for sentinel %q but its status names %q", id, st.GetSentinelId())
		}
		accepted, err = s.store.ReportSentinel(ctx, who.Region, obs, st)
	case *clusterv1.CiliumNetworkPolicyStatus:
		if st.GetId() == "" {
			st.Id = id
		}
		if st.GetId() != id {
			return false, errorf(codes.InvalidArgument, "the report is for policy %q but its status names %q", id, st.GetId())
		}
		accepted, err = s.store.ReportCiliumNetworkPolicy(ctx, who.Region, obs, st)
	default:
		doc, jerr := statusJSON(raw)
		if jerr != nil {
			s.m.reports.WithLabelValues(label, "invalid").Inc()
			return false, errorf(codes.InvalidArgument, "the status of %s %q: %v", kind, id, jerr)
		}
		accepted, err = s.store.ReportResource(ctx, kind, who.Region, id, obs, doc)
	}
	switch {
	case errors.Is(err, store.ErrNotFound):
		s.m.reports.WithLabelValues(label, "not_found").Inc()
		return false, errorf(codes.NotFound, "no %s %q in region %q", kind, id, who.Region)
	case err != nil:
		s.m.reports.WithLabelValues(label, "error").Inc()
		s.log.Error("cannot store a status report", "kind", kind, "region", who.Region, "id", id, "cluster_id", who.ClusterID, "error", err)
		return false, storeError(ctx, err, "storing the report failed")
	case !accepted:
		s.m.reports.WithLabelValues(label, "stale").Inc()
		s.log.Debug("ignored a stale report", "kind", kind, "region", who.Region, "id", id, "observed_version", obs.Version)
		return false, nil
	}
	s.m.reports.WithLabelValues(label, "accepted").Inc()
	s.notify(ctx, who, kind, id)
	return true, nil
}

func (s *Server) notify(ctx context.Context, who auth.Identity, kind, id string) {
	if s.listener == nil {
		return
	}
	switch kind {
	case kinds.Deployment:
		s.listener.DeploymentReported(ctx, id, who.Region)
	case kinds.Sentinel:
		s.listener.SentinelReported(ctx, id)
	}
}

// statusJSON turns a generic kind's status into the JSON stored for it: a
// google.protobuf.Struct as its JSON object, any other registered message
// as its protojson form (with "@type").
func statusJSON(a *anypb.Any) ([]byte, error) {
	if a == nil {
		return nil, errors.New("a status is required")
	}
	var st structpb.Struct
	if a.MessageIs(&st) {
		if err := a.UnmarshalTo(&st); err != nil {
			return nil, err
		}
		return protojson.Marshal(&st)
	}
	b, err := protojson.Marshal(a)
	if err != nil {
		return nil, errors.New("it must be a google.protobuf.Struct (or a message type ctrl knows)")
	}
	return b, nil
}

// Heartbeat records that the cluster is alive and returns the newest
// version in its region.
func (s *Server) Heartbeat(ctx context.Context, req *clusterv1.HeartbeatRequest) (*clusterv1.HeartbeatResponse, error) {
	who, err := caller(ctx)
	if err != nil {
		return nil, err
	}
	err = s.store.Heartbeat(ctx, who.ClusterID, who.Region, req.GetAgentVersion(), req.GetCursors())
	if errors.Is(err, store.ErrNotFound) {
		return nil, errorf(codes.FailedPrecondition, "cluster %q is not registered in region %q (run `ctrl cluster register`)", who.ClusterID, who.Region)
	}
	if err != nil {
		return nil, storeError(ctx, err, "recording the heartbeat failed")
	}
	head, err := s.store.RegionHead(ctx, who.Region)
	if err != nil {
		return nil, storeError(ctx, err, "reading the head version failed")
	}
	return &clusterv1.HeartbeatResponse{HeadVersion: head}, nil
}
