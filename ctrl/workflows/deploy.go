package workflows

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	restate "github.com/restatedev/sdk-go"

	"krane.dev/ctrl/deployspec"
	"krane.dev/ctrl/rules"
	"krane.dev/ctrl/store"
	"krane.dev/shared/kinds"
)

// DeployWorkflowName is the Restate name of the deploy workflow; its key
// (workflow id) is the deployment id.
const DeployWorkflowName = "DeployWorkflow"

// outcomePromise is the workflow promise Notify resolves.
const outcomePromise = "outcome"

// The deploy's steps (see run and the package documentation).
var (
	deployCreate        = newStep(DeployWorkflowName, "create")
	deployRegions       = newReadStep(DeployWorkflowName, "regions")
	deployTimeout       = newReadStep(DeployWorkflowName, "timeout")
	deployToDeploying   = newStep(DeployWorkflowName, "status-deploying")
	deployTopology      = newStep(DeployWorkflowName, "topology")
	deploySentinels     = newStep(DeployWorkflowName, "sentinels")
	deploySentinelReady = newStep(DeployWorkflowName, "sentinel-ready")
	deployToNetwork     = newStep(DeployWorkflowName, "status-network")
	deployCheck         = newReadStep(DeployWorkflowName, "check")
	deployFinalCheck    = newReadStep(DeployWorkflowName, "final-check")
	deployReady         = newStep(DeployWorkflowName, "ready")
	deployStopTopology  = newStep(DeployWorkflowName, "stop-topology")
	deployToFailed      = newStep(DeployWorkflowName, "status-failed")
	deployRejectInvalid = newStep(DeployWorkflowName, "status-reject")
	deployStampItself   = newStep(DeployWorkflowName, "stamp-itself")
)

// DeployResult is what the workflow returns.
type DeployResult struct {
	DeploymentID string `json:"deployment_id"`
	// Status: ready, failed, stopped, or the status the deployment already
	// had when the workflow found it was not pending.
	Status string `json:"status"`
	Error  string `json:"error,omitempty"`
	// Regions the deployment was placed in.
	Regions []string `json:"regions,omitempty"`
	// Versions the topology rows got (one VersioningService call).
	Versions []Version `json:"versions,omitempty"`
	// Sentinels the workflow created (or set running again), and those it
	// waited for.
	Sentinels []string `json:"sentinels,omitempty"`
	// SentinelWaits are the sentinels the deploy waited for before its
	// deployment could become ready (see awaitSentinels).
	SentinelWaits []store.SentinelWait `json:"sentinel_waits,omitempty"`
	// Promoted is true when the deployment became its environment's live
	// one.
	Promoted bool `json:"promoted,omitempty"`
}

type deploy struct {
	store    *store.Store
	sentinel SentinelDefaults
	vault    store.Resealer
	timeout  time.Duration
	hooks    Hooks
	// bypassed counts stamps the deploy made itself (see stampVersions).
	bypassed prometheus.Counter
	m        *deployMetrics
}

// NewDeployWorkflow is the DeployWorkflow: Run deploys one deployment,
// Notify (shared) ends its wait for readiness. See the package
// documentation for the steps.
func NewDeployWorkflow(d Deps) restate.ServiceDefinition {
	w := &deploy{store: d.Store, sentinel: d.Sentinel, vault: d.Vault, timeout: d.DeployTimeout, hooks: d.Hooks, bypassed: d.metrics().versioningBypassed, m: d.metrics().deploy}
	if w.timeout <= 0 {
		w.timeout = 5 * time.Minute
	}
	return restate.NewWorkflow(DeployWorkflowName, RetryPolicy(), private()).
		Handler("Run", restate.NewWorkflowHandler(w.run)).
		Handler("Notify", restate.NewWorkflowSharedHandler(w.notify))
}

