package clusterapi

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"krane.dev/ctrl/store"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
	"krane.dev/shared/kinds"
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
		return store.Change{}, fmt.Errorf("reading the desired state failed: %w", err)
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

// Heartbeat records that the cluster is alive (in the next heartbeat
// write, apart from the reports: heartbeats.go) and returns the newest
// version in its region.
func (s *Server) Heartbeat(ctx context.Context, req *clusterv1.HeartbeatRequest) (*clusterv1.HeartbeatResponse, error) {
	who, err := caller(ctx)
	if err != nil {
		return nil, err
	}
	hb := store.ClusterHeartbeat{ClusterID: who.ClusterID, Region: who.Region, Data: heartbeatData(req)}
	if s.running.Load() {
		err = s.heartbeats.add(ctx, hb)
	} else {
		err = s.store.Heartbeat(ctx, hb.ClusterID, hb.Region, hb.Data)
	}
	switch {
	case errors.Is(err, errStopping):
		return nil, status.Error(codes.Unavailable, "ctrl is stopping; the heartbeat was not recorded: send it again")
	case errors.Is(err, store.ErrNotFound):
		return nil, errorf(codes.FailedPrecondition, "cluster %q is not registered in region %q (run `ctrl admin cluster register`)", who.ClusterID, who.Region)
	case err != nil:
		return nil, fmt.Errorf("recording the heartbeat failed: %w", err)
	}
	head, ok := s.poller.regionHead(who.Region)
	if !ok {
		if head, err = s.store.RegionHead(ctx, who.Region); err != nil {
			return nil, fmt.Errorf("reading the head version failed: %w", err)
		}
	}
	return &clusterv1.HeartbeatResponse{HeadVersion: head}, nil
}

// heartbeatData is what the store keeps of a heartbeat: the host report
// only from hosts that send one. Its size is bounded by the request's
// declared bounds (proto/krane/cluster/v1: controllers, kinds, cursors,
// parked, text lengths), checked before this handler runs, so one
// cluster cannot make its row (read by every fleet listing and /metrics)
// arbitrarily large.
func heartbeatData(req *clusterv1.HeartbeatRequest) store.HeartbeatData {
	hb := store.HeartbeatData{AgentVersion: req.GetAgentVersion(), Cursors: req.GetCursors()}
	if !req.GetHostReport() {
		return hb
	}
	h := &store.HostReport{Controllers: []store.ControllerStatus{}}
	for _, c := range req.GetControllers() {
		h.Controllers = append(h.Controllers, store.ControllerStatus{
			Name: c.GetName(), PluginVersion: c.GetPluginVersion(), Kinds: c.GetKinds(),
			Running: c.GetRunning(), LastError: c.GetLastError(),
		})
	}
	if p := req.GetParked(); len(p) > 0 {
		h.Parked = make(map[string]int, len(p))
		for kind, n := range p {
			if n > 0 {
				h.Parked[kind] = int(n)
			}
		}
	}
	hb.Host = h
	return hb
}
