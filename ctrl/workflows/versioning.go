package workflows

import (
	"context"
	"errors"
	"fmt"
	"time"

	restate "github.com/restatedev/sdk-go"

	"krane.dev/ctrl/store"
)

// The VersioningService is a virtual object with one key.
const (
	VersioningServiceName = "VersioningService"
	VersioningKey         = "singleton"
	// MaxStampRefs bounds one Stamp call: the stamping transaction holds
	// the global version lock for one point update per ref.
	MaxStampRefs = 1000
)

// Ref names one desired-state row (see store.Ref).
type Ref struct {
	Kind   string `json:"kind"`
	Region string `json:"region"`
	ID     string `json:"id"`
}

// StampRequest asks for new versions of rows whose content is committed.
type StampRequest struct {
	Refs []Ref `json:"refs"`
	// TraceDeployment names the deployment whose deploy this stamp
	// publishes: the stamp step records its deployment.events.emit span
	// (see tracing.go). Empty for every other stamp.
	TraceDeployment string `json:"trace_deployment,omitempty"`
}

// Version is the version a row was given.
type Version struct {
	Ref
	Version uint64 `json:"version"`
}

// StampResponse gives the versions, in the order of the request's refs:
// consecutive numbers, the first one above every version given before.
type StampResponse struct {
	Versions []Version `json:"versions"`
}

// versioningStamp is Stamp's one step.
var versioningStamp = newStep(VersioningServiceName, "stamp")

type versioning struct {
	store *store.Store
	hooks Hooks
}

// NewVersioningService is the VersioningService: a virtual object whose only
// key is "singleton", with one exclusive handler, Stamp. See the package
// documentation for why this gives exactly-once, gap-free versions.
func NewVersioningService(d Deps) restate.ServiceDefinition {
	v := &versioning{store: d.Store, hooks: d.Hooks}
	return restate.NewObject(VersioningServiceName,
		RetryPolicy(), private(),
		// Calls are frequent and their results are in MySQL; an hour of
		// journals is plenty to debug with.
		restate.WithJournalRetention(time.Hour),
	).Handler("Stamp", restate.NewObjectHandler(v.stamp))
}

func (r StampRequest) check() ([]store.Ref, error) {
	if len(r.Refs) == 0 || len(r.Refs) > MaxStampRefs {
		return nil, fmt.Errorf("a stamp request needs 1 to %d refs, got %d", MaxStampRefs, len(r.Refs))
	}
	seen := make(map[Ref]bool, len(r.Refs))
	out := make([]store.Ref, len(r.Refs))
	for i, ref := range r.Refs {
		if !store.ValidKind(ref.Kind) || ref.Region == "" || ref.ID == "" {
			return nil, fmt.Errorf("refs[%d] = %+v: a ref needs a valid kind, a region and an id", i, ref)
		}
		if seen[ref] {
			return nil, fmt.Errorf("refs[%d] = %+v is listed twice (a row gets one version per stamp)", i, ref)
		}
		seen[ref] = true
		out[i] = store.Ref{Kind: ref.Kind, Region: ref.Region, ID: ref.ID}
	}
	return out, nil
}

// stamp gives the refs new versions with one restate.Run around
// store.StampCommitted. The grant key is the invocation id, which Restate
// keeps across retries: when the Run body runs again (a crash after the
// commit and before Restate journaled the result), StampCommitted finds the
// recorded grant and returns the same versions instead of stamping again.
// Each invocation calls StampCommitted exactly once, so the id alone is a
// unique key.
func (v *versioning) stamp(ctx restate.ObjectContext, req StampRequest) (StampResponse, error) {
	refs, err := req.check()
	if err != nil {
		return StampResponse{}, restate.ToTerminalError(fmt.Errorf("VersioningService.Stamp: %w", err), restate.WithErrorCode(codeInvalid))
	}
	grantKey := ctx.Request().ID
	grant, err := runStep(ctx, v.hooks, versioningStamp, func(rc restate.RunContext) (store.Grant, error) {
		start := time.Now()
		g, err := v.store.StampCommitted(rc, refs, grantKey)
		if err == nil && !g.Reused && req.TraceDeployment != "" {
			traceEmit(rc, req.TraceDeployment, g, len(refs), start)
		}
		if errors.Is(err, store.ErrNotFound) {
			// Stamping never creates rows: the caller must commit the
			// content first. Retrying cannot help.
			return g, restate.ToTerminalError(err, restate.WithErrorCode(codeNotFound))
		}
		return g, err
	})
	if err != nil {
		return StampResponse{}, err
	}
	if grant.Last-grant.First+1 != uint64(len(refs)) {
		// A grant key reused with other refs; never happens with
		// invocation ids, and must not go unnoticed if it does.
		return StampResponse{}, restate.TerminalErrorf("VersioningService.Stamp: grant %s covers versions %d..%d for %d refs (a grant key was reused with different refs)",
			grantKey, grant.First, grant.Last, len(refs))
	}
	if grant.Reused {
		ctx.Log().Info("a retried stamp step got its recorded versions back", "first", grant.First, "last", grant.Last)
	}
	out := StampResponse{Versions: make([]Version, len(refs))}
	for i, ref := range req.Refs {
		out.Versions[i] = Version{Ref: ref, Version: grant.First + uint64(i)}
	}
	return out, nil
}