// notify resolves the workflow's outcome promise. ctrl calls it after a
// status report showed the deploy decided (or after StopDeployment). The
// first outcome wins; later ones, and ones sent before Run waits, are
// harmless: a promise keeps its value until the workflow reads it.
func (w *deploy) notify(ctx restate.WorkflowSharedContext, o Outcome) (restate.Void, error) {
	switch o.Result {
	case ResultReady, ResultFailed, ResultStopped:
	default:
		return restate.Void{}, restate.ToTerminalError(fmt.Errorf("DeployWorkflow.Notify: result %q is not ready, failed or stopped", o.Result), restate.WithErrorCode(codeInvalid))
	}
	if err := restate.Promise[Outcome](ctx, outcomePromise).Resolve(o); err != nil {
		ctx.Log().Debug("the deploy was already notified; ignoring", "result", o.Result, "error", err)
	}
	return restate.Void{}, nil
}

// run is the deploy. Every restate.Run body below may run more than once
// (a crash between its commit and Restate journaling the result), so each
// is idempotent: inserts are "if absent", status changes are
// compare-and-set, content writes are the same on every run, and versions
// come from VersioningService calls, which are journaled (exactly once).
// Nothing outside a Run reads the clock, the database or the
// configuration; random ids come from restate.Rand.
func (w *deploy) run(ctx restate.WorkflowContext, req DeployRequest) (DeployResult, error) {
	id := restate.Key(ctx)
	if req.Deployment.ID == "" {
		req.Deployment.ID = id
	}
	res := DeployResult{DeploymentID: id}
	if err := req.validate(id); err != nil {
		// The API created the row before starting the workflow: record why
		// the deploy went nowhere.
		msg := "invalid deploy request: " + err.Error()
		if _, _, terr := w.transition(ctx, deployRejectInvalid, id, store.InProgress, store.StatusFailed, msg); terr != nil {
			return res, terr
		}
		return res, restate.ToTerminalError(errors.New(msg), restate.WithErrorCode(codeInvalid))
	}

	p := &progress{}
	outcome, err := w.deploy(ctx, req, p, &res)
	if err != nil {
		// A terminal error: bad input found on the way (no cluster in a
		// region), a missing row, or the invocation was cancelled.
		msg := err.Error()
		if te := restate.AsTerminalError(err); te != nil && te.Code() == codeCancelled {
			msg = "the deploy's workflow was cancelled in Restate (" + msg + ")"
		}
		outcome = Outcome{Result: ResultFailed, Message: msg}
	}
	switch outcome.Result {
	case ResultReady:
		promoted, status, err := w.markReady(ctx, req.Deployment)
		if err != nil {
			return res, err
		}
		if status != store.StatusReady {
			// Stopped while it became ready: leave it.
			res.Status = status
			return res, nil
		}
		res.Status, res.Promoted = store.StatusReady, promoted
	case ResultFailed:
		if err := w.fail(ctx, id, outcome.Message, p.topologyWritten); err != nil {
			return res, err
		}
		res.Status, res.Error = store.StatusFailed, outcome.Message
	case ResultStopped:
		res.Status, res.Error = store.StatusStopped, outcome.Message
	default: // not ours to change any more
		res.Status, res.Error = outcome.Status, outcome.Message
	}
	return res, nil
}

// progress is what the failure path needs to know.
type progress struct {
	topologyWritten bool
}

