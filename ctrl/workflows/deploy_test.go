package workflows_test

//lint:file-ignore SA1019 legacy-workload: removed no earlier than v0.3.0 (docs/compatibility.md); this file builds or reads the deprecated top-level workload fields

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"krane.dev/ctrl/internal/ctrltest"
	"krane.dev/internal/testenv"
	ctrlv1 "krane.dev/proto/krane/ctrl/v1"
)

func TestDeployToTwoRegionsReachesReadyWhenBothReport(t *testing.T) {
	w := newWorld(t, ctrltest.Options{}, "eu", "us")
	db := w.env.Store.DB()
	ctx := context.Background()

	begin := time.Now()
	id := w.create(t, &ctrlv1.CreateDeploymentRequest{EnvironmentId: "env-a", Image: "registry.test/app:1", Replicas: 2})
	if !strings.HasPrefix(id, "dep_") || len(id) != 24 {
		t.Fatalf("deployment id %q, want dep_ and 20 characters", id)
	}
	d, seen := ctrltest.WaitStatus(t, w.api, id, 30*time.Second, network)
	atNetwork := time.Since(begin)
	if seen[0] != pending && seen[0] != deploying && seen[0] != network {
		t.Fatalf("first status seen %v", seen)
	}

	// Topology in both regions, running, stamped by ONE VersioningService
	// call: consecutive versions covered by a single grant.
	topo := topology(t, db, id)
	eu, us := topo["eu"], topo["us"]
	if len(topo) != 2 || eu.Replicas != 2 || us.Replicas != 2 || eu.Status != "running" || us.Status != "running" {
		t.Fatalf("topology %+v, want eu and us running with 2 replicas", topo)
	}
	// Each region also gets the ingress policy that lets the environment's
	// sentinels reach the pods; all four rows share one grant.
	pol := ingressPolicies(t, db, id)
	if len(pol) != 2 || pol["eu"].Version == 0 || pol["us"].Version == 0 ||
		!strings.Contains(compactJSON(t, pol["eu"].Policy), `"unkey.com/deployment.id":"`+id+`"`) ||
		!strings.Contains(compactJSON(t, pol["us"].Policy), `"unkey.com/environment.id":"env-a"`) {
		t.Fatalf("ingress policies %+v, want one per region selecting the deployment's pods", pol)
	}
	versions := []uint64{eu.Version, us.Version, pol["eu"].Version, pol["us"].Version}
	lo, hi := slices.Min(versions), slices.Max(versions)
	if hi-lo != 3 {
		t.Fatalf("versions %v, want four consecutive (one stamp for both regions)", versions)
	}
	if first, last := grantCovering(t, db, lo); first != lo || last != hi {
		t.Fatalf("grant %d..%d, want exactly %d..%d (one VersioningService call)", first, last, lo, hi)
	}

	// A sentinel per region, created with the configured defaults.
	sens := sentinels(t, db, "env-a")
	if len(sens) != 2 || sens["eu"].Image != ctrltest.SentinelImage || sens["us"].Image != ctrltest.SentinelImage ||
		sens["eu"].Version == 0 || sens["us"].Version == 0 {
		t.Fatalf("sentinels %+v, want one per region with the default image, versioned", sens)
	}
	if d.GetLive() {
		t.Fatal("live before ready")
	}

	// One region running is not enough.
	w.clusters["eu"].ReportRunning(t, id, 2)
	time.Sleep(300 * time.Millisecond)
	if d, _ := ctrltest.WaitStatus(t, w.api, id, time.Second, network, ready); d.GetStatus() != network {
		t.Fatalf("status %s after only eu reported, want network", d.GetStatus())
	}
	reported := time.Now()
	w.clusters["us"].ReportRunning(t, id, 2)
	d, _ = ctrltest.WaitStatus(t, w.api, id, 30*time.Second, ready, failed)
	if d.GetStatus() != ready {
		t.Fatalf("status %s (%s), want ready", d.GetStatus(), d.GetError())
	}
	t.Logf("deploy latency: CreateDeployment to network (topology stamped, sentinels created) %s; last report to ready %s",
		atNetwork.Round(time.Millisecond), time.Since(reported).Round(time.Millisecond))
	wantHistory(t, w.env.Store, id, "pending", "deploying", "network", "ready")
	if !d.GetLive() {
		t.Fatal("the first ready deployment of an environment must become live")
	}
	// Going live changes what the sentinels route to, so they travel again.
	live := sentinels(t, db, "env-a")
	if live["eu"].Version <= sens["eu"].Version || live["us"].Version <= sens["us"].Version {
		t.Fatalf("sentinels %+v after going live, want both re-stamped above %+v: their routes now name the live deployment", live, sens)
	}
	sens = live
	if len(d.GetRegions()) != 2 || d.GetRegions()[0].GetRunning() != 2 || len(d.GetRegions()[1].GetInstances()) != 2 {
		t.Fatalf("regions %v, want eu and us with 2 running instances each", d.GetRegions())
	}

	// A second deploy to the environment neither creates nor upgrades a
	// sentinel, and does not replace the live deployment by itself.
	id2 := w.create(t, &ctrlv1.CreateDeploymentRequest{EnvironmentId: "env-a", Image: "registry.test/app:2", Replicas: 1, Regions: []string{"us"}})
	ctrltest.WaitStatus(t, w.api, id2, 30*time.Second, network)
	w.clusters["us"].ReportRunning(t, id2, 1)
	d2, _ := ctrltest.WaitStatus(t, w.api, id2, 30*time.Second, ready, failed)
	if d2.GetStatus() != ready || d2.GetLive() {
		t.Fatalf("second deploy: status %s live %v, want ready and not live", d2.GetStatus(), d2.GetLive())
	}
	if after := sentinels(t, db, "env-a"); after["eu"] != sens["eu"] || after["us"] != sens["us"] || len(after) != 2 {
		t.Fatalf("sentinels changed by the second deploy:\nbefore %+v\nafter  %+v", sens, after)
	}
	if topo2 := topology(t, db, id2); len(topo2) != 1 || topo2["us"].Version <= us.Version {
		t.Fatalf("second deploy's topology %+v, want only us with a version above %d", topo2, us.Version)
	}
	if _, err := w.api.Promote(ctx, &ctrlv1.PromoteRequest{DeploymentId: id2}); err != nil {
		t.Fatal(err)
	}
	if d, _ := w.api.GetDeployment(ctx, &ctrlv1.GetDeploymentRequest{DeploymentId: id}); d.GetLive() {
		t.Fatal("the first deployment is still live after promoting the second")
	}
	if live, _ := w.env.Store.LiveDeployment(ctx, "env-a"); live != id2 {
		t.Fatalf("live deployment %q, want %s", live, id2)
	}
}

