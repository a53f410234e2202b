package workflows_test

//lint:file-ignore SA1019 legacy-workload: removed no earlier than v0.3.0 (docs/compatibility.md); this file builds or reads the deprecated top-level workload fields

import (
	"context"
	"slices"
	"testing"
	"time"

	"krane.dev/ctrl/internal/ctrltest"
	"krane.dev/ctrl/serve"
	"krane.dev/ctrl/workflows"
	"krane.dev/internal/testenv"
	ctrlv1 "krane.dev/proto/krane/ctrl/v1"
)

// TestTwoCtrlsOnARestateClusterSurviveANodeKill runs ctrl as operators
// who outgrow one node do: two ctrl replicas on one database, and a
// three-node Restate cluster (replicated metadata and logs, replication 2
// of 3). Replica a talks to node 1 (its ingress and admin API; it registers
// the endpoint Restate calls), replica b to node 2. The clusters report to
// replica a.
//
//  1. A deploy to two regions; in the middle of it (the workflow waits for
//     the clusters) node 1 is killed: replica a can no longer reach Restate,
//     replica b's resync pass notifies the workflow through node 2, and the
//     deploy finishes on the two nodes left.
//  2. Node 1 comes back. A fleet rollout started through replica b; in the
//     middle of its first wave (the clusters hold their reports) node 2 is
//     killed; the wave and the next finish.
//
// No step's side effect happens twice: each status once in the history,
// one version grant for the topology, versions 1..n with no gap or
// duplicate, each sentinel given exactly one new version by the rollout.
func TestTwoCtrlsOnARestateClusterSurviveANodeKill(t *testing.T) {
	rc, err := testenv.StartRestateCluster(3)
	if err != nil {
		t.Fatalf("a three-node Restate cluster on this machine: %v", err)
	}
	t.Cleanup(rc.Stop)
	fast := func(c *serve.Config) { c.Deploy.ResyncInterval = time.Second }
	a := ctrltest.Start(t, ctrltest.Options{Restate: rc.Nodes[0], Configure: fast})
	b := ctrltest.Start(t, ctrltest.Options{DSN: a.DSN, Restate: rc.Nodes[1], Configure: func(c *serve.Config) {
		fast(c)
		c.Restate.RegisterOnStart = false // Restate calls the endpoint a registered
	}})
	ctx := context.Background()
	db := a.Store.DB()

	// 1. A deploy, node 1 killed while it waits.
	eu, us := a.FakeCluster(t, "eu", "eu-1"), a.FakeCluster(t, "us", "us-1")
	apiA, apiB := a.Deployments(t), b.Deployments(t)
	resp, err := apiA.CreateDeployment(ctx, &ctrlv1.CreateDeploymentRequest{WorkspaceId: "ws1", ProjectId: "proj1", AppId: "app1",
		EnvironmentId: "env-cluster", Image: "registry.test/app:1", Replicas: 2, TimeoutSeconds: 600})
	if err != nil {
		t.Fatal(err)
	}
	id := resp.GetDeploymentId()
	ctrltest.WaitStatus(t, apiA, id, 90*time.Second, network)
	rc.Nodes[0].Kill()
	killed := time.Now()
	eu.ReportRunning(t, id, 2)
	us.ReportRunning(t, id, 2)
	d, _ := ctrltest.WaitStatus(t, apiB, id, 180*time.Second, ready, failed)
	if d.GetStatus() != ready || !d.GetLive() {
		t.Fatalf("deploy after node 1 died: %s (%s) live %v, want ready and live", d.GetStatus(), d.GetError(), d.GetLive())
	}
	t.Logf("deploy: ready %s after node 1 was killed", time.Since(killed).Round(time.Millisecond))
	wantHistory(t, a.Store, id, "pending", "deploying", "network", "ready")
	var grants int
	if err := db.QueryRow("SELECT COUNT(*) FROM version_grants").Scan(&grants); err != nil || grants != 1 {
		t.Fatalf("%d version grants (%v), want 1: the topology stamped once", grants, err)
	}
	topo, pol, sens := topology(t, db, id), ingressPolicies(t, db, id), sentinels(t, db, "env-cluster")
	checkDeployVersions(t, []uint64{topo["eu"].Version, topo["us"].Version, pol["eu"].Version, pol["us"].Version}, sens["eu"].Version, sens["us"].Version)

	// 2. Node 1 back; a rollout through replica b, node 2 killed mid-wave.
	if err := rc.Nodes[0].Start(); err != nil {
		t.Fatalf("restart node 1: %v", err)
	}
	// The rollout is of these four; the deploy's sentinels (one of them in
	// us, where no cluster runs sentinels here) are stopped and already on
	// the rollout's image, so it leaves them out (a rollout sets the image
	// of stopped sentinels too, and skips those that have it).
	if _, err := db.Exec("UPDATE sentinels SET desired_state = 'stopped', image = ? WHERE environment_id = 'env-cluster'", imgV2); err != nil {
		t.Fatal(err)
	}
	cluster := a.SentinelCluster(t, "eu", "eu-2")
	ids := a.CreateSentinels(t, "eu", "sen-cluster", imgV1, 4)
	waitConverged(t, a.Store, ids...)
	before := sentinelRows(t, a.Store)
	head, err := a.Store.Head(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cluster.Hold()
	rollouts := b.Rollouts(t)
	if _, err := rollouts.StartRollout(ctx, &ctrlv1.StartRolloutRequest{Image: imgV2, WavePercentages: []int32{50, 100}, DeployTimeoutSeconds: 600}); err != nil {
		t.Fatal(err)
	}
	wait(t, "wave 1 to reach the cluster", 90*time.Second, func() bool {
		n := 0
		for _, id := range ids {
			if _, spec, ok := cluster.Latest(id); ok && spec.GetImage() == imgV2 {
				n++
			}
		}
		return n == 2
	})
	rc.Nodes[1].Kill()
	killed = time.Now()
	cluster.Release(t)
	statusA := a.Rollouts(t)
	deadline := time.Now().Add(180 * time.Second)
	var st *ctrlv1.RolloutStatus
	for {
		st, err = statusA.GetRolloutStatus(ctx, &ctrlv1.GetRolloutStatusRequest{})
		if err == nil && st.GetState() == workflows.RolloutCompleted {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("rollout after node 2 died: %v, %v; want completed", st, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("rollout: completed %s after node 2 was killed mid-wave", time.Since(killed).Round(time.Millisecond))
	if st.GetSucceeded() != int32(len(ids)) || st.GetFailed() != 0 {
		t.Fatalf("rollout %v: want every sentinel ready", st)
	}
	after := sentinelRows(t, a.Store)
	var versions []uint64
	for _, id := range ids {
		if after[id].Image != imgV2 || after[id].Version <= before[id].Version {
			t.Fatalf("sentinel %s: %+v after the rollout (was %+v)", id, after[id], before[id])
		}
		versions = append(versions, after[id].Version)
	}
	newHead, err := a.Store.Head(ctx)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(versions)
	if newHead-head != uint64(len(ids)) || versions[0] != head+1 || versions[len(versions)-1] != newHead {
		t.Fatalf("the rollout handed out versions %d..%d for sentinels at %v: want exactly one new version per sentinel", head+1, newHead, versions)
	}
}
