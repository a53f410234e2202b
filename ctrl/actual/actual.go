// Package actual is the one rule that turns what each cluster reported on
// an object into the object's actual state in a region. Every reader uses
// it: the deploy's readiness and the sentinel's convergence (workflows),
// the resource API, the deploy and sentinel APIs, the fleet API and the
// console. It reads nothing itself; ctrl/store loads its inputs
// (object_reports, apply_errors, clusters) and hands back its result.
//
// # The rule
//
// Clusters report per (object, cluster); a region's view of an object is
// computed from the reports of the clusters that count:
//
//   - A cluster counts for an object of kind K in region R when it is
//     registered in R and live — its last heartbeat is at most LiveWindow
//     old — and it serves K: its host has enabled a controller reconciling
//     K, running or not (one that is down has not applied what it should,
//     so its region waits for it), or its heartbeats do not say which
//     controllers it runs. A removed
//     cluster is not registered any more (its rows went with it).
//   - A counted cluster has applied version V of a live object when its
//     last report is at version V or later; of a deleted object, also
//     when it has no report left (a cluster's report on a deleted object
//     is pruned once it reports the delete applied).
//   - Applied is how many counted clusters have applied the object's
//     current version; Lowest the lowest version a counted cluster
//     reported (0 while one of them has not reported); Errors the apply
//     errors of counted clusters, by cluster.
//   - The region has converged when at least one cluster counts and every
//     counted cluster has applied the current version.
//
// So a cluster that is gone — silent for longer than LiveWindow, or
// removed — stops holding its region back once the window has passed,
// and counts again from its next heartbeat. Reports of clusters that do
// not count are kept (Ignored) and shown, but decide nothing.
package actual

import (
	"slices"
	"strings"
	"time"
)

// LiveWindow is how old a cluster's last heartbeat may be for it to
// count: four heartbeat intervals (hosts send one every 30 s), so one or
// two lost heartbeats do not drop a cluster, and a cluster that is gone
// holds its regions back for two minutes at most.
const LiveWindow = 2 * time.Minute

// Cluster is a registered cluster as the rule sees it.
type Cluster struct {
	ID     string
	Region string
	// LastHeartbeat is zero before the first heartbeat.
	LastHeartbeat time.Time
	// KindsReported says whether the cluster's heartbeats list the kinds
	// its host runs controllers for (Kinds); a host that does not say is
	// taken to serve every kind.
	KindsReported bool
	Kinds         []string
}

// Live reports whether the cluster's last heartbeat is within LiveWindow
// of now.
func (c Cluster) Live(now time.Time) bool {
	return !c.LastHeartbeat.IsZero() && now.Sub(c.LastHeartbeat) <= LiveWindow
}

// Serves reports whether the cluster counts for objects of kind: live,
// and serving the kind.
func (c Cluster) Serves(kind string, now time.Time) bool {
	return c.Live(now) && (!c.KindsReported || slices.Contains(c.Kinds, kind))
}

// Report is what one cluster last reported on one object.
type Report struct {
	ClusterID string
	// Version is the desired version the cluster had applied when it
	// looked, at At.
	Version uint64
	At      time.Time
	// Deleted: the cluster reported the object gone.
	Deleted bool
	// Status is the reported status as JSON (nil: none).
	Status []byte
}

// Error is an apply error a cluster reported on the object.
type Error struct {
	ClusterID string
	Version   uint64
	Message   string
	Field     string
	Permanent bool
}

// Region is an object's actual state in one region, by the rule.
type Region struct {
	// Version is the object's current desired version in the region, and
	// Deleted whether it is desired deleted.
	Version uint64
	Deleted bool
	// Counted are the clusters that count, by id.
	Counted []string
	// Applied is how many of them have applied Version.
	Applied int
	// Lowest is the lowest version a counted cluster reported; 0 while a
	// counted cluster has not reported (or none counts).
	Lowest uint64
	// Reports are the counted clusters' last reports, by cluster id.
	Reports []Report
	// Errors are the counted clusters' apply errors, by cluster id.
	Errors []Error
	// Ignored are the reports of clusters that do not count (silent,
	// not serving the kind, or not registered in the region).
	Ignored []Report
}

// Converged reports whether at least one cluster counts and every
// counted cluster has applied the current version.
func (r Region) Converged() bool { return len(r.Counted) > 0 && r.Applied == len(r.Counted) }

// Missing lists the counted clusters that have not applied the current
// version.
func (r Region) Missing() []string {
	var out []string
	for _, id := range r.Counted {
		if !r.applied(id) {
			out = append(out, id)
		}
	}
	return out
}

// Report returns the last report of a counted cluster.
func (r Region) Report(clusterID string) (Report, bool) {
	i, ok := slices.BinarySearchFunc(r.Reports, clusterID, func(x Report, id string) int { return strings.Compare(x.ClusterID, id) })
	if !ok {
		return Report{}, false
	}
	return r.Reports[i], true
}

// Behind is the counted cluster that is furthest behind: the one with
// the lowest reported version (one without a report first, unless the
// object is deleted, where having none left means it applied the delete),
// ties by id; ok is false when no cluster counts. Readers that show one
// status for the region show this cluster's.
func (r Region) Behind() (clusterID string, rep Report, reported bool, ok bool) {
	rank := func(has bool, rp Report) int64 {
		switch {
		case has:
			return int64(min(rp.Version, 1<<62))
		case r.Deleted:
			return 1<<63 - 1
		}
		return -1
	}
	var best int64
	for _, id := range r.Counted {
		rp, has := r.Report(id)
		if k := rank(has, rp); !ok || k < best {
			clusterID, rep, reported, ok, best = id, rp, has, true, k
		}
	}
	return clusterID, rep, reported, ok
}

func (r Region) applied(clusterID string) bool {
	rep, ok := r.Report(clusterID)
	if !ok {
		return r.Deleted
	}
	return rep.Version >= r.Version
}

// RollUp applies the rule to one object of kind in one region: its
// desired version and whether it is deleted, the region's registered
// clusters, and the reports and apply errors of its clusters (in any
// order).
func RollUp(kind string, version uint64, deleted bool, clusters []Cluster, reports []Report, errs []Error, now time.Time) Region {
	r := Region{Version: version, Deleted: deleted}
	counted := map[string]bool{}
	for _, c := range clusters {
		if c.Serves(kind, now) {
			counted[c.ID] = true
			r.Counted = append(r.Counted, c.ID)
		}
	}
	slices.Sort(r.Counted)
	for _, rep := range reports {
		if counted[rep.ClusterID] {
			r.Reports = append(r.Reports, rep)
		} else {
			r.Ignored = append(r.Ignored, rep)
		}
	}
	byCluster := func(a, b Report) int { return strings.Compare(a.ClusterID, b.ClusterID) }
	slices.SortFunc(r.Reports, byCluster)
	slices.SortFunc(r.Ignored, byCluster)
	for _, e := range errs {
		if counted[e.ClusterID] {
			r.Errors = append(r.Errors, e)
		}
	}
	slices.SortFunc(r.Errors, func(a, b Error) int { return strings.Compare(a.ClusterID, b.ClusterID) })
	for _, id := range r.Counted {
		if r.applied(id) {
			r.Applied++
		}
	}
	r.Lowest = r.lowest()
	return r
}

// lowest is the lowest version a counted cluster reported, 0 when one of
// them has no report.
func (r Region) lowest() uint64 {
	var low uint64
	for i, id := range r.Counted {
		rep, ok := r.Report(id)
		if !ok {
			return 0
		}
		if i == 0 || rep.Version < low {
			low = rep.Version
		}
	}
	return low
}