func TestDeployFailsWithTheInstancesReason(t *testing.T) {
	w := newWorld(t, ctrltest.Options{}, "eu", "us")
	db := w.env.Store.DB()
	id := w.create(t, &ctrlv1.CreateDeploymentRequest{EnvironmentId: "env-b", Image: "registry.test/app:missing", Replicas: 2})
	ctrltest.WaitStatus(t, w.api, id, 30*time.Second, network)
	before := topology(t, db, id)

	w.clusters["us"].ReportRunning(t, id, 2)
	pod := ctrltest.K8sName(id) + "-0"
	w.clusters["eu"].Report(t, id,
		ctrltest.Failed(pod, "ImagePullBackOff", `Back-off pulling image "registry.test/app:missing"`),
		ctrltest.Pending(ctrltest.K8sName(id)+"-1", "ContainerCreating"))
	d, _ := ctrltest.WaitStatus(t, w.api, id, 30*time.Second, failed, ready)
	want := `region eu: 0/2 running: pod ` + pod + ` ImagePullBackOff: Back-off pulling image "registry.test/app:missing"`
	if d.GetStatus() != failed || d.GetError() != want {
		t.Fatalf("status %s error %q\nwant failed with %q", d.GetStatus(), d.GetError(), want)
	}
	wantHistory(t, w.env.Store, id, "pending", "deploying", "network", "failed")
	assertCleanedUp(t, w, id, before)
	if d.GetLive() {
		t.Fatal("a failed deployment is live")
	}
}

