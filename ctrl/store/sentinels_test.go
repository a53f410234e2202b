package store_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"krane.dev/ctrl/api"
	"krane.dev/ctrl/deployspec"
	"krane.dev/ctrl/store"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
	"krane.dev/shared/kinds"
)

func putTestSentinel(t *testing.T, s *store.Store, id, env, region string) {
	t.Helper()
	if _, err := s.WriteTx(context.Background(), func(ctx context.Context, tx *store.Tx) error {
		return tx.PutSentinel(ctx, store.Sentinel{ID: id, Region: region, WorkspaceID: "ws", ProjectID: "p", AppID: "app", EnvironmentID: env,
			K8sName: "s-" + id, Image: "registry.test/sentinel:1", Replicas: 2, CPUMillicores: 100, MemoryMiB: 128})
	}); err != nil {
		t.Fatal(err)
	}
}

func sentinelState(t *testing.T, s *store.Store, id string) (string, uint64) {
	t.Helper()
	r, err := s.GetSentinel(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return r.DesiredState, r.Version
}

// TestStopSentinelIsASoftDeleteOnce: stop writes stopped at a new version
// and keeps the row; a second stop changes nothing.
func TestStopSentinelIsASoftDeleteOnce(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	putTestSentinel(t, s, "sen_stop", "env", "eu")
	_, v0 := sentinelState(t, s, "sen_stop")
	row, stopped, err := s.StopSentinel(ctx, "sen_stop")
	if err != nil || !stopped || row.DesiredState != "stopped" || row.Version <= v0 || row.Image != "registry.test/sentinel:1" {
		t.Fatalf("stop: %+v %v %v; want stopped at a version above %d, configuration kept", row, stopped, err, v0)
	}
	again, stopped, err := s.StopSentinel(ctx, "sen_stop")
	if err != nil || stopped || again.Version != row.Version {
		t.Fatalf("second stop: version %d stopped %v %v; want no change at %d", again.Version, stopped, err, row.Version)
	}
	if _, _, err := s.StopSentinel(ctx, "sen_nope"); err != store.ErrNotFound {
		t.Fatalf("stop of a missing sentinel: %v, want ErrNotFound", err)
	}
}

// TestUnusedSentinelRecheckedUnderItsLock: the sweep lists a sentinel as
// unused, then a deploy of its environment starts and ensures it before
// the sweep stops it. The stop checks again under the sentinel's row lock
// and leaves it running; a stop that trusted the list would take the
// routing layer from under the deploy.
func TestUnusedSentinelRecheckedUnderItsLock(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	putTestSentinel(t, s, "sen_race", "env-race", "eu")
	if _, err := s.DB().Exec("UPDATE sentinels SET updated_at = 0 WHERE id = 'sen_race'"); err != nil {
		t.Fatal(err)
	}
	since := time.Now()
	ids, err := s.UnusedSentinels(ctx, since, "", 100)
	if err != nil || !slices.Contains(ids, "sen_race") {
		t.Fatalf("unused sentinels: %v %v; want sen_race", ids, err)
	}
	if _, _, err := s.CreateDeployment(ctx, store.Deployment{Spec: deployspec.Spec{ID: "dep_race", WorkspaceID: "ws", ProjectID: "p", EnvironmentID: "env-race", AppID: "app", K8sNamespace: "ns", K8sName: "d-race", Replicas: 1, Workload: &clusterv1.Workload{Image: "registry.test/app:1", CpuMillicores: 100, MemoryMib: 128}}}, ""); err != nil {
		t.Fatal(err)
	}
	waits, err := s.EnsureSentinels(ctx, "dep_race", []store.Sentinel{{ID: "sen_unused_candidate", Region: "eu", EnvironmentID: "env-race",
		K8sName: "s-x", Image: "registry.test/sentinel:1", Replicas: 2, CPUMillicores: 100, MemoryMiB: 128}}, nil)
	if err != nil || len(waits) != 1 || waits[0].ID != "sen_race" || waits[0].Ensured {
		t.Fatalf("ensure: %+v %v; want to wait for the existing, never-ready sentinel", waits, err)
	}
	stopped, err := s.StopUnusedSentinel(ctx, "sen_race", since)
	if err != nil || stopped {
		t.Fatalf("stop of a sentinel a deploy now needs: %v %v", stopped, err)
	}
	if state, _ := sentinelState(t, s, "sen_race"); state != "running" {
		t.Fatalf("sentinel %s with a deploy in progress", state)
	}

	// Once the deployment ended and the grace period passed, it goes.
	if _, _, err := s.TransitionDeployment(ctx, "dep_race", store.InProgress, store.StatusStopped, "test"); err != nil {
		t.Fatal(err)
	}
	if stopped, err := s.StopUnusedSentinel(ctx, "sen_race", time.Now().Add(-time.Hour)); err != nil || stopped {
		t.Fatalf("stop within the grace period: %v %v", stopped, err)
	}
	later := time.Now().Add(time.Hour)
	if stopped, err := s.StopUnusedSentinel(ctx, "sen_race", later); err != nil || !stopped {
		t.Fatalf("stop after the grace period: %v %v", stopped, err)
	}
	if state, _ := sentinelState(t, s, "sen_race"); state != "stopped" {
		t.Fatalf("sentinel %s after the sweep", state)
	}

	// The next deploy sets it running again, with a new version, and waits
	// for it.
	_, vStopped := sentinelState(t, s, "sen_race")
	if _, _, err := s.CreateDeployment(ctx, store.Deployment{Spec: deployspec.Spec{ID: "dep_race2", WorkspaceID: "ws", ProjectID: "p", EnvironmentID: "env-race", AppID: "app", K8sNamespace: "ns", K8sName: "d-race2", Replicas: 1, Workload: &clusterv1.Workload{Image: "registry.test/app:1", CpuMillicores: 100, MemoryMib: 128}}}, ""); err != nil {
		t.Fatal(err)
	}
	for range 2 { // a step run twice answers the same and notes once
		waits, err = s.EnsureSentinels(ctx, "dep_race2", []store.Sentinel{{ID: "sen_other", Region: "eu", EnvironmentID: "env-race",
			K8sName: "s-y", Image: "registry.test/sentinel:1", Replicas: 2, CPUMillicores: 100, MemoryMiB: 128}}, nil)
		if err != nil || len(waits) != 1 || waits[0] != (store.SentinelWait{ID: "sen_race", Region: "eu", Ensured: true}) {
			t.Fatalf("ensure after the stop: %+v %v", waits, err)
		}
	}
	if state, v := sentinelState(t, s, "sen_race"); state != "running" || v <= vStopped {
		t.Fatalf("restarted sentinel: %s at version %d, want running above %d", state, v, vStopped)
	}
	events, err := s.DeploymentEvents(ctx, "dep_race2")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range events {
		if e.Message == "waiting for sentinel sen_race in region eu" {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("history %+v: want the wait noted once", events)
	}
}

// TestSentinelsCarryTheirEnvironmentsRoutes: an environment's sentinels
// carry its hosts and live deployment (namespace, name, port) in their
// desired state; new hosts, a promote and a new sentinel each give the
// environment's sentinels new routes as new versions; a host belongs to
// one environment.
func TestSentinelsCarryTheirEnvironmentsRoutes(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	write := func(fn func(ctx context.Context, tx *store.Tx) error) {
		t.Helper()
		if _, err := s.WriteTx(ctx, fn); err != nil {
			t.Fatal(err)
		}
	}
	routesOf := func(id string) (*clusterv1.SentinelRoutes, uint64) {
		t.Helper()
		region := map[string]string{"sen_1": "eu", "sen_2": "us"}[id]
		c, err := s.Desired(ctx, kinds.Sentinel, region, id)
		if err != nil {
			t.Fatal(err)
		}
		return c.Spec.(*clusterv1.Sentinel).GetRoutes(), c.Version
	}
	write(func(ctx context.Context, tx *store.Tx) error {
		if err := putDeployment(ctx, tx, "d1", "eu", "img:1", 1, "running"); err != nil {
			return err
		}
		return tx.PutSentinel(ctx, store.Sentinel{ID: "sen_1", Region: "eu", EnvironmentID: "env", K8sName: "sen-1", Image: "sen:1", Replicas: 1})
	})
	if r, _ := routesOf("sen_1"); r == nil || len(r.GetHosts()) != 0 || r.Backend != nil {
		t.Fatalf("a new sentinel of an environment with nothing to route: %v", r)
	}
	write(func(ctx context.Context, tx *store.Tx) error {
		return tx.SetEnvironmentHosts(ctx, "env", []string{"a.example.com", "b.example.com"})
	})
	r, v1 := routesOf("sen_1")
	if strings.Join(r.GetHosts(), ",") != "a.example.com,b.example.com" || r.Backend != nil {
		t.Fatalf("after setting hosts: %v", r)
	}
	write(func(ctx context.Context, tx *store.Tx) error { return tx.SetLiveDeployment(ctx, "env", "d1") })
	r, v2 := routesOf("sen_1")
	if b := r.GetBackend(); v2 <= v1 || b.GetDeploymentId() != "d1" || b.GetK8SNamespace() != "ns" || b.GetK8SName() != "d-d1" || b.GetPort() != 8080 {
		t.Fatalf("after the promote: %v at version %d (was %d)", r, v2, v1)
	}
	// The same routes again: no new version.
	write(func(ctx context.Context, tx *store.Tx) error { return tx.SetLiveDeployment(ctx, "env", "d1") })
	if _, v := routesOf("sen_1"); v != v2 {
		t.Fatalf("unchanged routes gave sentinel version %d, was %d", v, v2)
	}
	// A sentinel of the environment in another region starts with its
	// routes.
	write(func(ctx context.Context, tx *store.Tx) error {
		return tx.PutSentinel(ctx, store.Sentinel{ID: "sen_2", Region: "us", EnvironmentID: "env", K8sName: "sen-2", Image: "sen:1", Replicas: 1})
	})
	if r, _ := routesOf("sen_2"); r.GetBackend().GetDeploymentId() != "d1" || len(r.GetHosts()) != 2 {
		t.Fatalf("a new sentinel: %v", r)
	}
	_, err := s.WriteTx(ctx, func(ctx context.Context, tx *store.Tx) error {
		return tx.SetEnvironmentHosts(ctx, "other", []string{"b.example.com"})
	})
	var fe *api.FieldError
	if !errors.As(err, &fe) || !strings.Contains(fe.Reason, "environment env") {
		t.Fatalf("another environment claiming a host: %v; want a field error naming its owner", err)
	}
}
