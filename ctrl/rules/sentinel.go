package rules

import (
	"fmt"
	"slices"
	"strings"

	"krane.dev/ctrl/actual"
	"krane.dev/ctrl/store"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
)

// SentinelConverged reports whether the region's clusters run a
// sentinel's desired configuration: by the aggregation rule (ctrl/actual),
// at least one cluster counts and every counted cluster reported the
// current version (or a later one), and each is healthy on the desired
// image with at least its replicas available. The sentinel plugin reports
// HEALTHY with a running image only once a rollout has completed. A
// sentinel scaled to zero has converged when its clusters report it
// paused at the current version.
func SentinelConverged(r store.SentinelRow) bool {
	if !r.Actual.Converged() {
		return false
	}
	for _, rep := range r.Reports {
		if !sentinelReportConverged(r, rep) {
			return false
		}
	}
	return true
}

func sentinelReportConverged(r store.SentinelRow, rep store.SentinelReport) bool {
	st := rep.Status
	switch {
	case rep.Deleted:
		return false
	case r.Replicas == 0:
		return st.GetHealth() == clusterv1.Health_HEALTH_PAUSED
	}
	return st.GetHealth() == clusterv1.Health_HEALTH_HEALTHY && st.GetRunningImage() == r.Image && st.GetAvailableReplicas() >= r.Replicas
}

// EvaluateSentinel decides a sentinel's deploy from its row (with its
// clusters' reports rolled up by the rule of ctrl/actual) and its apply
// errors (those of counted clusters; others are ignored): failed when it
// was stopped or a counted cluster cannot apply the current version for
// good (the cluster's own message), ready when it has converged,
// otherwise undecided with what it is waiting for.
func EvaluateSentinel(r store.SentinelRow, applyErrors []store.ApplyError) Outcome {
	if r.DesiredState != "running" {
		return Outcome{Result: ResultFailed, Message: fmt.Sprintf("sentinel %s was stopped while it deployed", r.ID)}
	}
	counted := map[string]bool{}
	for _, id := range r.Actual.Counted {
		counted[id] = true
	}
	applyErrors = slices.DeleteFunc(slices.Clone(applyErrors), func(e store.ApplyError) bool {
		return e.Region != r.Region || !counted[e.ClusterID] // only the counted clusters of the sentinel's region decide
	})
	var permanent []string
	for _, e := range applyErrors {
		if e.Permanent && e.Version >= r.Version {
			permanent = append(permanent, ApplyErrorText(e))
		}
	}
	if len(permanent) > 0 {
		return Outcome{Result: ResultFailed, Message: fmt.Sprintf("sentinel %s: %s", r.ID, strings.Join(permanent, "; "))}
	}
	if SentinelConverged(r) {
		return Outcome{Result: ResultReady}
	}
	var whys []string
	if len(r.Actual.Counted) == 0 {
		whys = append(whys, fmt.Sprintf("no live cluster of region %s serves sentinels (a cluster counts while its last heartbeat is at most %s old)", r.Region, actual.LiveWindow))
	}
	reports := map[string]store.SentinelReport{}
	for _, rep := range r.Reports {
		reports[rep.ClusterID] = rep
	}
	for _, id := range r.Actual.Counted {
		rep, ok := reports[id]
		if ok && rep.Version >= r.Version && sentinelReportConverged(r, rep) {
			continue
		}
		who := "its cluster"
		if len(r.Actual.Counted) > 1 {
			who = "cluster " + id
		}
		st := rep.Status
		health := st.GetHealth().Word()
		var why string
		switch {
		case !ok:
			why = fmt.Sprintf("%s has not reported version %d yet (no report)", who, r.Version)
		case rep.Version < r.Version:
			why = fmt.Sprintf("%s has not reported version %d yet (last report: version %d, %s)", who, r.Version, rep.Version, health)
		case rep.Deleted:
			why = who + " reports it deleted"
		case health != "healthy" && health != "paused":
			why = "it is " + health
			if st.GetReason() != "" {
				why += ": " + st.GetReason()
			}
		case st.GetRunningImage() != r.Image:
			why = fmt.Sprintf("it runs %q, not %s", st.GetRunningImage(), r.Image)
		default:
			why = fmt.Sprintf("%d of %d replicas available (%s)", st.GetAvailableReplicas(), r.Replicas, health)
		}
		if who != "its cluster" && !strings.HasPrefix(why, who) {
			why = who + ": " + why
		}
		whys = append(whys, why)
	}
	why := strings.Join(whys, "; ")
	for _, e := range applyErrors { // retryable: the cluster keeps trying
		if !e.Permanent {
			why += "; retrying: " + ApplyErrorText(e)
		}
	}
	return Outcome{Message: why}
}