func TestDeployFailsWithThePermanentApplyError(t *testing.T) {
	w := newWorld(t, ctrltest.Options{}, "eu", "us")
	db := w.env.Store.DB()
	id := w.create(t, &ctrlv1.CreateDeploymentRequest{EnvironmentId: "env-c", Image: "registry.test/app:1", Replicas: 1})
	ctrltest.WaitStatus(t, w.api, id, 30*time.Second, network)
	before := topology(t, db, id)

	// A retryable apply error does not decide anything...
	w.clusters["us"].ReportApplyError(t, id, "", "the API server is unreachable", false)
	time.Sleep(300 * time.Millisecond)
	if d, _ := ctrltest.WaitStatus(t, w.api, id, time.Second, network, failed); d.GetStatus() != network {
		t.Fatalf("a retryable apply error ended the deploy: %s %q", d.GetStatus(), d.GetError())
	}
	// ...a permanent one fails the deploy with the cluster's message.
	v := w.clusters["us"].ReportApplyError(t, id, "image", "not a valid reference", true)
	d, _ := ctrltest.WaitStatus(t, w.api, id, 30*time.Second, failed, ready)
	want := "region us: image: not a valid reference (cluster us-1 could not apply version " + itoa(v) + ")"
	if d.GetStatus() != failed || d.GetError() != want {
		t.Fatalf("status %s error %q\nwant failed with %q", d.GetStatus(), d.GetError(), want)
	}
	assertCleanedUp(t, w, id, before)
}

func TestDeployWithoutReportsTimesOutAndCleansUp(t *testing.T) {
	w := newWorld(t, ctrltest.Options{}, "eu")
	db := w.env.Store.DB()
	begin := time.Now()
	id := w.create(t, &ctrlv1.CreateDeploymentRequest{EnvironmentId: "env-d", Image: "registry.test/app:1", Replicas: 2, TimeoutSeconds: 2})
	ctrltest.WaitStatus(t, w.api, id, 30*time.Second, network)
	before := topology(t, db, id)
	w.clusters["eu"].Report(t, id, ctrltest.Pending(ctrltest.K8sName(id)+"-0", "Unschedulable"))
	d, _ := ctrltest.WaitStatus(t, w.api, id, 30*time.Second, failed, ready)
	want := "timed out after 2s waiting for every region to run: region eu: 0/2 running (pod " + ctrltest.K8sName(id) + "-0 Unschedulable)"
	if d.GetStatus() != failed || d.GetError() != want {
		t.Fatalf("status %s error %q\nwant failed with %q", d.GetStatus(), d.GetError(), want)
	}
	if took := time.Since(begin); took < 2*time.Second || took > 20*time.Second {
		t.Fatalf("failed after %s, want about the 2s timeout", took)
	}
	assertCleanedUp(t, w, id, before)
}

// assertCleanedUp checks the topology was soft-deleted at new, higher
// versions, and that clusters now get a delete for it.
func assertCleanedUp(t *testing.T, w *world, id string, before map[string]topologyRow) {
	t.Helper()
	after := topology(t, w.env.Store.DB(), id)
	if len(after) != len(before) {
		t.Fatalf("topology regions %v, want %v", after, before)
	}
	for region, b := range before {
		a := after[region]
		if a.Status != "stopped" || a.Version <= b.Version {
			t.Fatalf("region %s: topology %+v after the failure, want stopped at a version above %d", region, a, b.Version)
		}
		if v, deleted := w.clusters[region].Version(t, id); !deleted || v != a.Version {
			t.Fatalf("region %s: GetDesiredDeploymentState gives version %d deleted=%v, want a delete at %d", region, v, deleted, a.Version)
		}
	}
	for region, p := range ingressPolicies(t, w.env.Store.DB(), id) {
		if !p.Deleted || p.Version <= before[region].Version {
			t.Fatalf("region %s: ingress policy deleted=%v at version %d, want deleted above %d", region, p.Deleted, p.Version, before[region].Version)
		}
	}
}

