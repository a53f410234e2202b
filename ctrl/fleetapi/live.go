package fleetapi

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"krane.dev/ctrl/store"
	"krane.dev/shared/kinds"
)

// NotServedError says which regions have no live cluster running a
// controller for a kind, and what their clusters do run.
type NotServedError struct {
	Kind    string
	Regions []string // in the order asked
	// Why has one sentence per region in Regions.
	Why []string
}

func (e *NotServedError) Error() string { return strings.Join(e.Why, "; ") }

// CheckServed returns nil when each of regions has a live cluster (a
// heartbeat within window) whose host runs a controller reconciling kind,
// and a *NotServedError naming every region that has none otherwise. A
// live cluster whose host does not report its controllers (older than
// this ctrl) counts as serving: ctrl cannot tell, and refusing would
// break deploys to it. Errors reading the database are returned as they
// are.
func CheckServed(ctx context.Context, st *store.Store, regions []string, kind string, window time.Duration, now time.Time) error {
	clusters, err := st.ClustersIn(ctx, regions)
	if err != nil {
		return err
	}
	byRegion := map[string][]store.ClusterLiveness{}
	for _, c := range clusters {
		byRegion[c.Region] = append(byRegion[c.Region], c)
	}
	var nse *NotServedError
	for _, region := range regions {
		why, served := regionServed(region, byRegion[region], kind, window, now)
		if served {
			continue
		}
		if nse == nil {
			nse = &NotServedError{Kind: kind}
		}
		nse.Regions = append(nse.Regions, region)
		nse.Why = append(nse.Why, why)
	}
	if nse != nil {
		return nse
	}
	return nil
}

// regionServed decides one region, and says why not.
func regionServed(region string, clusters []store.ClusterLiveness, kind string, window time.Duration, now time.Time) (string, bool) {
	var facts []string
	for _, c := range clusters {
		age := now.Sub(c.LastHeartbeatAt).Round(time.Second)
		switch {
		case c.LastHeartbeatAt.IsZero():
			facts = append(facts, fmt.Sprintf("cluster %s has never sent a heartbeat (is its krane running?)", c.ID))
			continue
		case age > window:
			facts = append(facts, fmt.Sprintf("last heartbeat from cluster %s %s ago, longer than the %s a live cluster may be silent", c.ID, age, window))
			continue
		case c.Host == nil:
			return "", true
		case c.Host.Owns(kind):
			return "", true
		}
		var running []string
		for _, ctl := range c.Host.Controllers {
			if ctl.Running {
				running = append(running, ctl.Name)
				continue
			}
			if slices.Contains(ctl.Kinds, kind) || len(ctl.Kinds) == 0 && kinds.OfBuiltInController(ctl.Name) == kind {
				msg := fmt.Sprintf("cluster %s's controller %s is not running", c.ID, ctl.Name)
				if ctl.LastError != "" {
					msg += ": " + ctl.LastError
				}
				facts = append(facts, msg)
			}
		}
		list := "no controller"
		if len(running) > 0 {
			list = strings.Join(running, ", ")
		}
		facts = append(facts, fmt.Sprintf("cluster %s runs: %s", c.ID, list))
	}
	if len(clusters) == 0 {
		facts = append(facts, "no cluster with a valid token is registered there")
	}
	return fmt.Sprintf("region %q: no live cluster runs a controller for kind %q (%s)", region, kind, strings.Join(facts, "; ")), false
}
