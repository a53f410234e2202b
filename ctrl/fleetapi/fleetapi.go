// Package fleetapi serves krane.ctrl.v1.FleetService: the clusters ctrl
// serves, by region, with each cluster's last heartbeat, agent version, the
// controllers its host runs and, per kind, its reported cursor against
// ctrl's newest version for the region (lag in versions and in seconds),
// its parked objects and the objects it could not apply.
//
// Load is the one reader of that view: FleetService, `ctrl admin cluster list`
// and the lag metric (metrics.go) all use it. Live reports, from the same
// data, whether a region has a live cluster running the controller of a
// kind (the deploy API's fail-fast check).
//
// It reads what the clusters' heartbeats and reports stored; it needs no
// Restate, so ctrl serves it whether or not the deploy API is on. Every
// call needs an operator token (ctrl/auth).
package fleetapi

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"krane.dev/ctrl/api"
	"krane.dev/ctrl/auth"
	"krane.dev/ctrl/store"
	ctrlv1 "krane.dev/proto/krane/ctrl/v1"
	"krane.dev/shared/version"
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

// ListClusters returns the registered clusters (or one region's), a page
// at a time: page_size clusters or about PageBytes, whichever comes first.
func (s *Server) ListClusters(ctx context.Context, req *ctrlv1.ListClustersRequest) (*ctrlv1.ListClustersResponse, error) {
	size, after, err := api.Parse(req.GetPageSize(), req.GetPageToken(), "ListClusters", 1000, 5000)
	if err != nil {
		return nil, err
	}
	resp, err := Load(ctx, s.store, req.GetRegion())
	if err != nil {
		return nil, fmt.Errorf("reading the fleet failed: %w", err)
	}
	// Load orders by region, then id: a page starts after its token's.
	all, start := resp.GetClusters(), 0
	if after != "" {
		var found bool
		start, found = slices.BinarySearchFunc(all, after, func(c *ctrlv1.ClusterInfo, key string) int { return strings.Compare(pageKey(c), key) })
		if found {
			start++
		}
	}
	resp.Clusters, resp.NextPageToken = api.NextWithin(all[start:], size, PageBytes, pageKey, func(c *ctrlv1.ClusterInfo) int { return proto.Size(c) })
	return resp, nil
}

// ListAll reads every page of ListClusters into one answer (the CLI and
// the console show the whole fleet).
func ListAll(ctx context.Context, c ctrlv1.FleetServiceClient, region string) (*ctrlv1.ListClustersResponse, error) {
	all := &ctrlv1.ListClustersResponse{}
	for token := ""; ; {
		resp, err := c.ListClusters(ctx, &ctrlv1.ListClustersRequest{Region: region, PageToken: token})
		if err != nil {
			return nil, err
		}
		all.Clusters = append(all.Clusters, resp.GetClusters()...)
		if token = resp.GetNextPageToken(); token == "" {
			return all, nil
		}
	}
}

// PageBytes ends a page of ListClusters: what clusters say in their
// heartbeats (controllers, errors, kinds) is in it, and a page must stay
// within a client's default 4 MiB.
const PageBytes = 3 << 20

// pageKey orders clusters as Load does.
func pageKey(c *ctrlv1.ClusterInfo) string { return c.GetRegion() + "\x00" + c.GetId() }

// RemoveCluster removes a cluster (store.RemoveCluster), recording the
// caller as who removed it.
func (s *Server) RemoveCluster(ctx context.Context, req *ctrlv1.RemoveClusterRequest) (*ctrlv1.RemoveClusterResponse, error) {
	if req.GetClusterId() == "" {
		return nil, status.Error(codes.InvalidArgument, "cluster_id: the cluster to remove is required")
	}
	r, err := s.store.RemoveCluster(ctx, req.GetClusterId(), auth.CallerName(ctx))
	if errors.Is(err, store.ErrNotFound) {
		return nil, status.Errorf(codes.NotFound, "no cluster %q is registered (see `ctrl admin cluster list`)", req.GetClusterId())
	}
	if err != nil {
		return nil, fmt.Errorf("removing the cluster failed: %w", err)
	}
	s.log.Info("removed a cluster", "cluster_id", r.ID, "region", r.Region, "by", auth.CallerName(ctx), "tokens_revoked", r.TokensRevoked,
		"reports", r.Reports, "instances", r.Instances, "apply_errors", r.ApplyErrors)
	return RemovedResponse(r), nil
}

// RemovedResponse is the API's answer for a removal.
func RemovedResponse(r store.RemovedCluster) *ctrlv1.RemoveClusterResponse {
	return &ctrlv1.RemoveClusterResponse{ClusterId: r.ID, Region: r.Region, TokensRevoked: r.TokensRevoked,
		ReportsDeleted: r.Reports, InstancesDeleted: r.Instances, ApplyErrorsDeleted: r.ApplyErrors}
}

