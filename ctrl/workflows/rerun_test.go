package workflows_test

//lint:file-ignore SA1019 legacy-workload: removed no earlier than v0.3.0 (docs/compatibility.md); this file builds or reads the deprecated top-level workload fields

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	restate "github.com/restatedev/sdk-go"

	"krane.dev/ctrl/internal/ctrltest"
	"krane.dev/ctrl/restateingress"
	"krane.dev/ctrl/serve"
	"krane.dev/ctrl/store"
	"krane.dev/ctrl/workflows"
	"krane.dev/internal/testenv"
	ctrlv1 "krane.dev/proto/krane/ctrl/v1"
)

// errCrashed stands for a process that died after a step's side effects
// committed and before Restate journaled its result.
var errCrashed = errors.New("injected: the process died after the step's side effects and before Restate journaled its result")

// rerun makes every execution of the chosen steps run twice: the first
// time a body of one of them completes in an invocation, its result is
// lost (errCrashed) and Restate runs it again; the second time it goes
// through. Restate replays journaled steps without running them, so the
// bodies that complete alternate first run, re-run.
type rerun struct {
	steps []string

	mu       sync.Mutex
	complete map[string]int // invocation + step -> bodies completed
	reruns   map[string]int // step -> re-runs caused
}

func newRerun(steps ...string) *rerun {
	return &rerun{steps: steps, complete: map[string]int{}, reruns: map[string]int{}}
}

// hook is the rerun's Hooks.AfterStep.
func (r *rerun) hook(ctx context.Context, step string) error {
	if !slices.Contains(r.steps, step) {
		return nil
	}
	key := invocationID(ctx) + "/" + step
	r.mu.Lock()
	defer r.mu.Unlock()
	r.complete[key]++
	if r.complete[key]%2 == 1 {
		r.reruns[step]++
		return errCrashed
	}
	return nil
}

// count is how many re-runs step was put through.
func (r *rerun) count(step string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.reruns[step]
}

func invocationID(ctx context.Context) string {
	if rc, ok := ctx.(restate.RunContext); ok {
		return rc.Request().ID
	}
	return ""
}

// TestDeployStatusStepRunTwiceStillDeploys re-runs the compare-and-set
// status steps: the second run finds the row already at the target
// status. That is the step's own work, not someone else's; the deploy must
// go on to ready with each status in its history once.
func TestDeployStatusStepRunTwiceStillDeploys(t *testing.T) {
	rr := newRerun("DeployWorkflow.status-deploying", "DeployWorkflow.status-network")
	w := newWorld(t, ctrltest.Options{Deps: serve.Deps{WorkflowHooks: workflows.Hooks{AfterStep: rr.hook}}}, "eu")
	id := w.create(t, &ctrlv1.CreateDeploymentRequest{EnvironmentId: "env-rerun-status", Image: "registry.test/app:1", Replicas: 1})
	ctrltest.WaitStatus(t, w.api, id, 60*time.Second, network)
	w.clusters["eu"].ReportRunning(t, id, 1)
	d, _ := ctrltest.WaitStatus(t, w.api, id, 60*time.Second, ready, failed)
	if d.GetStatus() != ready || !d.GetLive() {
		t.Fatalf("status %s (%q) live %v, want ready and live", d.GetStatus(), d.GetError(), d.GetLive())
	}
	if rr.count("DeployWorkflow.status-deploying") != 1 || rr.count("DeployWorkflow.status-network") != 1 {
		t.Fatalf("re-runs %v, want one of each status step", rr.reruns)
	}
	wantHistory(t, w.env.Store, id, "pending", "deploying", "network", "ready")
}

// deployResult waits for a deploy workflow's result.
func deployResult(t *testing.T, env *ctrltest.Env, id string) workflows.DeployResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	res, err := restateingress.DeployOutcome(ctx, env.Ingress(t, true), id)
	if err != nil {
		t.Fatalf("the result of deploy %s: %v", id, err)
	}
	return res
}