// versioningWait bounds how long a deploy waits for the VersioningService
// (see stampVersions). A Stamp takes milliseconds; a minute means the
// singleton is held by an invocation that does not end.
const versioningWait = time.Minute

// stampVersions gives refs new versions for the deploy of deployment id:
// through VersioningService.Stamp (a journaled call: exactly once), waiting
// at most the versioning wait. The singleton is exclusive, so one of its
// invocations that does not end (paused in Restate after its retries, or
// stuck) would hold every deploy behind it. Past the wait the deploy
// cancels its queued call and stamps the rows itself, in a step: exactly
// once too (the grant is recorded under this call's own key in the stamp's
// transaction), and in version order all the same (the database lock is
// what orders versions; see ctrl/store). The same transaction notes it in
// the deployment's history, and krane_ctrl_versioning_bypassed_total
// counts it.
func (w *deploy) stampVersions(ctx restate.WorkflowContext, id string, refs []store.Ref) ([]Version, error) {
	return w.stamp(ctx, id, refs, false)
}

// stampTraced is stampVersions for the deploy's own rows: the stamp
// records the deploy's deployment.events.emit span.
func (w *deploy) stampTraced(ctx restate.WorkflowContext, id string, refs []store.Ref) ([]Version, error) {
	return w.stamp(ctx, id, refs, true)
}

func (w *deploy) stamp(ctx restate.WorkflowContext, id string, refs []store.Ref, traced bool) ([]Version, error) {
	if len(refs) == 0 {
		return nil, nil
	}
	req := StampRequest{Refs: make([]Ref, len(refs))}
	if traced {
		req.TraceDeployment = id
	}
	for i, r := range refs {
		req.Refs[i] = Ref{Kind: r.Kind, Region: r.Region, ID: r.ID}
	}
	call := restate.Object[StampResponse](ctx, VersioningServiceName, VersioningKey, "Stamp").RequestFuture(req)
	wait := versioningWait
	if w.hooks.VersioningWait > 0 {
		wait = w.hooks.VersioningWait
	}
	timer := restate.After(ctx, wait)
	first, werr := restate.WaitFirst(ctx, call, timer)
	if werr != nil {
		return nil, werr
	}
	if first == call {
		resp, err := call.Response()
		if err != nil {
			return nil, err
		}
		return resp.Versions, nil
	}
	stuck := call.GetInvocationId()
	restate.CancelInvocation(ctx, stuck)
	grantKey := ctx.Request().ID + "/" + stuck // unique per call
	grant, err := runStep(ctx, w.hooks, deployStampItself, func(rc restate.RunContext) (store.Grant, error) {
		start := time.Now()
		g, err := w.store.StampCommittedThen(rc, refs, grantKey, func(ctx context.Context, tx *store.Tx, g store.Grant) error {
			w.bypassed.Inc()
			return tx.NoteDeployment(ctx, id, fmt.Sprintf("the VersioningService did not answer within %s (an invocation of %s/%s is paused or stuck: "+
				"find it with `restate invocations ls`); the deploy stamped its %d rows itself, versions %d..%d", wait, VersioningServiceName, VersioningKey, len(refs), g.First, g.Last))
		})
		if err == nil && !g.Reused && traced {
			traceEmit(rc, id, g, len(refs), start)
		}
		return g, err
	})
	if err != nil {
		return nil, err
	}
	out := make([]Version, len(req.Refs))
	for i, r := range req.Refs {
		out[i] = Version{Ref: r, Version: grant.First + uint64(i)}
	}
	return out, nil
}
