package deployapi

import (
	"context"
	"errors"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"krane.dev/ctrl/fleetapi"
	"krane.dev/ctrl/store"
)

// checkServed refuses, with FailedPrecondition, a deploy of kind to
// regions (every region with a registered cluster when empty) where no
// live cluster runs a controller for the kind: it could only wait out its
// timeout. The message names each such region and what its clusters do
// run or when they were last heard from. within 0 turns the check off.
func checkServed(ctx context.Context, st *store.Store, regions []string, kind string, within time.Duration) error {
	if within <= 0 {
		return nil
	}
	if len(regions) == 0 {
		var err error
		if regions, err = st.ClusterRegions(ctx); err != nil {
			return servedStoreError(ctx, err)
		}
	}
	err := fleetapi.CheckServed(ctx, st, regions, kind, within, time.Now())
	var nse *fleetapi.NotServedError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &nse):
		return status.Errorf(codes.FailedPrecondition, "%s; nothing was deployed (see `ctrl cluster list`; the check counts heartbeats of the last %s, deploy.live_cluster_within)", nse, within)
	default:
		return servedStoreError(ctx, err)
	}
}

func servedStoreError(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return status.FromContextError(ctx.Err()).Err()
	}
	return status.Errorf(codes.Unavailable, "reading the clusters' heartbeats failed: ctrl's database is unavailable (%v); retry", err)
}