// Load reads the fleet view of every cluster (of region, when not empty),
// by region and cluster id. It is the one source of FleetService, `ctrl
// cluster list` and the lag metric, so they never disagree.
func Load(ctx context.Context, st *store.Store, region string) (*ctrlv1.ListClustersResponse, error) {
	clusters, err := st.ListClusters(ctx)
	if err != nil {
		return nil, err
	}
	heads, err := st.ChangeHeads(ctx)
	if err != nil {
		return nil, err
	}
	errCounts, err := st.ApplyErrorCounts(ctx)
	if err != nil {
		return nil, err
	}
	resp := &ctrlv1.ListClustersResponse{}
	var pending []store.PendingKey
	for _, c := range clusters {
		if region != "" && c.Region != region {
			continue
		}
		info := clusterInfo(c, heads, errCounts)
		resp.Clusters = append(resp.Clusters, info)
		for _, k := range info.GetKinds() {
			if k.Cursor != nil && k.GetBehind() && info.GetLastHeartbeatAt() != nil {
				pending = append(pending, store.PendingKey{Region: c.Region, Kind: k.GetKind(), Cursor: k.GetCursor()})
			}
		}
	}
	since, err := st.PendingSince(ctx, pending)
	if err != nil {
		return nil, err
	}
	for _, info := range resp.Clusters {
		fillLagSeconds(info, since)
	}
	return resp, nil
}

func clusterInfo(c store.Cluster, heads map[store.HeadKey]uint64, errCounts map[store.ApplyErrorKey]int) *ctrlv1.ClusterInfo {
	info := &ctrlv1.ClusterInfo{
		Id: c.ID, Region: c.Region, RegisteredAt: timestamppb.New(c.CreatedAt),
		AgentVersion: c.AgentVersion, ActiveTokens: int32(c.ActiveTokens),
		AgentSkew:        version.HostSkew(version.Version, c.AgentVersion).String(),
		AgentSkewMessage: version.HostSkewMessage(version.Version, c.AgentVersion),
	}
	if !c.LastHeartbeatAt.IsZero() {
		info.LastHeartbeatAt = timestamppb.New(c.LastHeartbeatAt)
	}
	info.Live = store.RuleCluster(c.ID, c.Region, c.LastHeartbeatAt, c.Host).Live(time.Now())
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
	if c.Host != nil {
		for k := range c.Host.Parked {
			kinds[k] = true
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
			lag := uint64(0)
			if p.Behind {
				lag = p.HeadVersion - cur
			}
			p.LagVersions = &lag
		} else {
			// No cursor reported: behind whenever there is anything to apply.
			p.Behind = p.HeadVersion > 0
		}
		if c.Host != nil {
			n := int32(c.Host.Parked[kind])
			p.Parked = &n
		}
		info.Kinds = append(info.Kinds, p)
	}
	// A host that does not report its controllers (older than this ctrl,
	// or no heartbeat yet) leaves controllers_reported false and parked
	// unset, so clients say "not reported" instead of "none" or 0.
	if c.Host != nil {
		info.ControllersReported = true
		for _, ctl := range c.Host.Controllers {
			info.Controllers = append(info.Controllers, &ctrlv1.ControllerInfo{
				Name: ctl.Name, PluginVersion: ctl.PluginVersion, Kinds: ctl.Kinds, Running: ctl.Running, LastError: ctl.LastError,
			})
		}
	}
	return info
}

// fillLagSeconds sets each kind's lag in seconds as of the cluster's last
// heartbeat: how long the oldest change above its cursor had been
// committed then. Measured at the heartbeat, not now, because the cursor
// is as of then: a healthy cluster is not shown lagging by the time since
// its heartbeat for a change it applied a moment after.
func fillLagSeconds(info *ctrlv1.ClusterInfo, since map[store.PendingKey]time.Time) {
	hbAt := info.GetLastHeartbeatAt()
	if hbAt == nil {
		return
	}
	hb := hbAt.AsTime()
	for _, k := range info.GetKinds() {
		if k.Cursor == nil {
			continue
		}
		if !k.GetBehind() {
			zero := 0.0
			k.LagSeconds = &zero
			continue
		}
		at, ok := since[store.PendingKey{Region: info.GetRegion(), Kind: k.GetKind(), Cursor: k.GetCursor()}]
		if !ok {
			continue // versioned before ctrl recorded commit times
		}
		lag := max(0, hb.Sub(at).Seconds())
		k.LagSeconds = &lag
	}
}
