// Package fleetapi serves krane.ctrl.v1.FleetService: the clusters ctrl
// serves, by region, with each cluster's last heartbeat, agent version and,
// per kind, its reported cursor against ctrl's newest version for the
// region, and the objects it could not apply.
//
// It reads what the clusters' heartbeats and reports stored; it needs no
// Restate, so ctrl serves it whether or not the deploy API is on. Every
// call needs an operator token (ctrl/auth).
package fleetapi

import (
	"context"
	"sort"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"krane.dev/ctrl/store"
	ctrlv1 "krane.dev/proto/krane/ctrl/v1"
)

// Server implements ctrlv1.FleetServiceServer.
type Server struct {
	ctrlv1.UnimplementedFleetServiceServer
	store *store.Store
	log   hclog.Logger
}

// New returns a Server reading st.
func New(st *store.Store, log hclog.Logger) *Server {
	if log == nil {
		log = hclog.NewNullLogger()
	}
	return &Server{store: st, log: log.Named("fleetapi")}
}

// Register adds the service to gs.
func (s *Server) Register(gs *grpc.Server) { ctrlv1.RegisterFleetServiceServer(gs, s) }

// ListClusters returns every registered cluster (or one region's).
func (s *Server) ListClusters(ctx context.Context, req *ctrlv1.ListClustersRequest) (*ctrlv1.ListClustersResponse, error) {
	clusters, err := s.store.ListClusters(ctx)
	if err != nil {
		return nil, s.unavailable(ctx, err, "listing clusters failed")
	}
	heads, err := s.store.ChangeHeads(ctx)
	if err != nil {
		return nil, s.unavailable(ctx, err, "reading the newest versions failed")
	}
	errCounts, err := s.store.ApplyErrorCounts(ctx)
	if err != nil {
		return nil, s.unavailable(ctx, err, "counting apply errors failed")
	}
	resp := &ctrlv1.ListClustersResponse{}
	for _, c := range clusters {
		if r := req.GetRegion(); r != "" && c.Region != r {
			continue
		}
		resp.Clusters = append(resp.Clusters, clusterInfo(c, heads, errCounts))
	}
	return resp, nil
}

func clusterInfo(c store.Cluster, heads map[store.HeadKey]uint64, errCounts map[store.ApplyErrorKey]int) *ctrlv1.ClusterInfo {
	info := &ctrlv1.ClusterInfo{
		Id: c.ID, Region: c.Region, RegisteredAt: timestamppb.New(c.CreatedAt),
		AgentVersion: c.AgentVersion, ActiveTokens: int32(c.ActiveTokens),
	}
	if !c.LastHeartbeatAt.IsZero() {
		info.LastHeartbeatAt = timestamppb.New(c.LastHeartbeatAt)
	}
	kinds := map[string]bool{}
	for k := range heads {
		if k.Region == c.Region {
			kinds[k.Kind] = true
		}
	}
	for k := range c.Cursors {
		kinds[k] = true
	}
	for k := range errCounts {
		if k.ClusterID == c.ID {
			kinds[k.Kind] = true
		}
	}
	names := make([]string, 0, len(kinds))
	for k := range kinds {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, kind := range names {
		p := &ctrlv1.KindProgress{
			Kind: kind, HeadVersion: heads[store.HeadKey{Region: c.Region, Kind: kind}],
			ApplyErrors: int32(errCounts[store.ApplyErrorKey{ClusterID: c.ID, Kind: kind}]),
		}
		if cur, ok := c.Cursors[kind]; ok {
			p.Cursor = &cur
			p.Behind = p.HeadVersion > cur
		} else {
			// No cursor reported: behind whenever there is anything to apply.
			p.Behind = p.HeadVersion > 0
		}
		info.Kinds = append(info.Kinds, p)
	}
	// The heartbeat does not carry the host's controllers or its parked
	// objects yet: controllers_reported stays false and parked unset, so
	// clients say "not reported" instead of showing an empty list or 0.
	return info
}

// unavailable turns a store error into UNAVAILABLE (or the context's own
// code when the caller went away).
func (s *Server) unavailable(ctx context.Context, err error, what string) error {
	if ctx.Err() != nil {
		return status.FromContextError(ctx.Err()).Err()
	}
	s.log.Error(what, "error", err)
	return status.Errorf(codes.Unavailable, "%s: ctrl's database is unavailable (%v); retry", what, err)
}
