package workflows_test

//lint:file-ignore SA1019 legacy-workload: removed no earlier than v0.3.0 (docs/compatibility.md); this file builds or reads the deprecated top-level workload fields

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"krane.dev/ctrl/internal/ctrltest"
	"krane.dev/ctrl/serve"
	"krane.dev/ctrl/workflows"
	"krane.dev/internal/testenv"
	ctrlv1 "krane.dev/proto/krane/ctrl/v1"
)

// stepLog counts the restate.Run bodies that completed, across ctrls.
type stepLog struct {
	mu    sync.Mutex
	steps map[string]int
}

func (l *stepLog) add(step string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.steps == nil {
		l.steps = map[string]int{}
	}
	l.steps[step]++
	return l.steps[step]
}

func (l *stepLog) count(step string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.steps[step]
}

// TestDeploySurvivesRestateKillAndCtrlRestart crashes Restate (SIGKILL)
// and restarts ctrl twice during one deploy:
//
//  1. inside the VersioningService's stamp step, after its transaction
//     committed and before Restate journaled the result, so the step runs
//     again on the next ctrl and must get the same versions back;
//  2. while the workflow waits, with the clusters' reports arriving while
//     Restate is down, so the wake-up is lost and must be recovered by the
//     next ctrl's resync pass.
//
// The deploy must complete exactly once: one deployment row, one grant for
// the topology versions, one sentinel per region, no gap in the versions,
// every status once.
func TestDeploySurvivesRestateKillAndCtrlRestart(t *testing.T) {
	rs := testenv.SharedRestate(t)
	dsn := testenv.SharedMySQL(t).Database(t, t.Name())
	port, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	listen := fmt.Sprintf("127.0.0.1:%d", port)
	steps := &stepLog{}
	inStamp := make(chan struct{}, 1)
	startCtrl := func(crashInStamp bool) *world {
		hooks := workflows.Hooks{AfterStep: func(ctx context.Context, step string) error {
			n := steps.add(step)
			if crashInStamp && step == "VersioningService.stamp" && n == 1 {
				inStamp <- struct{}{}
				<-ctx.Done() // hold the step open until its stream dies
			}
			return nil
		}}
		return newWorld(t, ctrltest.Options{
			DSN: dsn, Restate: rs, RestateListen: listen, Deps: serve.Deps{WorkflowHooks: hooks},
			Configure: func(c *serve.Config) { c.Deploy.ResyncInterval = time.Second },
		}, "eu", "us")
	}
	crash := func(w *world) {
		t.Helper()
		rs.Kill()
		if err := w.env.Server.Stop(); err != nil {
			t.Fatalf("stop ctrl: %v", err)
		}
		if err := rs.Start(); err != nil {
			t.Fatalf("restart Restate: %v", err)
		}
	}

	// Crash 1: inside the stamp step.
	a := startCtrl(true)
	id := a.create(t, &ctrlv1.CreateDeploymentRequest{EnvironmentId: "env-crash", Image: "registry.test/app:1", Replicas: 2, TimeoutSeconds: 120})
	select {
	case <-inStamp:
	case <-time.After(30 * time.Second):
		t.Fatal("the deploy never reached the stamp step")
	}
	topo := topology(t, a.env.Store.DB(), id)
	if topo["eu"].Version == 0 || topo["us"].Version == 0 {
		t.Fatalf("topology %+v: the stamp transaction should have committed before the crash", topo)
	}
	crash(a)

	// Crash 2: while waiting, with the reports lost.
	b := startCtrl(false)
	ctrltest.WaitStatus(t, b.api, id, 60*time.Second, network)
	if n := steps.count("VersioningService.stamp"); n != 2 {
		t.Fatalf("the stamp step ran %d times, want 2 (once before the crash, once after)", n)
	}
	// The workflow has checked the database and waits on its promise: from
	// here only a notification (or the 120 s timeout) can end the wait.
	wait(t, "the workflow's readiness check", 30*time.Second, func() bool { return steps.count("DeployWorkflow.check") == 1 })
	rs.Kill()
	lost := time.Now()
	b.clusters["eu"].ReportRunning(t, id, 2)
	b.clusters["us"].ReportRunning(t, id, 2)
	if err := b.env.Server.Stop(); err != nil {
		t.Fatalf("stop ctrl: %v", err)
	}
	if err := rs.Start(); err != nil {
		t.Fatalf("restart Restate: %v", err)
	}

	c := startCtrl(false)
	d, _ := ctrltest.WaitStatus(t, c.api, id, 60*time.Second, ready, failed)
	if d.GetStatus() != ready || !d.GetLive() {
		t.Fatalf("status %s (%q) live %v, want ready and live", d.GetStatus(), d.GetError(), d.GetLive())
	}
	recovered := time.Since(lost)
	if recovered > 60*time.Second || steps.count("DeployWorkflow.final-check") != 0 {
		t.Fatalf("ready %s after the lost reports, by the timeout's final check: the resync pass should have woken it", recovered)
	}

	// Exactly once.
	db := c.env.Store.DB()
	var rows int
	if err := db.QueryRow("SELECT COUNT(*) FROM deployments").Scan(&rows); err != nil || rows != 1 {
		t.Fatalf("%d deployment rows (%v), want 1", rows, err)
	}
	events, err := c.env.Store.DeploymentEvents(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	// Each status once; the deploying entries after the first are the
	// notes of the sentinel wait, each once too.
	var statuses, messages []string
	for _, e := range events {
		if len(statuses) == 0 || statuses[len(statuses)-1] != e.Status {
			statuses = append(statuses, e.Status)
		} else if slices.Contains(messages, e.Message) {
			t.Fatalf("history %+v: %q twice", events, e.Message)
		}
		messages = append(messages, e.Message)
	}
	if !slices.Equal(statuses, []string{"pending", "deploying", "network", "ready"}) || len(events) != 4+4 {
		t.Fatalf("history %+v, want each status exactly once (pending, deploying, network, ready) and the wait for the two new sentinels", events)
	}
	topo = topology(t, db, id)
	sens := sentinels(t, db, "env-crash")
	if len(topo) != 2 || len(sens) != 2 {
		t.Fatalf("topology %+v sentinels %+v, want two regions each", topo, sens)
	}
	var grants int
	if err := db.QueryRow("SELECT COUNT(*) FROM version_grants").Scan(&grants); err != nil || grants != 1 {
		t.Fatalf("%d version grants (%v), want 1: the re-run stamp step must reuse the first grant", grants, err)
	}
	pol := ingressPolicies(t, db, id)
	stamped := []uint64{topo["eu"].Version, topo["us"].Version, pol["eu"].Version, pol["us"].Version}
	if first, last := grantCovering(t, db, topo["eu"].Version); first != slices.Min(stamped) || last != slices.Max(stamped) {
		t.Fatalf("grant %d..%d, topology and ingress policies at %v", first, last, stamped)
	}
	// Every version handed out in this database went to these six rows:
	// 1..8 with no gap and no duplicate (the sentinels twice).
	versions := append(stamped, sens["eu"].Version, sens["us"].Version)
	checkDeployVersions(t, stamped, sens["eu"].Version, sens["us"].Version)
	head, err := c.env.Store.Head(context.Background())
	if err != nil || head != 8 {
		t.Fatalf("version head %d (%v), want 8", head, err)
	}
	if topo["eu"].Version >= sens["eu"].Version {
		t.Fatalf("versions %v: the topology is stamped before the sentinels are created", versions)
	}
	t.Logf("crash test: stamp step ran %d times, one grant %d..%d; sentinels at %d, %d; history %v; ready %s after the reports lost with Restate",
		steps.count("VersioningService.stamp"), topo["eu"].Version, topo["us"].Version, sens["eu"].Version, sens["us"].Version, statuses,
		recovered.Round(time.Millisecond))
}
