package workflows_test

//lint:file-ignore SA1019 legacy-workload: removed no earlier than v0.3.0 (docs/compatibility.md); this file builds or reads the deprecated top-level workload fields

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"krane.dev/ctrl/deployspec"
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

// The crash-point suite. Restate runs a restate.Run body again when the
// process died after the body's side effects committed and before Restate
// journaled its result, and a database failover can fail a COMMIT that
// succeeded ("bad connection" after the commit). Every step of ctrl's
// services must come out of either the same as when nothing happened.
//
// The steps are not listed here: workflows.Steps declares them all (and
// TestEveryRunIsADeclaredStep keeps it complete). Each scenario below drives
// one path through the services against a fresh ctrl and database; its
// first, uninterrupted run records the steps it executes and the steps that
// commit. Then, for every step a scenario is the first to execute, the
// scenario runs again with every execution of that step run twice (a crash
// point), and for every step that commits, with each of its commits
// answered "bad connection" once (an ambiguous commit). Each case must end
// with the same result and the same database as the uninterrupted run. A
// declared step that no scenario executes fails the suite: a new step needs
// a scenario that reaches it, not an edit of a list. The same holds for
// ambiguous commits: a step declared with newStep (it commits) in which no
// scenario commits fails the suite, named, and so does a step declared
// with newReadStep (it writes nothing) that commits.
//
// For a step that writes nothing, the database comparison after its re-run
// is vacuous: each such step is checked by its own result (readStepChecks,
// which must name every one): what Restate journaled for it in the re-run
// case against what it journaled in the uninterrupted run.

// errBadConn is what a COMMIT whose answer was lost returns.
var errBadConn = driver.ErrBadConn

// faults is one case's fault injection, and what the uninterrupted run
// records.
type faults struct {
	mode   string // "", "crash" or "ambiguous"
	target string // the step, "Service.name"

	mu        sync.Mutex
	seen      map[string]bool // steps whose bodies completed
	committed map[string]bool // steps whose bodies committed a transaction
	count     map[string]int  // per invocation and step: bodies completed, or commits
	injected  int
	results   map[string][]string // step -> the results Restate journaled, as JSON, in order
}

func newFaults(mode, target string) *faults {
	return &faults{mode: mode, target: target, seen: map[string]bool{}, committed: map[string]bool{}, count: map[string]int{}, results: map[string][]string{}}
}

// once reports whether this is the first of a pair for key: alternate
// completions of a body are the first run (lost) and its re-run (kept).
func (f *faults) once(key string) bool {
	f.count[key]++
	if f.count[key]%2 == 1 {
		f.injected++
		return true
	}
	return false
}

// afterStep is the case's Hooks.AfterStep.
func (f *faults) afterStep(ctx context.Context, step string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.seen[step] = true
	if f.mode == "crash" && step == f.target && f.once(invocationID(ctx)+"/"+step) {
		return errCrashed
	}
	return nil
}