// TestDeploySentinelsStepRunTwiceReportsTheSentinels: the step that
// creates the environment's sentinels, run twice, finds them created by its
// first run; the deploy's result must still name them.
func TestDeploySentinelsStepRunTwiceReportsTheSentinels(t *testing.T) {
	rr := newRerun("DeployWorkflow.sentinels")
	rs := testenv.SharedRestate(t)
	w := newWorld(t, ctrltest.Options{Restate: rs, Deps: serve.Deps{WorkflowHooks: workflows.Hooks{AfterStep: rr.hook}}}, "eu", "us")
	id := w.create(t, &ctrlv1.CreateDeploymentRequest{EnvironmentId: "env-rerun-sentinels", Image: "registry.test/app:1", Replicas: 1})
	ctrltest.WaitStatus(t, w.api, id, 60*time.Second, network)
	w.clusters["eu"].ReportRunning(t, id, 1)
	w.clusters["us"].ReportRunning(t, id, 1)
	res := deployResult(t, w.env, id)
	sens := sentinels(t, w.env.Store.DB(), "env-rerun-sentinels")
	want := []string{sens["eu"].ID, sens["us"].ID}
	slices.Sort(want)
	got := slices.Sorted(slices.Values(res.Sentinels))
	if rr.count("DeployWorkflow.sentinels") != 1 || res.Status != "ready" || !slices.Equal(got, want) {
		t.Fatalf("after %d re-runs: result %s with sentinels %v, want ready with the two it created %v", rr.count("DeployWorkflow.sentinels"), res.Status, got, want)
	}
}

// TestSentinelWriteStepRunTwiceReportsTheChange: SentinelService.Deploy's
// write step, run twice, finds the new configuration written by its first
// run; the deploy's result must still say it changed the sentinel, at the
// version the first run stamped.
func TestSentinelWriteStepRunTwiceReportsTheChange(t *testing.T) {
	rr := newRerun("SentinelService.write")
	rs := testenv.SharedRestate(t)
	env := ctrltest.Start(t, ctrltest.Options{Restate: rs, Deps: serve.Deps{WorkflowHooks: workflows.Hooks{AfterStep: rr.hook}}})
	env.SentinelCluster(t, "eu", "eu-1")
	id := env.CreateSentinels(t, "eu", "sen-rerun", "registry.test/sentinel:1", 1)[0]
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	c := env.Ingress(t, true)
	inv, err := restateingress.StartSentinelDeploy(ctx, c, id, workflows.SentinelDeployRequest{Image: "registry.test/sentinel:2", TimeoutSeconds: 60})
	if err != nil {
		t.Fatal(err)
	}
	res, err := restateingress.SentinelDeployOutcome(ctx, c, inv)
	if err != nil {
		t.Fatal(err)
	}
	row, err := env.Store.GetSentinel(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if rr.count("SentinelService.write") != 1 || res.Status != "ready" || !res.Changed || res.Version != row.Version || res.Image != "registry.test/sentinel:2" {
		t.Fatalf("after %d re-runs: %+v; want ready, changed, at version %d with the new image", rr.count("SentinelService.write"), res, row.Version)
	}
}

// TestDeployFoundFinishedByOthersReportsItsStatus: when the readiness
// check finds the deployment moved on by another writer (here: failed while
// the workflow moved it to network), the workflow ends without touching it,
// and its result says what the deployment is.
func TestDeployFoundFinishedByOthersReportsItsStatus(t *testing.T) {
	rs := testenv.SharedRestate(t)
	var st atomic.Pointer[store.Store]
	hook := func(ctx context.Context, step string) error {
		if step != "DeployWorkflow.status-network" {
			return nil
		}
		var req workflows.DeployRequest
		if err := json.Unmarshal(ctx.(restate.RunContext).Request().Body, &req); err != nil {
			return err
		}
		_, _, err := st.Load().TransitionDeployment(ctx, req.Deployment.ID, []string{"network"}, "failed", "failed by another writer")
		return err
	}
	w := newWorld(t, ctrltest.Options{Restate: rs, Deps: serve.Deps{WorkflowHooks: workflows.Hooks{AfterStep: hook}}}, "eu")
	st.Store(w.env.Store)
	id := w.create(t, &ctrlv1.CreateDeploymentRequest{EnvironmentId: "env-gone", Image: "registry.test/app:1", Replicas: 1})
	res := deployResult(t, w.env, id)
	if res.Status != "failed" {
		t.Fatalf("result %+v, want status failed (the deployment's own)", res)
	}
	wantHistory(t, w.env.Store, id, "pending", "deploying", "network", "failed")
}
