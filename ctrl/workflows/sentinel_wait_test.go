package workflows_test

//lint:file-ignore SA1019 legacy-workload: removed no earlier than v0.3.0 (docs/compatibility.md); this file builds or reads the deprecated top-level workload fields

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"krane.dev/ctrl/background"
	"krane.dev/ctrl/internal/ctrltest"
	"krane.dev/ctrl/serve"
	"krane.dev/ctrl/store"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
	ctrlv1 "krane.dev/proto/krane/ctrl/v1"
)

// notes returns a deployment's history messages, oldest first, each
// prefixed with the status it is filed under.
func notes(t *testing.T, st *store.Store, id string) []string {
	t.Helper()
	events, err := st.DeploymentEvents(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range events {
		out = append(out, e.Status+": "+e.Message)
	}
	return out
}

func hasNote(t *testing.T, st *store.Store, id, want string) bool {
	t.Helper()
	return slices.ContainsFunc(notes(t, st, id), func(n string) bool { return strings.Contains(n, want) })
}

// newSentinelOf waits until the deploy created the environment's sentinel
// in region, and returns its id.
func newSentinelOf(t *testing.T, st *store.Store, env, region string) string {
	t.Helper()
	var id string
	wait(t, "the sentinel of "+env+" in "+region, 30*time.Second, func() bool {
		id = sentinels(t, st.DB(), env)[region].ID
		return id != ""
	})
	return id
}

// A deploy into a new environment waits for the sentinel it creates: with
// every instance running and the Notifier's ready notice delivered, the
// deployment stays deploying (not ready, not live) while the sentinel's
// cluster has not reported it healthy; once it does, the deploy goes on
// to ready and live. The history shows the wait.
func TestDeployWaitsForItsNewSentinel(t *testing.T) {
	w := newWorld(t, ctrltest.Options{}, "eu")
	eu := w.clusters["eu"]
	eu.Sentinels.Hold()
	st := w.env.Store

	id := w.create(t, &ctrlv1.CreateDeploymentRequest{EnvironmentId: "env-sw", Image: "registry.test/app:1", Replicas: 1})
	sid := newSentinelOf(t, st, "env-sw", "eu")
	waitNote := "waiting for sentinel " + sid + " in region eu"
	wait(t, "the history to show the wait", 30*time.Second, func() bool { return hasNote(t, st, id, waitNote) })
	wait(t, "the sentinel's deploy to take it", 30*time.Second, func() bool {
		return getSentinel(t, st, sid).DeployStatus == store.SentinelProgressing
	})

	// The deployment itself is ready in its region, and ctrl told the
	// workflow so...
	sent0, err := metricValue(w.env, "krane_ctrl_deploy_notifications_total", "result", "sent")
	if err != nil {
		t.Fatal(err)
	}
	eu.ReportRunning(t, id, 1)
	wait(t, "the ready notice to reach the workflow", 30*time.Second, func() bool {
		v, _ := metricValue(w.env, "krane_ctrl_deploy_notifications_total", "result", "sent")
		return v > sent0
	})
	// ...which still waits for the sentinel.
	d, err := w.api.GetDeployment(context.Background(), &ctrlv1.GetDeploymentRequest{DeploymentId: id})
	if err != nil {
		t.Fatal(err)
	}
	if d.GetStatus() != deploying || d.GetLive() {
		t.Fatalf("with its sentinel not yet healthy the deployment is %s (live %v), want deploying and not live", d.GetStatus(), d.GetLive())
	}

	eu.Sentinels.Release(t)
	d, _ = ctrltest.WaitStatus(t, w.api, id, 60*time.Second, ready, failed)
	if d.GetStatus() != ready || !d.GetLive() {
		t.Fatalf("after the sentinel became healthy: %s (%q) live %v, want ready and live", d.GetStatus(), d.GetError(), d.GetLive())
	}
	if s := getSentinel(t, st, sid); s.DeployStatus != store.SentinelReady || s.Image != ctrltest.SentinelImage {
		t.Fatalf("sentinel after the deploy: %s on %s, want ready on the default image", s.DeployStatus, s.Image)
	}
	got := notes(t, st, id)
	iWait := slices.IndexFunc(got, func(n string) bool { return n == "deploying: "+waitNote })
	iReady := slices.IndexFunc(got, func(n string) bool { return n == "deploying: sentinel "+sid+" ready in region eu" })
	iNetwork := slices.IndexFunc(got, func(n string) bool { return strings.HasPrefix(n, "network:") })
	if iWait < 0 || iReady < iWait || iNetwork < iReady {
		t.Fatalf("history %q: want the wait, then the sentinel ready, then network", got)
	}
	wantHistory(t, st, id, "pending", "deploying", "network", "ready")

	// A second deploy into the environment finds the sentinel ready: no
	// wait, and the sentinel is not changed.
	before := getSentinel(t, st, sid)
	id2 := w.create(t, &ctrlv1.CreateDeploymentRequest{EnvironmentId: "env-sw", Image: "registry.test/app:2", Replicas: 1})
	ctrltest.WaitStatus(t, w.api, id2, 30*time.Second, network)
	eu.ReportRunning(t, id2, 1)
	if d, _ := ctrltest.WaitStatus(t, w.api, id2, 30*time.Second, ready, failed); d.GetStatus() != ready {
		t.Fatalf("second deploy: %s %q", d.GetStatus(), d.GetError())
	}
	if hasNote(t, st, id2, "sentinel") {
		t.Fatalf("the second deploy waited for a ready sentinel: %q", notes(t, st, id2))
	}
	if after := getSentinel(t, st, sid); after.Version != before.Version || after.Image != before.Image {
		t.Fatalf("the second deploy changed the sentinel: version %d -> %d, image %s -> %s", before.Version, after.Version, before.Image, after.Image)
	}
}

// A deploy whose new sentinel fails fails with the sentinel's reason, is
// never ready or live, and its topology is cleaned up: at once on a
// permanent apply error, at the sentinel's timeout when it never becomes
// healthy.
func TestDeployFailsWhenItsSentinelFails(t *testing.T) {
	w := newWorld(t, ctrltest.Options{Deps: serve.Deps{}, Configure: func(c *serve.Config) { c.Sentinel.DeployTimeout = 3 * time.Second }}, "eu")
	eu := w.clusters["eu"]
	eu.Sentinels.Hold()
	st := w.env.Store

	t.Run("permanent apply error", func(t *testing.T) {
		id := w.create(t, &ctrlv1.CreateDeploymentRequest{EnvironmentId: "env-sf1", Image: "registry.test/app:1", Replicas: 1, TimeoutSeconds: 600})
		sid := newSentinelOf(t, st, "env-sf1", "eu")
		wait(t, "the cluster to receive the sentinel", 30*time.Second, func() bool { _, _, ok := eu.Sentinels.Latest(sid); return ok })
		before := topology(t, st.DB(), id)
		eu.ReportRunning(t, id, 1)
		eu.Sentinels.ReportApplyError(t, sid, "image", "the registry refuses this image", true)
		d, _ := ctrltest.WaitStatus(t, w.api, id, 60*time.Second, failed, ready)
		want := "sentinel " + sid + " in region eu did not become ready: sentinel " + sid + ": image: the registry refuses this image (cluster eu-1 could not apply version"
		if d.GetStatus() != failed || !strings.HasPrefix(d.GetError(), want) || d.GetLive() {
			t.Fatalf("status %s live %v error %q\nwant failed, not live, with %q", d.GetStatus(), d.GetLive(), d.GetError(), want)
		}
		wantHistory(t, st, id, "pending", "deploying", "failed")
		assertCleanedUp(t, w, id, before)
		if s := getSentinel(t, st, sid); s.DeployStatus != store.SentinelFailed || s.DesiredState != "running" {
			t.Fatalf("sentinel after the failed deploy: %s %s", s.DesiredState, s.DeployStatus)
		}
	})

	t.Run("never healthy", func(t *testing.T) {
		id := w.create(t, &ctrlv1.CreateDeploymentRequest{EnvironmentId: "env-sf2", Image: "registry.test/app:1", Replicas: 1, TimeoutSeconds: 600})
		sid := newSentinelOf(t, st, "env-sf2", "eu")
		wait(t, "the cluster to receive the sentinel", 30*time.Second, func() bool { _, _, ok := eu.Sentinels.Latest(sid); return ok })
		eu.Sentinels.Break(sid, "", "pod cannot pull image")
		eu.Sentinels.Release(t, sid) // one report: unhealthy
		before := topology(t, st.DB(), id)
		eu.ReportRunning(t, id, 1)
		d, _ := ctrltest.WaitStatus(t, w.api, id, 60*time.Second, failed, ready)
		if d.GetStatus() != failed || d.GetLive() || !strings.Contains(d.GetError(), "sentinel "+sid+" in region eu did not become ready: timed out after 3s") ||
			!strings.Contains(d.GetError(), "pod cannot pull image") {
			t.Fatalf("status %s live %v error %q, want failed at the sentinel's 3s timeout with its reason", d.GetStatus(), d.GetLive(), d.GetError())
		}
		wantHistory(t, st, id, "pending", "deploying", "failed")
		assertCleanedUp(t, w, id, before)
	})
}

// A second deploy into an environment whose first deploy is still waiting
// for the sentinel it created waits for that sentinel too: it could
// otherwise become the environment's first live deployment with nothing
// to route through.
func TestSecondDeployWaitsForAConvergingSentinel(t *testing.T) {
	w := newWorld(t, ctrltest.Options{}, "eu")
	eu := w.clusters["eu"]
	eu.Sentinels.Hold()
	st := w.env.Store

	first := w.create(t, &ctrlv1.CreateDeploymentRequest{EnvironmentId: "env-sc", Image: "registry.test/app:1", Replicas: 1})
	sid := newSentinelOf(t, st, "env-sc", "eu")
	wait(t, "the first deploy to wait", 30*time.Second, func() bool { return hasNote(t, st, first, "waiting for sentinel "+sid) })
	second := w.create(t, &ctrlv1.CreateDeploymentRequest{EnvironmentId: "env-sc", Image: "registry.test/app:2", Replicas: 1})
	wait(t, "the second deploy to wait", 30*time.Second, func() bool {
		return hasNote(t, st, second, "waiting for sentinel "+sid+" in region eu (created by another deploy, not ready yet)")
	})
	eu.ReportRunning(t, second, 1)
	eu.ReportRunning(t, first, 1)
	if d, _ := ctrltest.WaitStatus(t, w.api, second, time.Second, deploying, network, ready, failed); d.GetStatus() != deploying {
		t.Fatalf("second deploy %s before the sentinel is healthy, want deploying", d.GetStatus())
	}
	eu.Sentinels.Release(t)
	for _, id := range []string{first, second} {
		if d, _ := ctrltest.WaitStatus(t, w.api, id, 60*time.Second, ready, failed); d.GetStatus() != ready {
			t.Fatalf("deploy %s: %s %q", id, d.GetStatus(), d.GetError())
		}
		if !hasNote(t, st, id, "sentinel "+sid+" ready in region eu") {
			t.Fatalf("history of %s: %q, want the sentinel ready", id, notes(t, st, id))
		}
	}
}

// The idle sweep stops a sentinel only when its environment has had no
// live or in-progress deployment in its region for the grace period:
// Sweep is given the time, so no test waits for an hour.
func TestUnusedSentinelIsStopped(t *testing.T) {
	w := newWorld(t, ctrltest.Options{Configure: func(c *serve.Config) { c.Sentinel.IdleStopAfter = 0 }}, "eu")
	eu := w.clusters["eu"]
	st := w.env.Store
	ctx := context.Background()
	sw := background.NewSentinelSweeper(background.SentinelSweeperOptions{Store: st, IdleAfter: time.Hour})
	later := func() time.Time { return time.Now().Add(2 * time.Hour) }
	sweep := func(now time.Time, want ...string) {
		t.Helper()
		got, err := sw.Sweep(ctx, now)
		if err != nil || !slices.Equal(got, want) {
			t.Fatalf("sweep: stopped %v (%v), want %v", got, err, want)
		}
	}
	deployReady := func(img string) string {
		t.Helper()
		id := w.create(t, &ctrlv1.CreateDeploymentRequest{EnvironmentId: "env-idle", Image: img, Replicas: 1})
		ctrltest.WaitStatus(t, w.api, id, 30*time.Second, network)
		eu.ReportRunning(t, id, 1)
		if d, _ := ctrltest.WaitStatus(t, w.api, id, 30*time.Second, ready, failed); d.GetStatus() != ready {
			t.Fatalf("deploy %s: %s %q", id, d.GetStatus(), d.GetError())
		}
		return id
	}

	live := deployReady("registry.test/app:1")
	sid := sentinels(t, st.DB(), "env-idle")["eu"].ID
	sweep(later()) // the live deployment runs in eu

	// A deploy in progress keeps it too.
	inProgress := w.create(t, &ctrlv1.CreateDeploymentRequest{EnvironmentId: "env-idle", Image: "registry.test/app:2", Replicas: 1})
	ctrltest.WaitStatus(t, w.api, inProgress, 30*time.Second, network)
	if _, err := w.api.StopDeployment(ctx, &ctrlv1.StopDeploymentRequest{DeploymentId: live}); err != nil {
		t.Fatal(err)
	}
	sweep(later())
	if _, err := w.api.StopDeployment(ctx, &ctrlv1.StopDeploymentRequest{DeploymentId: inProgress}); err != nil {
		t.Fatal(err)
	}
	ctrltest.WaitStatus(t, w.api, inProgress, 30*time.Second, stopped)

	// Nothing live or in progress: not yet within the grace period, then
	// stopped, once.
	sweep(time.Now())
	before := getSentinel(t, st, sid)
	sweep(later(), sid)
	after := getSentinel(t, st, sid)
	if after.DesiredState != "stopped" || after.Version <= before.Version || after.Image != before.Image {
		t.Fatalf("swept sentinel: %s at version %d (was %d), image %s", after.DesiredState, after.Version, before.Version, after.Image)
	}
	if ds, err := eu.Client.GetDesiredSentinelState(ctx, &clusterv1.GetDesiredSentinelStateRequest{SentinelId: sid}); err != nil || ds.GetDelete() == nil {
		t.Fatalf("the cluster's desired state of the swept sentinel: %v, %v; want a delete", ds, err)
	}
	sweep(later())

	// The next deploy of the environment starts it again and waits for it.
	next := deployReady("registry.test/app:3")
	if s := getSentinel(t, st, sid); s.DesiredState != "running" || s.Version <= after.Version || s.DeployStatus != store.SentinelReady {
		t.Fatalf("sentinel after the next deploy: %s at version %d, deploy %s", s.DesiredState, s.Version, s.DeployStatus)
	}
	if !hasNote(t, st, next, "waiting for sentinel "+sid+" in region eu") || !hasNote(t, st, next, "sentinel "+sid+" ready in region eu") {
		t.Fatalf("history of the deploy that restarted the sentinel: %q", notes(t, st, next))
	}
}

// ctrl runs the sweep itself with sentinel.idle_stop_after.
func TestIdleSentinelStoppedByCtrl(t *testing.T) {
	w := newWorld(t, ctrltest.Options{Configure: func(c *serve.Config) { c.Sentinel.IdleStopAfter = time.Second }}, "eu")
	st := w.env.Store
	id := w.create(t, &ctrlv1.CreateDeploymentRequest{EnvironmentId: "env-idle2", Image: "registry.test/app:1", Replicas: 1})
	ctrltest.WaitStatus(t, w.api, id, 30*time.Second, network)
	w.clusters["eu"].ReportRunning(t, id, 1)
	if d, _ := ctrltest.WaitStatus(t, w.api, id, 30*time.Second, ready, failed); d.GetStatus() != ready {
		t.Fatalf("deploy: %s %q", d.GetStatus(), d.GetError())
	}
	sid := sentinels(t, st.DB(), "env-idle2")["eu"].ID
	if s := getSentinel(t, st, sid); s.DesiredState != "running" {
		t.Fatalf("the sentinel of a live deployment is %s", s.DesiredState)
	}
	if _, err := w.api.StopDeployment(context.Background(), &ctrlv1.StopDeploymentRequest{DeploymentId: id}); err != nil {
		t.Fatal(err)
	}
	wait(t, "ctrl to stop the unused sentinel", 60*time.Second, func() bool { return getSentinel(t, st, sid).DesiredState == "stopped" })
	if v, err := metricValue(w.env, "krane_ctrl_sentinels_idle_stopped_total", "", ""); err != nil || v != 1 {
		t.Fatalf("krane_ctrl_sentinels_idle_stopped_total = %v (%v), want 1", v, err)
	}
}