// deploy runs the steps up to the wait and returns the outcome.
func (w *deploy) deploy(ctx restate.WorkflowContext, req DeployRequest, p *progress, res *DeployResult) (Outcome, error) {
	id := req.Deployment.ID
	note := req.Note
	if note == "" {
		note = "created by the deploy workflow"
	}
	status, err := runStep(ctx, w.hooks, deployCreate, func(rc restate.RunContext) (string, error) {
		d := store.Deployment{Spec: req.Deployment, Regions: req.Regions, TimeoutSeconds: req.TimeoutSeconds}
		return w.store.EnsureDeployment(rc, d, note)
	})
	if err != nil {
		return Outcome{}, err
	}
	if status != store.StatusPending {
		return Outcome{Result: ResultGone, Status: status, Message: "the deployment was already " + status + "; nothing to do"}, nil
	}

	regions, err := runStep(ctx, w.hooks, deployRegions, func(rc restate.RunContext) ([]string, error) {
		return w.targetRegions(rc, req.Regions)
	})
	if err != nil {
		return Outcome{}, err
	}
	res.Regions = regions
	timeout, err := runStep(ctx, w.hooks, deployTimeout, func(restate.RunContext) (time.Duration, error) {
		if req.TimeoutSeconds > 0 {
			return time.Duration(req.TimeoutSeconds) * time.Second, nil
		}
		return w.timeout, nil // configuration: journaled, so a replay sees the same
	})
	if err != nil {
		return Outcome{}, err
	}

	if ok, cur, err := w.transition(ctx, deployToDeploying, id, []string{store.StatusPending}, store.StatusDeploying, ""); err != nil || !ok {
		return Outcome{Result: ResultGone, Status: cur, Message: "the deployment is " + cur}, err
	}

	// Topology: content first (one transaction, no versions), then one
	// VersioningService call for every region.
	p.topologyWritten = true
	refs, err := runStep(ctx, w.hooks, deployTopology, func(rc restate.RunContext) ([]store.Ref, error) {
		start := time.Now()
		refs, err := w.writeTopology(rc, req.Deployment, regions)
		traceTopology(rc, id, regions, start, err)
		return refs, err
	})
	if err != nil {
		return Outcome{}, err
	}
	if len(refs) == 0 {
		return Outcome{Result: ResultStopped, Message: "stopped before its topology was written"}, nil
	}
	if res.Versions, err = w.stampTraced(ctx, id, refs); err != nil {
		return Outcome{}, err
	}

	// A sentinel per region for the environment; ids are drawn before the
	// Run (restate.Rand is deterministic), used only where none exists.
	rnd := restate.Rand(ctx)
	candidates := make([]store.Sentinel, len(regions))
	for i, region := range regions {
		b := make([]byte, 13)
		for j := range b {
			b[j] = byte(rnd.Uint32())
		}
		sid := deployspec.NewID("sen_", b)
		s := req.Deployment
		candidates[i] = store.Sentinel{
			ID: sid, Region: region, WorkspaceID: s.WorkspaceID, ProjectID: s.ProjectID, AppID: s.AppID, EnvironmentID: s.EnvironmentID,
			K8sName: deployspec.K8sName(sid), Image: w.sentinel.Image, Replicas: w.sentinel.Replicas,
			CPUMillicores: w.sentinel.CPUMillicores, MemoryMiB: w.sentinel.MemoryMiB,
		}
	}
	if res.SentinelWaits, err = runStep(ctx, w.hooks, deploySentinels, func(rc restate.RunContext) ([]store.SentinelWait, error) {
		if w.sentinel.Image == "" {
			return nil, restate.ToTerminalError(errors.New("ctrl has no sentinel.default_image configured: it cannot create the environment's sentinels"),
				restate.WithErrorCode(codePrecondition))
		}
		return w.store.EnsureSentinels(rc, id, candidates, w.vault)
	}); err != nil {
		return Outcome{}, err
	}
	for _, sw := range res.SentinelWaits {
		if sw.Ensured {
			res.Sentinels = append(res.Sentinels, sw.ID)
		}
	}
	if out, err := w.awaitSentinels(ctx, id, res.SentinelWaits); err != nil || out.Decided() {
		return out, err
	}

	if ok, cur, err := w.transition(ctx, deployToNetwork, id, []string{store.StatusDeploying}, store.StatusNetwork, ""); err != nil || !ok {
		return Outcome{Result: ResultGone, Status: cur, Message: "the deployment is " + cur}, err
	}
	return w.await(ctx, id, timeout)
}

