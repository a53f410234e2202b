package actual_test

import (
	"fmt"
	"testing"
	"time"

	"krane.dev/ctrl/actual"
)

// TestRollUpCountsLiveClustersServingTheKind states the rule by cases: who
// counts, what applied means, the lowest version, and that a gone cluster
// holds nothing back.
func TestRollUpCountsLiveClustersServingTheKind(t *testing.T) {
	now := time.Now()
	live := func(id string) actual.Cluster {
		return actual.Cluster{ID: id, LastHeartbeat: now.Add(-10 * time.Second)}
	}
	silent := func(id string) actual.Cluster {
		return actual.Cluster{ID: id, LastHeartbeat: now.Add(-actual.LiveWindow - time.Second)}
	}
	never := func(id string) actual.Cluster { return actual.Cluster{ID: id} }
	serving := func(id string, kinds ...string) actual.Cluster {
		c := live(id)
		c.KindsReported, c.Kinds = true, kinds
		return c
	}
	rep := func(id string, v uint64) actual.Report { return actual.Report{ClusterID: id, Version: v} }
	for _, c := range []struct {
		name      string
		version   uint64
		deleted   bool
		clusters  []actual.Cluster
		reports   []actual.Report
		want      string // counted, applied, lowest, converged, missing
		wantBehnd string
	}{
		{"all live clusters applied", 5, false, []actual.Cluster{live("a"), live("b")}, []actual.Report{rep("a", 5), rep("b", 6)},
			"[a b] 2 5 true []", "a"},
		{"one behind", 5, false, []actual.Cluster{live("a"), live("b")}, []actual.Report{rep("a", 5), rep("b", 4)},
			"[a b] 1 4 false [b]", "b"},
		{"one not reported yet", 5, false, []actual.Cluster{live("a"), live("b")}, []actual.Report{rep("a", 5)},
			"[a b] 1 0 false [b]", "b"},
		{"a silent cluster does not count", 5, false, []actual.Cluster{live("a"), silent("b")}, []actual.Report{rep("a", 5), rep("b", 1)},
			"[a] 1 5 true []", "a"},
		{"a cluster that never beat does not count", 5, false, []actual.Cluster{live("a"), never("b")}, []actual.Report{rep("a", 5)},
			"[a] 1 5 true []", "a"},
		{"a cluster not serving the kind does not count", 5, false, []actual.Cluster{serving("a", "quota"), serving("b", "other")},
			[]actual.Report{rep("a", 5)}, "[a] 1 5 true []", "a"},
		{"no cluster counts: not converged", 5, false, []actual.Cluster{silent("a")}, []actual.Report{rep("a", 5)},
			"[] 0 0 false []", ""},
		{"a deleted object is applied where no report is left", 7, true, []actual.Cluster{live("a"), live("b")}, []actual.Report{rep("b", 6)},
			"[a b] 1 0 false [b]", "b"},
		{"a report unregistered clusters sent is ignored", 5, false, []actual.Cluster{live("a")}, []actual.Report{rep("a", 5), rep("gone", 1)},
			"[a] 1 5 true []", "a"},
	} {
		r := actual.RollUp("quota", c.version, c.deleted, c.clusters, c.reports, nil, now)
		got := fmt.Sprintf("%v %d %d %v %v", r.Counted, r.Applied, r.Lowest, r.Converged(), r.Missing())
		if r.Missing() == nil {
			got = fmt.Sprintf("%v %d %d %v []", r.Counted, r.Applied, r.Lowest, r.Converged())
		}
		behind, _, _, _ := r.Behind()
		if got != c.want || behind != c.wantBehnd {
			t.Errorf("%s: counted, applied, lowest, converged, missing = %s (behind %q); want %s (behind %q)", c.name, got, behind, c.want, c.wantBehnd)
		}
	}
}
