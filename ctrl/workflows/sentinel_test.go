package workflows_test

//lint:file-ignore SA1019 typed-rpcs: removed no earlier than v0.4.0 (docs/compatibility.md); this file calls a deprecated typed ClusterService RPC

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	restate "github.com/restatedev/sdk-go"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"krane.dev/ctrl/internal/ctrltest"
	"krane.dev/ctrl/restateingress"
	"krane.dev/ctrl/rules"
	"krane.dev/ctrl/serve"
	"krane.dev/ctrl/store"
	"krane.dev/ctrl/workflows"
	"krane.dev/internal/testenv"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
	ctrlv1 "krane.dev/proto/krane/ctrl/v1"
)

const (
	imgV1 = "registry.test/krane/sentinel:1.0.0"
	imgV2 = "registry.test/krane/sentinel:2.0.0"
	imgV3 = "registry.test/krane/sentinel:3.0.0"
)

func getSentinel(t *testing.T, st *store.Store, id string) store.SentinelRow {
	t.Helper()
	r, err := st.GetSentinel(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// waitConverged waits until the sentinel's cluster reported its current
// version healthy.
func waitConverged(t *testing.T, st *store.Store, ids ...string) {
	t.Helper()
	for _, id := range ids {
		wait(t, "sentinel "+id+" to converge", 30*time.Second, func() bool { return rules.SentinelConverged(getSentinel(t, st, id)) })
	}
}

func sentinelMetric(t *testing.T, env *ctrltest.Env, result string) float64 {
	t.Helper()
	v, err := metricValue(env, "krane_ctrl_sentinel_notifications_total", "result", result)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// metricValue sums the series of a metric in a ctrl's registry, those
// whose label has value when label is set.
func metricValue(env *ctrltest.Env, name, label, value string) (float64, error) {
	mfs, err := env.Server.Registry().Gather()
	if err != nil {
		return 0, err
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			match := label == ""
			for _, l := range m.GetLabel() {
				match = match || (l.GetName() == label && l.GetValue() == value)
			}
			if match {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum, nil
}

func TestSentinelDeploy(t *testing.T) {
	env := ctrltest.Start(t, ctrltest.Options{Restate: testenv.SharedRestate(t)})
	eu := env.SentinelCluster(t, "eu", "eu-1")
	ids := env.CreateSentinels(t, "eu", "sen-deploy", imgV1, 3)
	waitConverged(t, env.Store, ids...)
	api := env.Sentinels(t)
	ctx := context.Background()
	id := ids[0]
	before := getSentinel(t, env.Store, id)

	// A new image: a new version, progressing, then ready once the cluster
	// reports it healthy on the image at that version.
	begin := time.Now()
	resp, err := api.DeploySentinel(ctx, &ctrlv1.DeploySentinelRequest{SentinelId: id, Image: imgV2, Wait: true})
	if err != nil {
		t.Fatal(err)
	}
	s := resp.GetSentinel()
	if resp.GetResult() != "ready" || s.GetImage() != imgV2 || s.GetDeployStatus() != "ready" || s.GetVersion() <= before.Version ||
		s.GetRunningImage() != imgV2 || s.GetReportObservedVersion() < s.GetVersion() || s.GetReplicas() != 2 {
		t.Fatalf("deploy of a new image: %v", resp)
	}
	t.Logf("deploy of a new image: ready in %s (version %d -> %d)", time.Since(begin).Round(time.Millisecond), before.Version, s.GetVersion())

	// Nothing to change and converged: ready at once, no new version.
	resp, err = api.DeploySentinel(ctx, &ctrlv1.DeploySentinelRequest{SentinelId: id, Image: imgV2, Wait: true})
	if err != nil || resp.GetResult() != "ready" || resp.GetSentinel().GetVersion() != s.GetVersion() {
		t.Fatalf("repeated deploy: %v, %v; want ready at version %d", resp, err, s.GetVersion())
	}

	// Zero fields keep the current values: only replicas change.
	resp, err = api.DeploySentinel(ctx, &ctrlv1.DeploySentinelRequest{SentinelId: id, Replicas: 3, Wait: true})
	if s2 := resp.GetSentinel(); err != nil || resp.GetResult() != "ready" || s2.GetReplicas() != 3 || s2.GetImage() != imgV2 ||
		s2.GetCpuMillicores() != 250 || s2.GetVersion() <= s.GetVersion() {
		t.Fatalf("replicas-only deploy: %v, %v", resp, err)
	}

	// A bad image never becomes healthy: failed at the timeout, with the
	// cluster's reason, no rollback.
	eu.Break(ids[1], imgV3, "pod x cannot pull image")
	begin = time.Now()
	resp, err = api.DeploySentinel(ctx, &ctrlv1.DeploySentinelRequest{SentinelId: ids[1], Image: imgV3, TimeoutSeconds: 2, Wait: true})
	if err != nil {
		t.Fatal(err)
	}
	if s := resp.GetSentinel(); resp.GetResult() != "failed" || s.GetDeployStatus() != "failed" || s.GetImage() != imgV3 ||
		!strings.Contains(resp.GetMessage(), "timed out after 2s") || !strings.Contains(resp.GetMessage(), "pod x cannot pull image") ||
		s.GetDeployMessage() != resp.GetMessage() {
		t.Fatalf("deploy of a broken image: %v", resp)
	}
	t.Logf("broken image: failed after %s: %s", time.Since(begin).Round(time.Millisecond), resp.GetMessage())

	// A permanent apply error fails the deploy at once, long before its
	// timeout, with the cluster's message.
	eu.Hold(ids[2])
	resp, err = api.DeploySentinel(ctx, &ctrlv1.DeploySentinelRequest{SentinelId: ids[2], Image: imgV3, TimeoutSeconds: 120})
	if err != nil || resp.GetSentinel().GetDeployStatus() != "progressing" {
		t.Fatalf("deploy without wait: %v, %v; want progressing", resp, err)
	}
	v := resp.GetSentinel().GetVersion()
	wait(t, "the cluster to receive the new version", 10*time.Second, func() bool { got, _, _ := eu.Latest(ids[2]); return got == v })
	begin = time.Now()
	eu.ReportApplyError(t, ids[2], "image", "the registry refuses this image", true)
	out, err := restateingress.SentinelDeployOutcome(ctx, env.Ingress(t, true), resp.GetInvocationId())
	if err != nil || out.Status != "failed" || !strings.Contains(out.Message, "image: the registry refuses this image (cluster eu-1 could not apply version") {
		t.Fatalf("deploy with a permanent apply error: %+v, %v", out, err)
	}
	if took := time.Since(begin); took > 10*time.Second {
		t.Fatalf("the apply error ended the deploy after %s", took)
	}
	t.Logf("permanent apply error: failed %s after the report", time.Since(begin).Round(time.Millisecond))

	// Invalid input, unknown and stopped sentinels: errors, not retries.
	if _, err := api.DeploySentinel(ctx, &ctrlv1.DeploySentinelRequest{SentinelId: id, Image: "Not An Image"}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("bad image: %v", err)
	}
	if _, err := api.DeploySentinel(ctx, &ctrlv1.DeploySentinelRequest{SentinelId: id, Replicas: 101}); status.Code(err) != codes.InvalidArgument ||
		!strings.Contains(err.Error(), "replicas") {
		t.Fatalf("too many replicas: %v", err)
	}
	if _, err := api.DeploySentinel(ctx, &ctrlv1.DeploySentinelRequest{SentinelId: "sen-nope", Image: imgV2}); status.Code(err) != codes.NotFound {
		t.Fatalf("unknown sentinel: %v", err)
	}
	// Stop: stopped at a new version, a delete for its cluster; stopping
	// again changes nothing; a deploy starts it again.
	running := getSentinel(t, env.Store, id)
	st, err := api.StopSentinel(ctx, &ctrlv1.StopSentinelRequest{SentinelId: id})
	if err != nil || !st.GetStopped() || st.GetSentinel().GetDesiredState() != "stopped" || st.GetSentinel().GetVersion() <= running.Version {
		t.Fatalf("stop: %v, %v; want stopped at a version above %d", st, err, running.Version)
	}
	if ds, err := eu.Client.GetDesiredSentinelState(ctx, &clusterv1.GetDesiredSentinelStateRequest{SentinelId: id}); err != nil ||
		ds.GetDelete() == nil || ds.GetVersion() != st.GetSentinel().GetVersion() {
		t.Fatalf("desired state of the stopped sentinel: %v, %v; want a delete at version %d", ds, err, st.GetSentinel().GetVersion())
	}
	again, err := api.StopSentinel(ctx, &ctrlv1.StopSentinelRequest{SentinelId: id})
	if err != nil || again.GetStopped() || again.GetSentinel().GetVersion() != st.GetSentinel().GetVersion() {
		t.Fatalf("second stop: %v, %v; want no change", again, err)
	}
	if _, err := api.StopSentinel(ctx, &ctrlv1.StopSentinelRequest{SentinelId: "sen-nope"}); status.Code(err) != codes.NotFound {
		t.Fatalf("stop of an unknown sentinel: %v", err)
	}
	resp, err = api.DeploySentinel(ctx, &ctrlv1.DeploySentinelRequest{SentinelId: id, Wait: true, TimeoutSeconds: 30})
	if s := resp.GetSentinel(); err != nil || resp.GetResult() != "ready" || s.GetDesiredState() != "running" || s.GetVersion() <= st.GetSentinel().GetVersion() ||
		s.GetImage() != running.Image {
		t.Fatalf("deploy of a stopped sentinel: %v, %v; want it running again on %s at a new version", resp, err, running.Image)
	}
	// Straight to Restate (no API check first): a terminal error, at once.
	ing := env.Ingress(t, true)
	for _, c := range []struct {
		id   string
		code int
	}{{"sen-deleted", 404}} {
		inv, err := restateingress.StartSentinelDeploy(ctx, ing, c.id, workflows.SentinelDeployRequest{Image: imgV3})
		if err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err = restateingress.SentinelDeployOutcome(wctx, ing, inv)
		cancel()
		if te := restate.AsTerminalError(err); te == nil || int(te.Code()) != c.code {
			t.Fatalf("Deploy of %s: %v, want a terminal error %d", c.id, err, c.code)
		}
	}
}

// TestSentinelReadyBeforeAwakeable forces the lost wake-up ordering: the
// cluster reports the sentinel healthy on the new version after Deploy
// wrote it and before Deploy stored its awakeable, and ctrl's Notifier
// calls NotifyReady in that window (which finds nothing to wake). The
// Deploy still completes, and it is its database check after the fence
// that decides it (the check step's journaled outcome is ready), not the
// final check at its timeout: without that check the wake-up is lost and
// the deploy waits for a later notice (the Notifier's next pass) or its
// timeout.
func TestSentinelReadyBeforeAwakeable(t *testing.T) {
	type target struct {
		id      string
		cluster *ctrltest.SentinelCluster
		env     *ctrltest.Env
	}
	var armed atomic.Pointer[target]
	var hookDone atomic.Bool
	var hookErr atomic.Value
	hook := func(ctx context.Context, step string) error {
		tg := armed.Load()
		if step != workflows.SentinelServiceName+".write" || tg == nil || !armed.CompareAndSwap(tg, nil) {
			return nil
		}
		defer hookDone.Store(true)
		// The write committed (a new version, progressing, owned by
		// this Deploy); no awakeable is stored yet. Let the cluster
		// report, and wait until the Notifier has told
		// SentinelService, which found nobody waiting.
		deadline := time.Now().Add(15 * time.Second)
		for {
			if _, spec, ok := tg.cluster.Latest(tg.id); ok && spec.GetImage() == imgV2 {
				break
			}
			if time.Now().After(deadline) {
				hookErr.Store("the cluster never received the new version")
				return nil
			}
			time.Sleep(10 * time.Millisecond)
		}
		tg.cluster.Release(t, tg.id)
		for sentinelMetricNoT(tg.env, "idle") < 1 {
			if time.Now().After(deadline) {
				hookErr.Store("the Notifier never notified the sentinel")
				return nil
			}
			time.Sleep(10 * time.Millisecond)
		}
		return nil
	}
	// The check step's journaled outcomes: the one that decides the
	// deploy must be this one, the check after the fence.
	var checked sync.Mutex
	var checks []workflows.Outcome
	stepResult := func(_ context.Context, step string, result any) {
		if step != workflows.SentinelServiceName+".check" {
			return
		}
		if o, ok := result.(workflows.Outcome); ok {
			checked.Lock()
			checks = append(checks, o)
			checked.Unlock()
		}
	}
	env := ctrltest.Start(t, ctrltest.Options{Restate: testenv.SharedRestate(t),
		Deps: serve.Deps{WorkflowHooks: workflows.Hooks{AfterStep: hook, StepResult: stepResult}}})
	eu := env.SentinelCluster(t, "eu", "eu-1")
	id := env.CreateSentinels(t, "eu", "sen-race", imgV1, 1)[0]
	waitConverged(t, env.Store, id)
	eu.Hold(id)
	armed.Store(&target{id: id, cluster: eu, env: env})

	begin := time.Now()
	resp, err := env.Sentinels(t).DeploySentinel(context.Background(), &ctrlv1.DeploySentinelRequest{SentinelId: id, Image: imgV2, TimeoutSeconds: 60, Wait: true})
	took := time.Since(begin)
	if err != nil {
		t.Fatal(err)
	}
	if !hookDone.Load() {
		t.Fatal("the hook did not run")
	}
	if e := hookErr.Load(); e != nil {
		t.Fatal(e)
	}
	checked.Lock()
	defer checked.Unlock()
	if len(checks) == 0 || checks[len(checks)-1].Result != workflows.ResultReady {
		t.Fatalf("the check after the fence journaled %v; want it to find the sentinel ready (without it the lost wake-up waits for a later notice or the timeout)", checks)
	}
	if idle, woken := sentinelMetric(t, env, "idle"), sentinelMetric(t, env, "woken"); idle != 1 || woken != 0 {
		t.Fatalf("notifications: %v idle, %v woken; want the one report's notice to have found nobody waiting", idle, woken)
	}
	if resp.GetResult() != "ready" || resp.GetSentinel().GetDeployStatus() != "ready" {
		t.Fatalf("deploy: %v after %s; want ready", resp, took)
	}
	t.Logf("report before the awakeable: deploy ready in %s, decided by the check after the fence", took.Round(time.Millisecond))
}

func sentinelMetricNoT(env *ctrltest.Env, result string) float64 {
	v, _ := metricValue(env, "krane_ctrl_sentinel_notifications_total", "result", result)
	return v
}

// A Deploy cancelled in Restate records why, clears its awakeable, and the
// next Deploy of the sentinel works.
func TestSentinelDeployCancelled(t *testing.T) {
	r := testenv.SharedRestate(t)
	env := ctrltest.Start(t, ctrltest.Options{Restate: r})
	eu := env.SentinelCluster(t, "eu", "eu-1")
	id := env.CreateSentinels(t, "eu", "sen-cancel", imgV1, 1)[0]
	waitConverged(t, env.Store, id)
	eu.Hold(id)
	api := env.Sentinels(t)
	ctx := context.Background()
	resp, err := api.DeploySentinel(ctx, &ctrlv1.DeploySentinelRequest{SentinelId: id, Image: imgV2})
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodPatch, r.AdminURL()+"/invocations/"+resp.GetInvocationId()+"/cancel", nil)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	_, err = restateingress.SentinelDeployOutcome(ctx, env.Ingress(t, true), resp.GetInvocationId())
	if te := restate.AsTerminalError(err); te == nil || te.Code() != 409 {
		t.Fatalf("cancelled deploy: %v, want Restate's cancellation", err)
	}
	row := getSentinel(t, env.Store, id)
	if row.DeployStatus != "failed" || !strings.Contains(row.DeployMessage, "cancelled in Restate") {
		t.Fatalf("after the cancel: %s %q", row.DeployStatus, row.DeployMessage)
	}
	eu.Release(t, id)
	out, err := api.DeploySentinel(ctx, &ctrlv1.DeploySentinelRequest{SentinelId: id, Image: imgV3, Wait: true, TimeoutSeconds: 30})
	if err != nil || out.GetResult() != "ready" {
		t.Fatalf("deploy after a cancelled one: %v, %v", out, err)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		t.Fatal(err)
	}
}
