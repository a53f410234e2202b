package workflows_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	restate "github.com/restatedev/sdk-go"

	"krane.dev/ctrl/internal/ctrltest"
	"krane.dev/ctrl/serve"
	"krane.dev/ctrl/workflows"
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