// awaitSentinels waits until every sentinel in waits has converged:
// SentinelService.Deploy with an empty request changes nothing and returns
// once the sentinel runs its configuration healthy, fails at a permanent
// apply error, or at its own timeout (sentinel.deploy_timeout). The calls
// run in parallel; the first failure fails the deploy with the sentinel's
// reason. The deploy's outcome promise is raced along: a failure of the
// deployment's own instances, or an operator's stop, ends the wait at
// once; a ready outcome waits for the sentinels (the promise keeps it for
// await). Once all are ready, the history notes each (one step).
func (w *deploy) awaitSentinels(ctx restate.WorkflowContext, id string, waits []store.SentinelWait) (Outcome, error) {
	if len(waits) == 0 {
		return Outcome{}, nil
	}
	promise := restate.Promise[Outcome](ctx, outcomePromise)
	futs := make([]restate.ResponseFuture[SentinelDeployResult], len(waits))
	all := []restate.Future{promise}
	for i, sw := range waits {
		futs[i] = restate.Object[SentinelDeployResult](ctx, SentinelServiceName, sw.ID, "Deploy").RequestFuture(SentinelDeployRequest{})
		all = append(all, futs[i])
	}
	left := len(futs)
	it := restate.WaitIter(ctx, all...)
	for left > 0 && it.Next() {
		f := it.Value()
		if f == promise {
			o, err := promise.Result()
			if err != nil {
				return Outcome{}, err
			}
			if o.Result == ResultFailed || o.Result == ResultStopped {
				return o, nil
			}
			continue // ready: the sentinels still decide
		}
		i := slices.IndexFunc(futs, func(rf restate.ResponseFuture[SentinelDeployResult]) bool { return restate.Future(rf) == f })
		if i < 0 {
			continue
		}
		left--
		sw := waits[i]
		res, err := futs[i].Response()
		switch {
		case err != nil:
			// Terminal: the sentinel is gone or stopped meanwhile, or its
			// deploy was cancelled in Restate.
			return Outcome{Result: ResultFailed, Message: fmt.Sprintf("sentinel %s in region %s: %v", sw.ID, sw.Region, err)}, nil
		case res.Status != ResultReady:
			return Outcome{Result: ResultFailed, Message: fmt.Sprintf("sentinel %s in region %s did not become ready: %s", sw.ID, sw.Region, res.Message)}, nil
		}
	}
	if err := it.Err(); err != nil {
		return Outcome{}, err // cancelled
	}
	// All ready: noted together, in the order of waits, so the history does
	// not depend on which cluster reported first.
	notes := make([]string, len(waits))
	for i, sw := range waits {
		notes[i] = sw.ReadyNote()
	}
	_, err := runStep(ctx, w.hooks, deploySentinelReady, func(rc restate.RunContext) (restate.Void, error) {
		return restate.Void{}, w.store.NoteDeploymentOnce(rc, id, notes...)
	})
	return Outcome{}, err
}

// await waits for the deploy to be decided. The promise can be resolved
// before this point (Notify after an early report): it keeps its value. The
// database check after taking the promise covers reports that arrived
// before ctrl could notify at all; the timer bounds the wait, and a final
// check at the deadline decides with whatever the clusters reported.
func (w *deploy) await(ctx restate.WorkflowContext, id string, timeout time.Duration) (Outcome, error) {
	promise := restate.Promise[Outcome](ctx, outcomePromise)
	now, err := runStep(ctx, w.hooks, deployCheck, func(rc restate.RunContext) (Outcome, error) { return w.evaluate(rc, id) })
	if err != nil || now.Decided() {
		return now, err
	}
	timer := restate.After(ctx, timeout)
	first, err := restate.WaitFirst(ctx, promise, timer)
	if err != nil {
		return Outcome{}, err // cancelled
	}
	if first == timer {
		final, err := runStep(ctx, w.hooks, deployFinalCheck, func(rc restate.RunContext) (Outcome, error) { return w.evaluate(rc, id) })
		if err != nil || final.Decided() {
			return final, err
		}
		return Outcome{Result: ResultFailed, Message: fmt.Sprintf("timed out after %s waiting for every region to run: %s", timeout, final.Message)}, nil
	}
	return promise.Result()
}

