package deployapi

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"krane.dev/ctrl/fleetapi"
	"krane.dev/ctrl/store"
	"krane.dev/shared/kinds"
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
	regions, err := targetRegions(ctx, st, regions)
	if err != nil {
		return err
	}
	return refuseUnserved(ctx, st, regions, kind, within, func(nse *fleetapi.NotServedError) string {
		return fmt.Sprintf("%s; nothing was deployed", nse)
	})
}

// targetRegions is regions, or every region with a registered cluster
// when it is empty (what a deploy without regions targets).
func targetRegions(ctx context.Context, st *store.Store, regions []string) ([]string, error) {
	if len(regions) > 0 {
		return regions, nil
	}
	all, err := st.ClusterRegions(ctx)
	if err != nil {
		return nil, fmt.Errorf("reading the clusters' heartbeats failed: %w", err)
	}
	return all, nil
}

// refuseUnserved is FailedPrecondition with why(...) and where to look
// when no live cluster of some of regions runs a controller for kind.
func refuseUnserved(ctx context.Context, st *store.Store, regions []string, kind string, within time.Duration, why func(*fleetapi.NotServedError) string) error {
	err := fleetapi.CheckServed(ctx, st, regions, kind, within, time.Now())
	var nse *fleetapi.NotServedError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &nse):
		return status.Errorf(codes.FailedPrecondition, "%s (see `ctrl admin cluster list`; the check counts heartbeats of the last %s, deploy.live_cluster_within)", why(nse), within)
	default:
		return fmt.Errorf("reading the clusters' heartbeats failed: %w", err)
	}
}

// checkSentinelsServed refuses, with FailedPrecondition, a deploy into
// environment env that would create its sentinel (or start a stopped one)
// in a region of regions (every region with a registered cluster when
// empty) where no live cluster runs the sentinel controller: the deploy
// waits for that sentinel before its deployment can become ready, so it
// could only wait out its timeout. Regions where the environment's
// sentinel is already running are not checked: a deploy leaves it as it
// is. within 0 turns the check off.
func checkSentinelsServed(ctx context.Context, st *store.Store, env string, regions []string, within time.Duration) error {
	if within <= 0 {
		return nil
	}
	regions, err := targetRegions(ctx, st, regions)
	if err != nil {
		return err
	}
	running := map[string]bool{}
	const page = 500
	for after := ""; ; {
		rows, err := st.ListSentinels(ctx, store.SentinelFilter{EnvironmentID: env}, after, page)
		if err != nil {
			return fmt.Errorf("reading the clusters' heartbeats failed: %w", err)
		}
		for _, r := range rows {
			if r.DesiredState == "running" {
				running[r.Region] = true
			}
		}
		if len(rows) < page {
			break
		}
		after = rows[len(rows)-1].ID
	}
	var create []string
	for _, region := range regions {
		if !running[region] {
			create = append(create, region)
		}
	}
	if len(create) == 0 {
		return nil
	}
	return refuseUnserved(ctx, st, create, kinds.Sentinel, within, func(nse *fleetapi.NotServedError) string {
		return fmt.Sprintf("environment %s has no running sentinel in region(s) %v, so this deploy would create one there and wait for it, but %s; "+
			"enable the `sentinel` controller (its controller \"sentinel\" block in krane.hcl) on a cluster of each such region, then deploy again. "+
			"Nothing was deployed", env, nse.Regions, nse)
	})
}