func itoa(v uint64) string { return strconv.FormatUint(v, 10) }

// TestDeployLatency measures, over sequential deploys to two regions whose
// clusters report as soon as the deploy reaches network, how long ctrl
// takes: CreateDeployment to network (row, regions, topology, one stamp,
// sentinels) and the last report to ready (Notifier, Restate, workflow).
func TestDeployLatency(t *testing.T) {
	w := newWorld(t, ctrltest.Options{}, "eu", "us")
	const n = 10
	var toNetwork, toReady, total []time.Duration
	for i := range n {
		begin := time.Now()
		id := w.create(t, &ctrlv1.CreateDeploymentRequest{EnvironmentId: "env-lat", Image: "registry.test/app:" + itoa(uint64(i)), Replicas: 1})
		ctrltest.WaitStatus(t, w.api, id, 30*time.Second, network)
		atNetwork := time.Now()
		w.clusters["eu"].ReportRunning(t, id, 1)
		w.clusters["us"].ReportRunning(t, id, 1)
		reported := time.Now()
		if d, _ := ctrltest.WaitStatus(t, w.api, id, 30*time.Second, ready, failed); d.GetStatus() != ready {
			t.Fatalf("deploy %d: %s %q", i, d.GetStatus(), d.GetError())
		}
		if i == 0 {
			continue // the first call in a process compiles the SDK's state machine
		}
		toNetwork = append(toNetwork, atNetwork.Sub(begin))
		toReady = append(toReady, time.Since(reported))
		total = append(total, time.Since(begin))
	}
	t.Logf("deploy latency over %d deploys to 2 regions (polling every 20ms): create->network median %s max %s; last report->ready median %s max %s; create->ready median %s max %s",
		len(total), median(toNetwork), maxOf(toNetwork), median(toReady), maxOf(toReady), median(total), maxOf(total))
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2].Round(time.Millisecond)
}

func maxOf(ds []time.Duration) time.Duration { return slices.Max(ds).Round(time.Millisecond) }

// TestCancelledDeployFailsAndCleansUp cancels the workflow's invocation
// in Restate (what an operator does with `restate invocations cancel`).
func TestCancelledDeployFailsAndCleansUp(t *testing.T) {
	r := testenv.SharedRestate(t)
	w := newWorld(t, ctrltest.Options{Restate: r}, "eu")
	id := w.create(t, &ctrlv1.CreateDeploymentRequest{EnvironmentId: "env-cancel", Image: "registry.test/app:1", Replicas: 1, TimeoutSeconds: 600})
	ctrltest.WaitStatus(t, w.api, id, 30*time.Second, network)
	before := topology(t, w.env.Store.DB(), id)

	var rows struct {
		Rows []struct {
			ID string `json:"id"`
		} `json:"rows"`
	}
	query := `{"query": "SELECT id FROM sys_invocation WHERE target_service_name = 'DeployWorkflow' AND target_service_key = '` + id + `' AND target_handler_name = 'Run'"}`
	if err := admin(r, http.MethodPost, "/query", query, &rows); err != nil || len(rows.Rows) != 1 {
		t.Fatalf("find the invocation: %+v, %v", rows, err)
	}
	if err := admin(r, http.MethodPatch, "/invocations/"+rows.Rows[0].ID+"/cancel", "", nil); err != nil {
		t.Fatal(err)
	}
	d, _ := ctrltest.WaitStatus(t, w.api, id, 30*time.Second, failed, ready)
	if d.GetStatus() != failed || !strings.HasPrefix(d.GetError(), "the deploy's workflow was cancelled in Restate") {
		t.Fatalf("status %s error %q, want failed saying it was cancelled", d.GetStatus(), d.GetError())
	}
	assertCleanedUp(t, w, id, before)
}

func admin(r *testenv.Restate, method, path, body string, out any) error {
	req, err := http.NewRequest(method, r.AdminURL()+path, strings.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("content-type", "application/json")
	req.Header.Set("accept", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, data)
	}
	if out != nil {
		return json.Unmarshal(data, out)
	}
	return nil
}