// evaluate reads the deploy's state: stopped when an operator stopped it,
// otherwise Evaluate of its regions.
func (w *deploy) evaluate(ctx context.Context, id string) (Outcome, error) {
	d, err := w.store.GetDeployment(ctx, id)
	if err != nil {
		return Outcome{}, err
	}
	switch d.Status {
	case store.StatusStopped:
		return Outcome{Result: ResultStopped}, nil
	case store.StatusDeploying, store.StatusNetwork:
	default:
		return Outcome{Result: ResultGone, Status: d.Status, Message: "the deployment is " + d.Status}, nil
	}
	states, err := w.store.RegionStates(ctx, id)
	if err != nil {
		return Outcome{}, err
	}
	return rules.Evaluate(states[id]), nil
}

// targetRegions: the requested regions, each of which must have a
// registered cluster, or every region with one.
func (w *deploy) targetRegions(ctx context.Context, requested []string) ([]string, error) {
	have, err := w.store.ClusterRegions(ctx)
	if err != nil {
		return nil, err
	}
	if len(requested) == 0 {
		if len(have) == 0 {
			return nil, restate.ToTerminalError(errors.New("no region has a registered cluster: register one with `ctrl admin cluster register`, then deploy again"),
				restate.WithErrorCode(codePrecondition))
		}
		return have, nil
	}
	if missing := MissingRegions(requested, have); len(missing) > 0 {
		return nil, restate.ToTerminalError(fmt.Errorf("no cluster is registered in region(s) %v (regions with clusters: %v)", missing, have),
			restate.WithErrorCode(codePrecondition))
	}
	return sortedCopy(requested), nil
}

// IngressPolicy is the CiliumNetworkPolicy that lets the environment's
// sentinels (its routing layer, in namespace "sentinel") reach the
// deployment's pods on their port, in one region. Nothing else may reach
// them: a policy with an ingress section puts the pods in default-deny.
func IngressPolicy(s deployspec.Spec, region string) store.CiliumNetworkPolicy {
	port := s.Workload.GetPort()
	if port == 0 {
		port = deployspec.DefaultPort
	}
	policy, _ := json.Marshal(map[string]any{
		"endpointSelector": map[string]any{"matchLabels": map[string]any{"unkey.com/deployment.id": s.ID}},
		"ingress": []any{map[string]any{
			"fromEndpoints": []any{map[string]any{"matchLabels": map[string]any{
				"k8s:io.kubernetes.pod.namespace": "sentinel",
				"app.kubernetes.io/component":     "sentinel",
				"unkey.com/environment.id":        s.EnvironmentID,
			}}},
			"toPorts": []any{map[string]any{"ports": []any{map[string]any{"port": fmt.Sprint(port), "protocol": "TCP"}}}},
		}},
	})
	return store.CiliumNetworkPolicy{
		ID: store.IngressPolicyID(s.ID, region), Region: region,
		K8sNamespace: s.K8sNamespace, K8sName: s.K8sName + "-ingress", Policy: policy,
	}
}

// writeTopology writes the topology content of every region, unversioned,
// provided the deployment is still deploying (an operator may have stopped
// it; the row lock orders the two). It returns every region's ref, the same
// on every run, or none when the deployment is no longer deploying.
func (w *deploy) writeTopology(ctx context.Context, s deployspec.Spec, regions []string) ([]store.Ref, error) {
	var refs []store.Ref
	_, err := w.store.WriteTx(ctx, func(ctx context.Context, tx *store.Tx) error {
		refs = nil
		status, err := tx.LockDeployment(ctx, s.ID)
		if err != nil || status != store.StatusDeploying {
			return err
		}
		for _, region := range regions {
			if err := tx.PutTopologyContent(ctx, store.Topology{DeploymentID: s.ID, Region: region, DesiredReplicas: s.Replicas, DesiredStatus: "running"}); err != nil {
				return err
			}
			refs = append(refs, store.Ref{Kind: kinds.Deployment, Region: region, ID: s.ID})
			p := IngressPolicy(s, region)
			if err := tx.PutCiliumNetworkPolicyContent(ctx, p); err != nil {
				return err
			}
			refs = append(refs, store.Ref{Kind: kinds.CiliumNetworkPolicy, Region: region, ID: p.ID})
		}
		return nil
	})
	return refs, err
}

