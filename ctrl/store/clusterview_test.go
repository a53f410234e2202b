package store_test

import (
	"context"
	"testing"
	"time"

	"krane.dev/ctrl/store"
	"krane.dev/shared/kinds"
)

// TestStampRecordsWhenAndPendingSinceFindsTheOldest: every stamp records
// when the row got its version; PendingSince returns that time for the
// oldest change above a cursor, per kind and region, and nothing for a
// cursor at the head.
func TestStampRecordsWhenAndPendingSinceFindsTheOldest(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	put := func(id, region string) uint64 {
		t.Helper()
		st, err := s.WriteTx(ctx, func(ctx context.Context, tx *store.Tx) error {
			return putDeployment(ctx, tx, id, region, "img:1", 1, "running")
		})
		if err != nil {
			t.Fatal(err)
		}
		return st[len(st)-1].Version
	}
	before := time.Now().Add(-time.Second)
	v1 := put("d1", "eu")
	v2 := put("d2", "eu")
	put("d3", "us")
	after := time.Now().Add(time.Second)
	// d2 got its version an hour ago, as far as the lag is concerned.
	if _, err := s.DB().ExecContext(ctx, "UPDATE deployment_topology SET version_at = version_at - 3600000 WHERE deployment_id = 'd2'"); err != nil {
		t.Fatal(err)
	}
	k0 := store.PendingKey{Region: "eu", Kind: kinds.Deployment, Cursor: 0}
	k1 := store.PendingKey{Region: "eu", Kind: kinds.Deployment, Cursor: v1}
	k2 := store.PendingKey{Region: "eu", Kind: kinds.Deployment, Cursor: v2}
	kSentinel := store.PendingKey{Region: "eu", Kind: kinds.Sentinel, Cursor: 0}
	got, err := s.PendingSince(ctx, []store.PendingKey{k0, k1, k2, kSentinel, k1})
	if err != nil {
		t.Fatal(err)
	}
	if at, ok := got[k0]; !ok || at.Before(before) || at.After(after) {
		t.Fatalf("oldest deployment change in eu above 0 (d1, stamped just now): %v, %v", at, ok)
	}
	if at, ok := got[k1]; !ok || at.After(before.Add(-59*time.Minute)) {
		t.Fatalf("oldest deployment change in eu above %d (d2, an hour old): %v, %v", v1, at, ok)
	}
	if _, ok := got[k2]; ok {
		t.Fatalf("a change above the head of eu: %v", got[k2])
	}
	if _, ok := got[kSentinel]; ok {
		t.Fatalf("a sentinel change in eu, where there is none: %v", got[kSentinel])
	}
}

// TestHeartbeatKeepsTheHostReportOrSaysNotReported: a heartbeat with a
// host report stores its controllers and parked counts in the cluster's
// row; one without (an older host) clears them back to "not reported";
// ClustersIn reads them for the regions asked.
func TestHeartbeatKeepsTheHostReportOrSaysNotReported(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	for _, c := range []struct{ id, region string }{{"eu-1", "eu"}, {"eu-2", "eu"}, {"us-1", "us"}} {
		if err := s.RegisterCluster(ctx, c.id, c.region, store.Token{ID: "tok-" + c.id, CreatedAt: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	report := &store.HostReport{
		Controllers: []store.ControllerStatus{{Name: "deployment", PluginVersion: "1.0.0", Kinds: []string{kinds.Deployment}, Running: true}},
		Parked:      map[string]int{kinds.Deployment: 3},
	}
	if err := s.Heartbeat(ctx, "eu-1", "eu", store.HeartbeatData{AgentVersion: "2.0.0", Cursors: map[string]uint64{kinds.Deployment: 7}, Host: report}); err != nil {
		t.Fatal(err)
	}
	if err := s.Heartbeat(ctx, "eu-1", "us", store.HeartbeatData{}); err == nil {
		t.Fatal("a heartbeat of eu-1 claiming region us was recorded")
	}
	list, err := s.ListClusters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	eu1 := list[0]
	if eu1.ID != "eu-1" || eu1.Host == nil || len(eu1.Host.Controllers) != 1 || !eu1.Host.Owns(kinds.Deployment) || eu1.Host.Owns(kinds.Sentinel) ||
		eu1.Host.Parked[kinds.Deployment] != 3 || eu1.Cursors[kinds.Deployment] != 7 {
		t.Fatalf("eu-1 after a heartbeat with a host report: %+v (host %+v)", eu1, eu1.Host)
	}
	if list[1].Host != nil {
		t.Fatalf("eu-2 never sent a heartbeat but has a host report: %+v", list[1].Host)
	}
	live, err := s.ClustersIn(ctx, []string{"eu"})
	if err != nil {
		t.Fatal(err)
	}
	if len(live) != 2 || live[0].ID != "eu-1" || !live[0].Host.Owns(kinds.Deployment) || live[0].LastHeartbeatAt.IsZero() ||
		live[1].ID != "eu-2" || !live[1].LastHeartbeatAt.IsZero() || live[1].Host != nil {
		t.Fatalf("clusters in eu: %+v", live)
	}

	// The host is replaced by an older one: the report is gone, not kept stale.
	if err := s.Heartbeat(ctx, "eu-1", "eu", store.HeartbeatData{AgentVersion: "1.0.0"}); err != nil {
		t.Fatal(err)
	}
	if live, err = s.ClustersIn(ctx, []string{"eu", "us"}); err != nil {
		t.Fatal(err)
	}
	if len(live) != 3 || live[0].Host != nil {
		t.Fatalf("clusters in eu and us after an older host's heartbeat: %+v", live)
	}
	if _, err := s.RevokeClusterTokens(ctx, "us-1"); err != nil {
		t.Fatal(err)
	}
	if live, err = s.ClustersIn(ctx, []string{"us"}); err != nil || len(live) != 0 {
		t.Fatalf("clusters in us after its only cluster's tokens were revoked: %+v, %v", live, err)
	}
}
