package workflows_test

//lint:file-ignore SA1019 legacy-workload: removed no earlier than v0.3.0 (docs/compatibility.md); this file builds or reads the deprecated top-level workload fields

import (
	"bytes"
	"context"
	"strings"
	"sync"
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

// holdKind marks the Stamp call a test holds inside the VersioningService.
const holdKind = "test.hold"

// versioningHold holds the VersioningService singleton: a Stamp call of a
// holdKind row whose step does not end until release. Every other Stamp
// queues behind it, as behind an invocation paused in Restate.
type versioningHold struct {
	once    sync.Once
	release chan struct{}
	held    chan struct{}
}

func newVersioningHold() *versioningHold {
	return &versioningHold{release: make(chan struct{}), held: make(chan struct{}, 1)}
}

// hook is the hold's Hooks.AfterStep.
func (h *versioningHold) hook(ctx context.Context, step string) error {
	if step != "VersioningService.stamp" || !bytes.Contains(ctx.(restate.RunContext).Request().Body, []byte(holdKind)) {
		return nil
	}
	select {
	case h.held <- struct{}{}:
	default:
	}
	select {
	case <-h.release:
	case <-ctx.Done():
	}
	return nil
}

func (h *versioningHold) Release() { h.once.Do(func() { close(h.release) }) }

// hold starts the held Stamp call and waits until it holds the singleton.
func (h *versioningHold) hold(t *testing.T, env *ctrltest.Env) { h.holdAsync(t, env) }

// holdAsync starts the held Stamp call (see versioningHold) and returns a
// channel closed when it has ended.
func (h *versioningHold) holdAsync(t *testing.T, env *ctrltest.Env) chan struct{} {
	t.Helper()
	if _, err := env.Store.WriteTx(context.Background(), func(ctx context.Context, tx *store.Tx) error {
		return tx.PutResource(ctx, store.Resource{Kind: holdKind, Region: "nowhere", ID: "h1", Spec: []byte(`{}`)})
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Release)
	c := env.Ingress(t, true)
	done := make(chan struct{})
	go func() {
		defer close(done)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		_, _ = restateingress.Stamp(ctx, c, []workflows.Ref{{Kind: holdKind, Region: "nowhere", ID: "h1"}}, "")
	}()
	select {
	case <-h.held:
	case <-time.After(60 * time.Second):
		t.Fatal("the held Stamp call never ran")
	}
	return done
}

// TestDeployDoesNotWaitForeverForAStuckVersioningService: one
// VersioningService invocation that does not end (paused in Restate after
// its retries, or stuck) holds the exclusive singleton, and every Stamp
// queues behind it. A deploy waits for it only so long, then stamps its rows
// itself (exactly once: with its own grant), notes it in the deployment's
// history (shown by `ctrl deploy get`) and counts it in
// krane_ctrl_versioning_bypassed_total.
func TestDeployDoesNotWaitForeverForAStuckVersioningService(t *testing.T) {
	hold := newVersioningHold()
	rs := testenv.SharedRestate(t)
	w := newWorld(t, ctrltest.Options{Restate: rs, Deps: serve.Deps{WorkflowHooks: workflows.Hooks{AfterStep: hold.hook, VersioningWait: 2 * time.Second}}}, "eu")
	hold.hold(t, w.env)

	id := w.create(t, &ctrlv1.CreateDeploymentRequest{EnvironmentId: "env-held", Image: "registry.test/app:1", Replicas: 1})
	ctrltest.WaitStatus(t, w.api, id, 60*time.Second, network)
	w.clusters["eu"].ReportRunning(t, id, 1)
	if d, _ := ctrltest.WaitStatus(t, w.api, id, 60*time.Second, ready, failed); d.GetStatus() != ready {
		t.Fatalf("status %s (%s), want ready", d.GetStatus(), d.GetError())
	}
	topo, pol := topology(t, w.env.Store.DB(), id), ingressPolicies(t, w.env.Store.DB(), id)
	if topo["eu"].Version == 0 || pol["eu"].Version == 0 {
		t.Fatalf("topology %+v, policies %+v: want both stamped", topo, pol)
	}
	if first, last := grantCovering(t, w.env.Store.DB(), topo["eu"].Version); last-first != 1 {
		t.Fatalf("grant %d..%d, want one grant for the two rows", first, last)
	}
	d, err := w.api.GetDeployment(context.Background(), &ctrlv1.GetDeploymentRequest{DeploymentId: id})
	if err != nil {
		t.Fatal(err)
	}
	var noted bool
	for _, e := range d.GetHistory() {
		noted = noted || strings.Contains(e.GetMessage(), "VersioningService did not answer")
	}
	if !noted {
		t.Fatalf("history %v: want a note that the VersioningService did not answer", d.GetHistory())
	}
	if n, err := metricValue(w.env, "krane_ctrl_versioning_bypassed_total", "", ""); err != nil || n != 1 {
		t.Fatalf("krane_ctrl_versioning_bypassed_total = %v (%v), want 1", n, err)
	}
}