// markReady moves the deployment from network to ready and, in the same
// transaction, promotes it to its environment's live deployment when the
// environment has none yet (the first deploy) or when it is a rollback
// (its point is to replace the live one). Any other ready deployment waits
// for an explicit Promote: a deploy never replaces what serves traffic by
// itself. It returns whether it promoted and the status afterwards.
func (w *deploy) markReady(ctx restate.WorkflowContext, s deployspec.Spec) (bool, string, error) {
	type result struct {
		Promoted bool   `json:"promoted"`
		Status   string `json:"status"`
		changed  bool   // not journaled: only this run of the body counts it
	}
	r, err := runStep(ctx, w.hooks, deployReady, func(rc restate.RunContext) (result, error) {
		var r result
		_, err := w.store.WriteTx(rc, func(ctx context.Context, tx *store.Tx) error {
			r = result{}
			live, err := tx.LiveDeployment(ctx, s.EnvironmentID)
			if err != nil {
				return err
			}
			promote := live == "" || s.RolledBackFrom != ""
			msg := ""
			if promote {
				msg = "promoted: the environment's live deployment"
			}
			changed, cur, err := tx.TransitionDeployment(ctx, s.ID, []string{store.StatusNetwork}, store.StatusReady, msg)
			if err != nil {
				return err
			}
			r.Status, r.changed = cur, changed
			if changed && promote {
				r.Promoted = true
				return tx.SetLiveDeployment(ctx, s.EnvironmentID, s.ID)
			}
			r.Promoted = live == s.ID // this step ran before and promoted it
			return nil
		})
		if err == nil && r.changed {
			w.m.entered(rc, s.ID, store.StatusReady, "")
		}
		return r, err
	})
	return r.Promoted, r.Status, err
}

// fail soft-deletes the topology (new versions from the VersioningService)
// and records why the deploy failed. Its steps are retried until they
// succeed: a failed deploy must not keep running.
func (w *deploy) fail(ctx restate.WorkflowContext, id, msg string, cleanup bool) error {
	if cleanup {
		refs, err := runStep(ctx, w.hooks, deployStopTopology, func(rc restate.RunContext) ([]store.Ref, error) {
			var refs []store.Ref
			_, err := w.store.WriteTx(rc, func(ctx context.Context, tx *store.Tx) error {
				var err error
				refs, err = tx.StopTopology(ctx, id, false)
				return err
			})
			return refs, err
		})
		if err != nil {
			return err
		}
		if _, err := w.stampVersions(ctx, id, refs); err != nil {
			return err
		}
	}
	_, _, err := w.transition(ctx, deployToFailed, id, store.InProgress, store.StatusFailed, msg)
	return err
}

// transition is a compare-and-set of the deployment's status in a Run. It
// reports whether the deployment is at status to now: moved by this step,
// or by an earlier run of it (the body ran twice, and the second run found
// the row at to already; only the deploy workflow moves a deployment to
// deploying, network or ready, so that was its own work). A deployment
// that does not exist counts as not moved.
func (w *deploy) transition(ctx restate.WorkflowContext, step Step, id string, from []string, to, msg string) (bool, string, error) {
	type result struct {
		Changed bool   `json:"changed"`
		Status  string `json:"status"`
	}
	r, err := runStep(ctx, w.hooks, step, func(rc restate.RunContext) (result, error) {
		changed, cur, err := w.store.TransitionDeployment(rc, id, from, to, msg)
		if errors.Is(err, store.ErrNotFound) {
			return result{Status: "missing"}, nil
		}
		if err == nil && changed {
			w.m.entered(rc, id, to, msg)
		}
		return result{Changed: changed, Status: cur}, err
	})
	return r.Changed || r.Status == to, r.Status, err
}

// MissingRegions returns the requested regions that are not in have.
func MissingRegions(requested, have []string) []string {
	set := make(map[string]bool, len(have))
	for _, r := range have {
		set[r] = true
	}
	var missing []string
	for _, r := range requested {
		if !set[r] {
			missing = append(missing, r)
		}
	}
	return missing
}

func sortedCopy(s []string) []string {
	out := slices.Clone(s)
	slices.Sort(out)
	return out
}