// stepResult is the case's Hooks.StepResult.
func (f *faults) stepResult(_ context.Context, step string, result any) {
	b, err := json.Marshal(result)
	if err != nil {
		b = []byte(fmt.Sprintf("unmarshalable %T: %v", result, err))
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.results[step] = append(f.results[step], string(b))
}

// afterCommit is the case's store AfterCommit hook.
func (f *faults) afterCommit(ctx context.Context) error {
	s, ok := workflows.StepOf(ctx)
	if !ok {
		return nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.committed[s.String()] = true
	if f.mode == "ambiguous" && s.String() == f.target && f.once(invocationID(ctx)+"/"+s.String()) {
		return errBadConn
	}
	return nil
}

func (f *faults) snapshot() (seen, committed []string, injected int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Sorted(mapKeys(f.seen)), slices.Sorted(mapKeys(f.committed)), f.injected
}

func mapKeys(m map[string]bool) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// crashRun is one run of a scenario: a fresh ctrl with the case's faults.
type crashRun struct {
	t      *testing.T
	env    *ctrltest.Env
	f      *faults
	hold   *versioningHold
	prefix string // makes the run's names unique on a shared Restate
	// names maps the run's generated ids to stable names for comparison.
	names    map[string]string
	clusters map[string]*ctrltest.FakeCluster
	slack    *slackSink
}

// name records a stable name for a generated id.
func (r *crashRun) name(id, as string) string {
	r.names[id] = as
	return id
}

// scenario is one path through the services. It returns the path's
// result (anything that marshals to JSON).
type scenario struct {
	name string
	// freshRestate: a Restate of the case's own (the rollout singleton's
	// state would carry over otherwise).
	freshRestate bool
	// holdVersioning: a Stamp call holds the VersioningService singleton.
	holdVersioning bool
	regions        []string
	run            func(r *crashRun) any
}

var crashScenarios = []scenario{
	// The sentinel scenarios come first: a deploy calls SentinelService too,
	// and whether its sentinel's deploy stores an awakeable depends on how
	// fast the fake cluster reports; each step is covered by the first
	// scenario that runs it, which must run it every time.
	{name: "sentinel-deploy", run: func(r *crashRun) any {
		id, _ := r.sentinel()
		return r.sentinelDeploy(id, 60)
	}},
	{name: "sentinel-deploy-times-out", run: func(r *crashRun) any {
		id, c := r.sentinel()
		c.Hold(id)
		return r.sentinelDeploy(id, 1)
	}},
	{name: "deploy", regions: []string{"eu", "us"}, run: func(r *crashRun) any {
		id := r.createDeployment(&ctrlv1.CreateDeploymentRequest{EnvironmentId: r.prefix + "-env", Image: "registry.test/app:1", Replicas: 2})
		r.waitStatus(id, network)
		for _, region := range []string{"eu", "us"} {
			r.cluster(region).ReportRunning(r.t, id, 2)
		}
		return r.deployResult(id)
	}},
	{name: "deploy-fails", regions: []string{"eu"}, run: func(r *crashRun) any {
		id := r.createDeployment(&ctrlv1.CreateDeploymentRequest{EnvironmentId: r.prefix + "-env", Image: "registry.test/app:1", Replicas: 1})
		r.waitStatus(id, network)
		r.cluster("eu").ReportApplyError(r.t, id, "image", "the registry refuses this image", true)
		return r.deployResult(id)
	}},
	{name: "deploy-sentinel-fails", regions: []string{"eu"}, run: func(r *crashRun) any {
		// The deploy's new sentinel cannot be applied: the deploy fails
		// with the sentinel's reason.
		c := r.cluster("eu").Sentinels
		c.Hold()
		id := r.createDeployment(&ctrlv1.CreateDeploymentRequest{EnvironmentId: r.prefix + "-env", Image: "registry.test/app:1", Replicas: 1})
		var sid string
		select {
		case sid = <-c.Seen():
		case <-time.After(90 * time.Second):
			r.t.Fatal("the cluster never received the deploy's sentinel")
		}
		c.ReportApplyError(r.t, sid, "image", "the registry refuses this image", true)
		return r.deployResult(id)
	}},
	{name: "deploy-times-out", regions: []string{"eu"}, run: func(r *crashRun) any {
		id := r.createDeployment(&ctrlv1.CreateDeploymentRequest{EnvironmentId: r.prefix + "-env", Image: "registry.test/app:1", Replicas: 1, TimeoutSeconds: 1})
		return r.deployResult(id)
	}},
	{name: "deploy-rejected", regions: []string{"eu"}, run: func(r *crashRun) any {
		// A request the API would never send: the workflow refuses it and
		// records why on the row.
		id := r.name(deployspec.NewDeploymentID(), "DEP")
		spec := deployspec.Spec{ID: id, WorkspaceID: "ws", ProjectID: "p", EnvironmentID: r.prefix + "-env", AppID: "a", K8sName: deployspec.K8sName(id),
			K8sNamespace: "ws-ws", Replicas: 1, Workload: &clusterv1.Workload{Image: "registry.test/app:1", CpuMillicores: 100, MemoryMib: 64, Port: 8080}}
		if _, _, err := r.env.Store.CreateDeployment(context.Background(), store.Deployment{Spec: spec}, "created by the crash-point suite"); err != nil {
			r.t.Fatal(err)
		}
		spec.Replicas = 0
		if _, err := restateingress.StartDeploy(context.Background(), r.env.Ingress(r.t, false), workflows.DeployRequest{Deployment: spec}); err != nil {
			r.t.Fatal(err)
		}
		return r.deployResult(id)
	}},
	{name: "deploy-versioning-held", regions: []string{"eu"}, holdVersioning: true, run: func(r *crashRun) any {
		id := r.createDeployment(&ctrlv1.CreateDeploymentRequest{EnvironmentId: r.prefix + "-env", Image: "registry.test/app:1", Replicas: 1})
		r.waitStatus(id, network)
		r.cluster("eu").ReportRunning(r.t, id, 1)
		return r.deployResult(id)
	}},
	{name: "rollout", freshRestate: true, run: func(r *crashRun) any {
		r.env.SentinelCluster(r.t, "eu", "eu-1")
		ids := r.env.CreateSentinels(r.t, "eu", r.prefix+"-sen", imgV1, 2)
		waitConverged(r.t, r.env.Store, ids...)
		r.slack = newSlackSink(r.t)
		ctx := context.Background()
		// One sentinel per wave: the waves' versions come in one order.
		st, err := restateingress.StartRollout(ctx, r.env.Ingress(r.t, false), workflows.RolloutRequest{Image: imgV2, WavePercentages: []int32{50, 100},
			SlackWebhookURL: r.slack.srv.URL, DeployTimeoutSeconds: 60})
		if err != nil {
			r.t.Fatal(err)
		}
		deadline := time.Now().Add(120 * time.Second)
		for st.State != workflows.RolloutCompleted {
			if time.Now().After(deadline) {
				r.t.Fatalf("rollout %s after 120s: %s", st.State, st.Message)
			}
			time.Sleep(50 * time.Millisecond)
			if st, err = restateingress.GetRolloutStatus(ctx, r.env.Ingress(r.t, false)); err != nil {
				r.t.Fatal(err)
			}
		}
		st.Run, st.StartedAtMs, st.UpdatedAtMs = "", 0, 0
		st.Message = regexp.MustCompile(`r\d+-[0-9a-f]{6}`).ReplaceAllString(st.Message, "RUN")
		var msgs []string
		for _, m := range r.slack.messages() {
			m = regexp.MustCompile(`r\d+-[0-9a-f]{6}`).ReplaceAllString(m, "RUN")
			if len(msgs) == 0 || msgs[len(msgs)-1] != m { // a Slack post is at least once
				msgs = append(msgs, m)
			}
		}
		return map[string]any{"status": st, "slack": msgs}
	}},
}

func (r *crashRun) cluster(region string) *ctrltest.FakeCluster { return r.clusters[region] }

func (r *crashRun) createDeployment(req *ctrlv1.CreateDeploymentRequest) string {
	r.t.Helper()
	req.WorkspaceId, req.ProjectId, req.AppId = "ws1", "proj1", "app1"
	resp, err := r.env.Deployments(r.t).CreateDeployment(context.Background(), req)
	if err != nil {
		r.t.Fatalf("CreateDeployment: %v", err)
	}
	return r.name(resp.GetDeploymentId(), "DEP")
}

func (r *crashRun) waitStatus(id string, want ctrlv1.DeploymentStatus) {
	r.t.Helper()
	if d, _ := ctrltest.WaitStatus(r.t, r.env.Deployments(r.t), id, 90*time.Second, want, failed, ready); d.GetStatus() != want {
		r.t.Fatalf("deployment %s: %s (%s), want %s", id, d.GetStatus(), d.GetError(), want)
	}
}

// deployResult is the deploy workflow's result, or its error.
func (r *crashRun) deployResult(id string) any {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	res, err := restateingress.DeployOutcome(ctx, r.env.Ingress(r.t, true), id)
	if err != nil {
		if ctx.Err() != nil {
			r.t.Fatalf("deploy %s did not end in 120s", id)
		}
		return map[string]string{"error": err.Error()}
	}
	return res
}

// sentinel creates a converged sentinel in eu with its fake cluster.
func (r *crashRun) sentinel() (string, *ctrltest.SentinelCluster) {
	r.t.Helper()
	c := r.env.SentinelCluster(r.t, "eu", "eu-1")
	id := r.env.CreateSentinels(r.t, "eu", r.prefix+"-sen", imgV1, 1)[0]
	waitConverged(r.t, r.env.Store, id)
	return id, c
}

func (r *crashRun) sentinelDeploy(id string, timeout int32) any {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	inv, err := restateingress.StartSentinelDeploy(ctx, r.env.Ingress(r.t, false), id, workflows.SentinelDeployRequest{Image: imgV2, TimeoutSeconds: timeout})
	if err != nil {
		r.t.Fatal(err)
	}
	res, err := restateingress.SentinelDeployOutcome(ctx, r.env.Ingress(r.t, true), inv)
	if err != nil {
		r.t.Fatalf("sentinel deploy: %v", err)
	}
	return res
}

// outcome is what a case is compared on.
type outcome struct {
	Result string
	DB     string
	// Steps holds the journaled results of each step, normalized.
	Steps      map[string][]string
	Start, End time.Time
}

// run runs one case of sc.
func runCase(t *testing.T, sc scenario, f *faults, prefix string) outcome {
	rs := testenv.SharedRestate(t)
	if sc.freshRestate {
		rs = ctrltest.FreshRestate(t)
	}
	r := &crashRun{t: t, f: f, prefix: prefix, names: map[string]string{}}
	hooks := workflows.Hooks{AfterStep: f.afterStep, StepResult: f.stepResult}
	if sc.holdVersioning {
		r.hold = newVersioningHold()
		hooks.AfterStep = func(ctx context.Context, step string) error {
			if err := f.afterStep(ctx, step); err != nil {
				return err
			}
			return r.hold.hook(ctx, step)
		}
		hooks.VersioningWait = 2 * time.Second
	}
	r.env = ctrltest.Start(t, ctrltest.Options{Restate: rs, Deps: serve.Deps{WorkflowHooks: hooks}})
	r.env.Store.SetTestHooks(store.TestHooks{AfterCommit: f.afterCommit})
	r.clusters = map[string]*ctrltest.FakeCluster{}
	for _, region := range sc.regions {
		r.clusters[region] = r.env.FakeCluster(t, region, region+"-1")
	}
	start := time.Now()
	var held chan struct{}
	if r.hold != nil {
		held = r.hold.holdAsync(t, r.env)
	}
	res := sc.run(r)
	if r.hold != nil {
		r.hold.Release()
		<-held // the held stamp ends before the database is compared
	}
	b, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	db := dbState(t, r.env.Store.DB(), r) // names the generated sentinel ids first
	f.mu.Lock()
	defer f.mu.Unlock()
	steps := map[string][]string{}
	for step, rs := range f.results {
		for _, v := range rs {
			steps[step] = append(steps[step], r.normalize(v))
		}
	}
	return outcome{Result: r.normalize(string(b)), DB: db, Steps: steps, Start: start, End: time.Now()}
}

// normalize replaces the run's generated ids with stable names.
func (r *crashRun) normalize(s string) string {
	ids := slices.Collect(mapKeysS(r.names))
	sort.Slice(ids, func(i, j int) bool { return len(ids[i]) > len(ids[j]) })
	for _, id := range ids {
		s = strings.ReplaceAll(s, id, r.names[id])
	}
	s = strings.ReplaceAll(s, r.prefix, "CASE")
	return regexp.MustCompile(`inv_[0-9A-Za-z]+`).ReplaceAllString(s, "INV")
}

func mapKeysS(m map[string]string) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// dbState is every row a scenario may write, without times, as sorted
// text lines; sentinels' generated ids are named by environment and
// region.
func dbState(t *testing.T, db *sql.DB, r *crashRun) string {
	t.Helper()
	rows, err := db.Query("SELECT id, environment_id, region FROM sentinels")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id, env, region string
		if err := rows.Scan(&id, &env, &region); err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(id, "sen_") {
			r.names[id] = "SEN-" + env + "-" + region
		}
	}
	rows.Close()
	var out []string
	for _, q := range []string{
		"SELECT 'deployments', id, environment_id, JSON_UNQUOTE(JSON_EXTRACT(workload, '$.workload.image')), replicas, status, COALESCE(error, ''), rolled_back_from FROM deployments",
		"SELECT 'events', deployment_id, seq, status, COALESCE(message, '') FROM deployment_events",
		"SELECT 'topology', deployment_id, region, desired_replicas, desired_status, version FROM deployment_topology",
		"SELECT 'policies', id, region, deleted, version FROM cilium_network_policies",
		"SELECT 'sentinels', id, region, environment_id, image, replicas, desired_state, version, deploy_status, COALESCE(deploy_message, ''), deploy_changed, COALESCE(ensured_by, '') FROM sentinels",
		"SELECT 'resources', kind, region, id, deleted, version FROM resources",
		"SELECT 'environments', id, COALESCE(live_deployment_id, '') FROM environments",
		"SELECT 'grants', first_version, last_version FROM version_grants",
		"SELECT 'head', head FROM version_seq",
		"SELECT 'change_heads', region, kind, head FROM change_heads",
		"SELECT 'apply_errors', kind, region, id, cluster_id, version, message, permanent FROM apply_errors",
	} {
		rows, err := db.Query(q)
		if err != nil {
			t.Fatal(err)
		}
		cols, _ := rows.Columns()
		for rows.Next() {
			vals := make([]sql.RawBytes, len(cols))
			ptrs := make([]any, len(cols))
			for i := range vals {
				ptrs[i] = &vals[i]
			}
			if err := rows.Scan(ptrs...); err != nil {
				t.Fatal(err)
			}
			parts := make([]string, len(vals))
			for i, v := range vals {
				parts[i] = string(v)
			}
			out = append(out, strings.Join(parts, "|"))
		}
		rows.Close()
	}
	for i := range out {
		out[i] = r.normalize(out[i])
	}
	slices.Sort(out)
	return strings.Join(out, "\n")
}

// TestCrashPoints is the crash-point suite (see the top of this file).
func TestCrashPoints(t *testing.T) {
	declared, writesNothing := map[string]bool{}, map[string]bool{}
	for _, s := range workflows.Steps() {
		declared[s.String()] = true
		writesNothing[s.String()] = s.WritesNothing
		if _, ok := readStepChecks[s.String()]; s.WritesNothing && !ok {
			t.Errorf("step %s writes nothing and readStepChecks has no check of its result: add one", s)
		}
	}
	for step := range readStepChecks {
		if !writesNothing[step] {
			t.Errorf("readStepChecks checks %s, which is not a declared step that writes nothing", step)
		}
	}
	crashCovered, ambiguousCovered := map[string]string{}, map[string]string{}
	cases := 0
	for si, sc := range crashScenarios {
		var base outcome
		var seen, committed []string
		ok := t.Run(sc.name+"/uninterrupted", func(t *testing.T) {
			f := newFaults("", "")
			base = runCase(t, sc, f, fmt.Sprintf("cp%d-base", si))
			seen, committed, _ = f.snapshot()
			t.Logf("steps run: %v; steps that commit: %v", seen, committed)
		})
		if !ok {
			continue
		}
		for _, step := range committed {
			if writesNothing[step] {
				t.Errorf("step %s is declared with newReadStep (it writes nothing) and committed in scenario %s: declare it with newStep", step, sc.name)
			}
		}
		for _, mode := range []string{"crash", "ambiguous"} {
			covered, steps := crashCovered, seen
			if mode == "ambiguous" {
				covered, steps = ambiguousCovered, committed
			}
			for _, step := range steps {
				if _, done := covered[step]; done || !declared[step] {
					continue
				}
				covered[step] = sc.name
				cases++
				t.Run(sc.name+"/"+mode+"@"+step, func(t *testing.T) {
					f := newFaults(mode, step)
					got := runCase(t, sc, f, fmt.Sprintf("cp%d-%d", si, cases))
					if _, _, injected := f.snapshot(); injected == 0 {
						t.Fatalf("step %s never ran: nothing was injected", step)
					}
					if got.Result != base.Result {
						t.Errorf("result differs from the uninterrupted run:\n got  %s\n want %s", got.Result, base.Result)
					}
					if got.DB != base.DB {
						t.Errorf("database differs from the uninterrupted run:\n%s", lineDiff(base.DB, got.DB))
					}
					if check := readStepChecks[step]; mode == "crash" && check != nil {
						if err := check(base, got, step); err != nil {
							t.Errorf("the re-run step's own result: %v", err)
						}
					}
				})
			}
		}
	}
	var missing []string
	for step := range declared {
		if _, ok := crashCovered[step]; !ok {
			missing = append(missing, step)
		}
	}
	slices.Sort(missing)
	if len(missing) > 0 {
		t.Errorf("steps no scenario executes (add a scenario that reaches them): %v", missing)
	}
	var uncommitted []string
	for step := range declared {
		if _, ok := ambiguousCovered[step]; !ok && !writesNothing[step] {
			uncommitted = append(uncommitted, step)
		}
	}
	slices.Sort(uncommitted)
	if len(uncommitted) > 0 {
		t.Errorf("steps declared with newStep (they commit) in which no scenario commits, so no ambiguous commit covers them "+
			"(add a scenario that commits in them, or declare them with newReadStep if they write nothing): %v", uncommitted)
	}
	t.Logf("%d crash points covered (of %d declared steps), %d ambiguous-commit points covered; %d cases", len(crashCovered), len(declared), len(ambiguousCovered), cases)
}

// readStepCheck checks a re-run case of a step that writes nothing by the
// step's journaled results (base: the uninterrupted run's).
type readStepCheck func(base, got outcome, step string) error

// sameResults: the step journals the same results as in the
// uninterrupted run: its re-run read the same thing.
// Results are compared as sets of lines: the invocations of one case
// may run a step in any order.
func sameResults(base, got outcome, step string) error {
	if !slices.Equal(slices.Sorted(slices.Values(base.Steps[step])), slices.Sorted(slices.Values(got.Steps[step]))) {
		return fmt.Errorf("%s journaled %q, the uninterrupted run %q", step, got.Steps[step], base.Steps[step])
	}
	return nil
}

// decisionCheck is the check of a step that evaluates a deploy (check,
// final-check): it reads reports that move on while the case runs (a fake
// cluster reports right after the apply), so its re-run may see a later
// state than its first run or the uninterrupted run did; the scenario's end
// (result and database) is compared already. Its own result must be as
// many journaled evaluations as uninterrupted, each an Outcome ctrl can
// act on: a known decision, or no decision with the reason it waits.
func decisionCheck(base, got outcome, step string) error {
	if len(got.Steps[step]) != len(base.Steps[step]) {
		return fmt.Errorf("%s journaled %d evaluations, the uninterrupted run %d: %q", step, len(got.Steps[step]), len(base.Steps[step]), got.Steps[step])
	}
	known := []string{rules.ResultReady, rules.ResultFailed, rules.ResultStopped, rules.ResultGone}
	for _, v := range got.Steps[step] {
		var o rules.Outcome
		if err := json.Unmarshal([]byte(v), &o); err != nil {
			return fmt.Errorf("%s journaled %q: %v", step, v, err)
		}
		if (o.Result == "" && o.Message == "") || (o.Result != "" && !slices.Contains(known, o.Result)) {
			return fmt.Errorf("%s journaled %q: neither a known decision nor a reason to wait", step, v)
		}
	}
	return nil
}

// readStepChecks names every step that writes nothing (TestCrashPoints
// fails without one) with the check of its result after a re-run.
var readStepChecks = map[string]readStepCheck{
	"DeployWorkflow.regions":     sameResults,
	"DeployWorkflow.timeout":     sameResults,
	"DeployWorkflow.check":       decisionCheck,
	"DeployWorkflow.final-check": decisionCheck,
	// A fence: it journals that the awakeable is stored before the check.
	"SentinelService.awakeable-stored":      sameResults,
	"SentinelService.check":                 decisionCheck,
	"SentinelService.final-check":           decisionCheck,
	"SentinelRolloutService.list-sentinels": sameResults,
	// The post itself is in the scenario's result (the messages Slack
	// received); the step journals no value.
	"SentinelRolloutService.slack": sameResults,
	// The clock: as many readings as uninterrupted, each taken during the
	// case.
	"SentinelRolloutService.now": func(base, got outcome, step string) error {
		if len(got.Steps[step]) != len(base.Steps[step]) {
			return fmt.Errorf("%s journaled %d readings, the uninterrupted run %d", step, len(got.Steps[step]), len(base.Steps[step]))
		}
		for _, v := range got.Steps[step] {
			var ms int64
			if err := json.Unmarshal([]byte(v), &ms); err != nil {
				return fmt.Errorf("%s journaled %q: %v", step, v, err)
			}
			if ms < got.Start.UnixMilli() || ms > got.End.UnixMilli() {
				return fmt.Errorf("%s journaled %d, outside the case (%d to %d)", step, ms, got.Start.UnixMilli(), got.End.UnixMilli())
			}
		}
		return nil
	},
}

// lineDiff lists the lines only in want (-) or only in got (+).
func lineDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	var b strings.Builder
	for _, l := range w {
		if !slices.Contains(g, l) {
			b.WriteString("  - " + l + "\n")
		}
	}
	for _, l := range g {
		if !slices.Contains(w, l) {
			b.WriteString("  + " + l + "\n")
		}
	}
	return b.String()
}
