package workflows_test

//lint:file-ignore SA1019 legacy-workload: removed no earlier than v0.3.0 (docs/compatibility.md); this file builds or reads the deprecated top-level workload fields

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"krane.dev/ctrl/internal/ctrltest"
	"krane.dev/ctrl/serve"
	"krane.dev/ctrl/workflows"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
	ctrlv1 "krane.dev/proto/krane/ctrl/v1"
)

// scrapeMetrics reads ctrl's /metrics over HTTP and returns every sample
// by its series as printed ("name{label="v",...}" or "name").
func scrapeMetrics(t *testing.T, env *ctrltest.Env) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + env.Server.HTTPAddr() + "/metrics")
	if err != nil {
		t.Fatalf("scrape /metrics: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(resp.Body)
		t.Fatalf("scrape /metrics: %s: %s", resp.Status, body)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("scrape /metrics: bad line %q", line)
		}
		out[line[:i]] = v
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("scrape /metrics: %v", err)
	}
	return out
}

// startedAgo is a running instance whose pod was created d ago.
func startedAgo(name string, d time.Duration) *clusterv1.Instance {
	in := ctrltest.Running(name)
	in.CreatedAt = timestamppb.New(time.Now().Add(-d))
	return in
}

// TestDeployMetrics deploys one deployment to ready and one to failed
// against real MySQL and Restate and reads the deploy metrics from /metrics:
// the workflow's status counter and duration by outcome (once per deploy,
// even when the step that made the change ran twice), the topology and
// instance gauges read from MySQL, and instance startup times, counted once
// per instance however often a cluster reports it running.
func TestDeployMetrics(t *testing.T) {
	// The step that marks a deployment ready commits and then fails once,
	// as if ctrl died before Restate journaled it: Restate runs the body
	// again, which must not count the deploy a second time.
	var readyFaults atomic.Int32
	hooks := workflows.Hooks{AfterStep: func(ctx context.Context, step string) error {
		if step == "DeployWorkflow.ready" && readyFaults.Add(1) == 1 {
			return errors.New("injected: crash after the ready step committed")
		}
		return nil
	}}
	w := newWorld(t, ctrltest.Options{Deps: serve.Deps{WorkflowHooks: hooks}}, "eu")
	eu := w.clusters["eu"]
	scraped := scrapeMetrics(t, w.env)
	for _, s := range []string{`krane_deployment_workflow_status{status="ready"}`, `krane_deployment_workflow_status{status="failed"}`, `krane_deployment_topology_regions`} {
		if v, ok := scraped[s]; !ok || v != 0 {
			t.Fatalf("before any deploy: %s = %v (present %v), want 0", s, v, ok)
		}
	}

	good := w.create(t, &ctrlv1.CreateDeploymentRequest{EnvironmentId: "env-m", Image: "registry.test/app:1", Replicas: 2})
	ctrltest.WaitStatus(t, w.api, good, 30*time.Second, network)
	name := ctrltest.K8sName(good) + "-eu-"
	// The first report shows one instance still pending, the second both
	// running: only instances seen running for the first time are timed.
	eu.Report(t, good, startedAgo(name+"0", 3*time.Second), ctrltest.Pending(name+"1", "ContainerCreating"))
	eu.Report(t, good, startedAgo(name+"0", 3*time.Second), startedAgo(name+"1", 2*time.Second))
	if d, _ := ctrltest.WaitStatus(t, w.api, good, 30*time.Second, ready, failed); d.GetStatus() != ready {
		t.Fatalf("deployment %s: %s (%s), want ready", good, d.GetStatus(), d.GetError())
	}
	// The row is ready from the first run's commit; Restate runs the body
	// again after its retry interval.
	wait(t, "the ready step to run again after the injected failure", 60*time.Second, func() bool { return readyFaults.Load() >= 2 })
	// The same snapshot again (a resync): no new startup.
	eu.Report(t, good, startedAgo(name+"0", 3*time.Second), startedAgo(name+"1", 2*time.Second))

	bad := w.create(t, &ctrlv1.CreateDeploymentRequest{EnvironmentId: "env-m", Image: "registry.test/app:broken", Replicas: 1})
	ctrltest.WaitStatus(t, w.api, bad, 30*time.Second, network)
	eu.Report(t, bad, ctrltest.Failed(ctrltest.K8sName(bad)+"-eu-0", "ImagePullBackOff", "image not found"))
	if d, _ := ctrltest.WaitStatus(t, w.api, bad, 30*time.Second, ready, failed); d.GetStatus() != failed {
		t.Fatalf("deployment %s: %s, want failed", bad, d.GetStatus())
	}

	m := scrapeMetrics(t, w.env)
	want := map[string]float64{
		`krane_deployment_workflow_status{status="deploying"}`:               2,
		`krane_deployment_workflow_status{status="network"}`:                 2,
		`krane_deployment_workflow_status{status="ready"}`:                   1,
		`krane_deployment_workflow_status{status="failed"}`:                  1,
		`krane_deployment_workflow_duration_seconds_count{outcome="ready"}`:  1,
		`krane_deployment_workflow_duration_seconds_count{outcome="failed"}`: 1,
		`krane_deployment_topology_regions`:                                  1,
		`krane_deployment_topology_status{region="eu",status="started"}`:     1,
		`krane_deployment_topology_status{region="eu",status="stopping"}`:    1,
		`krane_deployment_instances_total{region="eu"}`:                      3,
		`krane_deployment_instances_by_status{region="eu",status="running"}`: 2,
		`krane_deployment_instances_by_status{region="eu",status="failed"}`:  1,
		`krane_deployment_instance_startup_time_seconds_count`:               2,
		`krane_deployment_fleet_metrics_errors_total`:                        0,
	}
	for series, v := range want {
		if got, ok := m[series]; !ok || got != v {
			t.Errorf("%s = %v (present %v), want %v", series, got, ok, v)
		}
	}
	// Startup: created 3 s and 2 s before the reports that showed them
	// running (plus however long the reports took to send).
	if sum := m[`krane_deployment_instance_startup_time_seconds_sum`]; sum < 5 || sum > 5+60 {
		t.Errorf("startup time sum %.2fs, want about 5s", sum)
	}
	// A deploy's duration runs from its creation to its decision.
	if sum := m[`krane_deployment_workflow_duration_seconds_sum{outcome="ready"}`]; sum <= 0 || sum > 60 {
		t.Errorf("ready deploy duration %.2fs, want between 0 and the test's length", sum)
	}
}
