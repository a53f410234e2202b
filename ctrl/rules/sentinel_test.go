package rules_test

import (
	"strings"
	"testing"
	"time"

	"krane.dev/ctrl/actual"
	"krane.dev/ctrl/rules"
	"krane.dev/ctrl/store"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
	"krane.dev/shared/kinds"
)

func TestEvaluateSentinel(t *testing.T) {
	row := func(mod func(*store.SentinelRow)) store.SentinelRow {
		r := store.SentinelRow{Sentinel: store.Sentinel{ID: "s1", Region: "eu", Image: "img:2", Replicas: 2, DesiredState: "running"},
			Version: 10, ReportObservedVersion: 10, RunningImage: "img:2", Health: "healthy", AvailableReplicas: 2}
		if mod != nil {
			mod(&r)
		}
		return sentinelReports(r, "eu-1")
	}
	// eu-2 counts too and still runs version 9.
	second := row(nil)
	second.Reports = append(second.Reports, store.SentinelReport{ClusterID: "eu-2", Version: 9,
		Status: &clusterv1.SentinelStatus{RunningImage: "img:1", AvailableReplicas: 2, Health: clusterv1.Health_HEALTH_HEALTHY}})
	now := time.Now()
	second.Actual = actual.RollUp(kinds.Sentinel, 10, false, []actual.Cluster{{ID: "eu-1", LastHeartbeat: now}, {ID: "eu-2", LastHeartbeat: now}},
		[]actual.Report{{ClusterID: "eu-1", Version: 10}, {ClusterID: "eu-2", Version: 9}}, nil, now)
	// eu-2 is silent past the live window: it holds nothing back.
	silent := second
	silent.Actual = actual.RollUp(kinds.Sentinel, 10, false, []actual.Cluster{{ID: "eu-1", LastHeartbeat: now}, {ID: "eu-2", LastHeartbeat: now.Add(-actual.LiveWindow - time.Second)}},
		[]actual.Report{{ClusterID: "eu-1", Version: 10}, {ClusterID: "eu-2", Version: 9}}, nil, now)
	silent.Reports = silent.Reports[:1]
	for _, c := range []struct {
		name   string
		row    store.SentinelRow
		errs   []store.ApplyError
		result string
		msg    string
	}{
		{"converged", row(nil), nil, rules.ResultReady, ""},
		{"a later version reported", row(func(r *store.SentinelRow) { r.ReportObservedVersion = 11 }), nil, rules.ResultReady, ""},
		{"healthy on the image at an older version", row(func(r *store.SentinelRow) { r.ReportObservedVersion = 9 }), nil, "", "has not reported version 10 yet"},
		{"still on the old image", row(func(r *store.SentinelRow) { r.RunningImage = "img:1" }), nil, "", `runs "img:1", not img:2`},
		{"mid-rollout", row(func(r *store.SentinelRow) {
			r.RunningImage, r.Health, r.HealthReason = "", "unhealthy", "progressing: 1/2 updated"
		}), nil, "", "unhealthy: progressing: 1/2 updated"},
		{"too few available", row(func(r *store.SentinelRow) { r.AvailableReplicas = 1 }), nil, "", "1 of 2 replicas available"},
		{"paused at zero replicas", row(func(r *store.SentinelRow) {
			r.Replicas, r.RunningImage, r.Health, r.AvailableReplicas = 0, "", "paused", 0
		}), nil, rules.ResultReady, ""},
		{"stopped", row(func(r *store.SentinelRow) { r.DesiredState = "stopped" }), nil, rules.ResultFailed, "was stopped"},
		{"reported deleted", row(func(r *store.SentinelRow) { r.ReportedDeleted = true }), nil, "", ""},
		{"permanent apply error on the version", row(func(r *store.SentinelRow) { r.ReportObservedVersion = 9 }),
			[]store.ApplyError{{Region: "eu", ClusterID: "eu-1", Version: 10, Message: "not a valid image", Field: "image", Permanent: true}}, rules.ResultFailed,
			"image: not a valid image (cluster eu-1 could not apply version 10)"},
		{"permanent apply error on an older version", row(func(r *store.SentinelRow) { r.ReportObservedVersion = 9 }),
			[]store.ApplyError{{Region: "eu", ClusterID: "eu-1", Version: 9, Message: "old", Permanent: true}}, "", "has not reported version 10"},
		{"permanent apply error from another region's cluster", row(func(r *store.SentinelRow) { r.ReportObservedVersion = 9 }),
			[]store.ApplyError{{Region: "us", ClusterID: "us-1", Version: 10, Message: "not a valid image", Permanent: true}}, "", "has not reported version 10"},
		{"retryable apply error", row(func(r *store.SentinelRow) { r.ReportObservedVersion = 9 }),
			[]store.ApplyError{{Region: "eu", ClusterID: "eu-1", Version: 10, Message: "apiserver timeout"}}, "", "retrying: apiserver timeout"},
		{"a second counted cluster behind", second, nil, "", "cluster eu-2 has not reported version 10 yet (last report: version 9, healthy)"},
		{"a silent second cluster", silent, nil, rules.ResultReady, ""},
		{"no live cluster", func() store.SentinelRow { r := row(nil); r.Actual.Counted = nil; return r }(), nil, "", "no live cluster of region eu serves sentinels"},
	} {
		o := rules.EvaluateSentinel(c.row, c.errs)
		if o.Result != c.result || !strings.Contains(o.Message, c.msg) {
			t.Errorf("%s: %+v, want result %q with %q", c.name, o, c.result, c.msg)
		}
	}
}

// sentinelReports makes a row's reports from its legacy one-cluster
// fields: cluster counts and reported them.
func sentinelReports(r store.SentinelRow, cluster string) store.SentinelRow {
	health := map[string]clusterv1.Health{"healthy": clusterv1.Health_HEALTH_HEALTHY, "unhealthy": clusterv1.Health_HEALTH_UNHEALTHY,
		"paused": clusterv1.Health_HEALTH_PAUSED}[r.Health]
	st := &clusterv1.SentinelStatus{RunningImage: r.RunningImage, AvailableReplicas: r.AvailableReplicas, Health: health, Reason: r.HealthReason}
	r.Reports = []store.SentinelReport{{ClusterID: cluster, Version: r.ReportObservedVersion, Deleted: r.ReportedDeleted, Status: st}}
	now := time.Now()
	r.Actual = actual.RollUp(kinds.Sentinel, r.Version, r.DesiredState != "running", []actual.Cluster{{ID: cluster, LastHeartbeat: now}},
		[]actual.Report{{ClusterID: cluster, Version: r.ReportObservedVersion, Deleted: r.ReportedDeleted}}, nil, now)
	return r
}
