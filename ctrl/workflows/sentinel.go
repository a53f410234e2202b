package workflows

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	restate "github.com/restatedev/sdk-go"

	"krane.dev/ctrl/deployspec"
	"krane.dev/ctrl/rules"
	"krane.dev/ctrl/store"
	"krane.dev/shared/kinds"
)

// SentinelServiceName is the Restate name of the SentinelService, a virtual
// object keyed by sentinel id.
const SentinelServiceName = "SentinelService"

// The steps of SentinelService.Deploy (see deploy).
var (
	sentinelWrite      = newStep(SentinelServiceName, "write")
	sentinelFence      = newReadStep(SentinelServiceName, "awakeable-stored")
	sentinelCheck      = newReadStep(SentinelServiceName, "check")
	sentinelFinalCheck = newReadStep(SentinelServiceName, "final-check")
	sentinelFinish     = newStep(SentinelServiceName, "finish")
)

// notifyReadyKey is the state key under which a waiting Deploy keeps its
// awakeable (a sentinelWaiter).
const notifyReadyKey = "notify_ready_awakeable"

// DefaultSentinelDeployTimeout is how long a sentinel deploy waits for the
// cluster when neither the request nor sentinel.deploy_timeout says.
const DefaultSentinelDeployTimeout = 10 * time.Minute

// Limits of a sentinel's size (what the sentinel plugin accepts).
const (
	MaxSentinelReplicas      = 100
	MaxSentinelCPUMillicores = 64_000
	MaxSentinelMemoryMiB     = 262_144
)

// SentinelDeployRequest is the input of SentinelService.Deploy. Zero values
// keep the sentinel's current setting.
type SentinelDeployRequest struct {
	Image         string `json:"image,omitempty"`
	Replicas      int32  `json:"replicas,omitempty"`
	CPUMillicores int64  `json:"cpu_millicores,omitempty"`
	MemoryMiB     int64  `json:"memory_mib,omitempty"`
	// TimeoutSeconds bounds the wait for the cluster; 0 means ctrl's
	// sentinel.deploy_timeout.
	TimeoutSeconds int32 `json:"timeout_seconds,omitempty"`
	// EncryptedCredentials, when set, replaces the sentinel's credentials:
	// sealed by the sentinel API for this sentinel's id (the request is
	// journaled in Restate, so it never carries plaintext), with the names
	// of the variables in CredentialNames.
	EncryptedCredentials []byte   `json:"encrypted_credentials,omitempty"`
	CredentialNames      []string `json:"credential_names,omitempty"`
	// CredentialsSameAs is the sealed credentials the API opened and found
	// equal to the new ones: while the sentinel still holds exactly this
	// blob, the deploy keeps it (a fresh seal differs in every byte, and
	// would roll the pods for nothing).
	CredentialsSameAs []byte `json:"credentials_same_as,omitempty"`
	// KeepStopped leaves a stopped sentinel stopped: its configuration
	// (image, size, credentials) is set, and the deploy is ready at once,
	// since nothing of it runs; it starts on that configuration when a
	// deploy of its environment starts it again. Fleet rollouts send it.
	// Without it, a deploy of a stopped sentinel starts it.
	KeepStopped bool `json:"keep_stopped,omitempty"`
}

// MaxSealedCredentials bounds a sentinel's sealed credentials (the vault's
// own bound on a sealed environment).
const MaxSealedCredentials = 768 << 10

// Validate checks the request's fields (zero means "keep").
func (r SentinelDeployRequest) Validate() error {
	if r.Image != "" {
		if err := deployspec.ValidImage("image", r.Image); err != nil {
			return err
		}
	}
	switch {
	case r.Replicas < 0 || r.Replicas > MaxSentinelReplicas:
		return deployspec.Errorf("replicas", "%d is out of range 0..%d (0 keeps the current count)", r.Replicas, MaxSentinelReplicas)
	case r.CPUMillicores < 0 || r.CPUMillicores > MaxSentinelCPUMillicores:
		return deployspec.Errorf("cpu_millicores", "%d is out of range 0..%d (0 keeps the current value)", r.CPUMillicores, MaxSentinelCPUMillicores)
	case r.MemoryMiB < 0 || r.MemoryMiB > MaxSentinelMemoryMiB:
		return deployspec.Errorf("memory_mib", "%d is out of range 0..%d (0 keeps the current value)", r.MemoryMiB, MaxSentinelMemoryMiB)
	case r.TimeoutSeconds < 0 || r.TimeoutSeconds > deployspec.MaxTimeout:
		return deployspec.Errorf("timeout_seconds", "%d is out of range 0..%d (0: ctrl's sentinel.deploy_timeout)", r.TimeoutSeconds, deployspec.MaxTimeout)
	case len(r.EncryptedCredentials) > MaxSealedCredentials:
		return deployspec.Errorf("credentials", "sealed, they take %d bytes; at most %d", len(r.EncryptedCredentials), MaxSealedCredentials)
	case len(r.EncryptedCredentials) == 0 && (len(r.CredentialNames) > 0 || len(r.CredentialsSameAs) > 0):
		return deployspec.Errorf("credentials", "names without sealed credentials (a deploy request must carry the sealed blob)")
	case len(r.EncryptedCredentials) > 0 && len(r.CredentialNames) == 0:
		return deployspec.Errorf("credentials", "sealed credentials without the names of their variables")
	}
	return nil
}

// SentinelDeployResult is what Deploy returns: ready, or failed with why.
// Deploy does not roll a failed sentinel back: it stays on whatever the
// cluster made of the new configuration (fleet rollbacks are
// SentinelRolloutService.RollbackAll).
type SentinelDeployResult struct {
	SentinelID string `json:"sentinel_id"`
	// Status: ready or failed.
	Status string `json:"status"`
	// Version is the desired-state version the deploy waited for.
	Version uint64 `json:"version"`
	Image   string `json:"image"`
	// Changed is false when the configuration was already the requested
	// one (no new version was written).
	Changed bool   `json:"changed,omitempty"`
	Message string `json:"message,omitempty"`
}

// SentinelNotice wakes a waiting Deploy. Request names the deploy it is
// for (sentinels.deploy_request, the Deploy's invocation id): a notice for
// another deploy wakes nothing.
type SentinelNotice struct {
	Request string `json:"request"`
	// Result: ready or failed.
	Result  string `json:"result"`
	Message string `json:"message,omitempty"`
}

// NotifyResult says whether a notice woke a waiting Deploy.
type NotifyResult struct {
	Woken bool `json:"woken"`
}

// sentinelWaiter is the state a waiting Deploy keeps under notifyReadyKey.
type sentinelWaiter struct {
	Awakeable string `json:"awakeable"`
	Request   string `json:"request"`
}

type sentinels struct {
	store   *store.Store
	timeout time.Duration
	hooks   Hooks
}

// NewSentinelService is the SentinelService: Deploy (exclusive) changes a
// sentinel's configuration and waits until the cluster runs it;
// NotifyReady and NotifyFailed (shared) end that wait. See Deploy.
func NewSentinelService(d Deps) restate.ServiceDefinition {
	s := &sentinels{store: d.Store, timeout: d.SentinelDeployTimeout, hooks: d.Hooks}
	if s.timeout <= 0 {
		s.timeout = DefaultSentinelDeployTimeout
	}
	return restate.NewObject(SentinelServiceName, RetryPolicy(), private()).
		Handler("Deploy", restate.NewObjectHandler(s.deploy)).
		Handler("NotifyReady", restate.NewObjectSharedHandler(func(ctx restate.ObjectSharedContext, n SentinelNotice) (NotifyResult, error) {
			n.Result = ResultReady
			return s.notify(ctx, n)
		})).
		Handler("NotifyFailed", restate.NewObjectSharedHandler(func(ctx restate.ObjectSharedContext, n SentinelNotice) (NotifyResult, error) {
			n.Result = ResultFailed
			return s.notify(ctx, n)
		}))
}

// notify resolves the awakeable a Deploy of n.Request stored, if one is
// waiting. Anything else (no Deploy waiting, a notice for an earlier one, a
// second notice) does nothing: notices are hints, sent at least once.
func (s *sentinels) notify(ctx restate.ObjectSharedContext, n SentinelNotice) (NotifyResult, error) {
	w, err := restate.Get[*sentinelWaiter](ctx, notifyReadyKey)
	if err != nil {
		return NotifyResult{}, err
	}
	if w == nil || w.Request != n.Request {
		return NotifyResult{}, nil
	}
	restate.ResolveAwakeable(ctx, w.Awakeable, n)
	return NotifyResult{Woken: true}, nil
}

// deployWrite is what Deploy's write step decided.
type deployWrite struct {
	Version uint64 `json:"version"`
	Image   string `json:"image"`
	Changed bool   `json:"changed"`
	// Ready: nothing changed and the sentinel already runs its
	// configuration.
	Ready   bool          `json:"ready"`
	Timeout time.Duration `json:"timeout"`
}

// deploy is SentinelService.Deploy:
//
//  1. write: in one transaction, lock the row, merge the request over it,
//     and (when something changed) write the configuration with a new
//     version; record this invocation as the owner of deploy_status =
//     progressing. Nothing changed and already converged: ready at once.
//     A stopped sentinel is set running again (a change, a new version),
//     unless the request says KeepStopped: then only its configuration is
//     set and it is ready at once. A missing one is a terminal error.
//  2. create an awakeable and store it (notifyReadyKey) with the owner;
//  3. fence: an empty step; Restate acknowledges it only after it has
//     applied every earlier entry, so from here on NotifyReady sees the
//     stored awakeable;
//  4. check the database: a report that arrived before step 3 found no
//     awakeable, so it must be visible here;
//  5. wait for the awakeable or the timeout.
//
// Every report that makes the sentinel ready commits either before step 4
// reads (step 4 sees it) or after; then ctrl's Notifier reads it after step
// 3 and calls NotifyReady, which finds the awakeable. No wake-up is lost.
// Every later change of deploy_status is a compare-and-set on the owner.
func (s *sentinels) deploy(ctx restate.ObjectContext, req SentinelDeployRequest) (SentinelDeployResult, error) {
	id := restate.Key(ctx)
	res := SentinelDeployResult{SentinelID: id}
	if err := req.Validate(); err != nil {
		return res, restate.ToTerminalError(fmt.Errorf("deploy of sentinel %s: %w", id, err), restate.WithErrorCode(codeInvalid))
	}
	request := ctx.Request().ID
	w, err := runStep(ctx, s.hooks, sentinelWrite, func(rc restate.RunContext) (deployWrite, error) {
		return s.write(rc, id, request, req)
	})
	if err != nil {
		return res, err
	}
	res.Version, res.Image, res.Changed = w.Version, w.Image, w.Changed
	if w.Ready {
		res.Status = ResultReady
		return res, nil
	}

	awk := restate.Awakeable[SentinelNotice](ctx)
	restate.Set(ctx, notifyReadyKey, sentinelWaiter{Awakeable: awk.Id(), Request: request})
	if _, ferr := runStep(ctx, s.hooks, sentinelFence, func(restate.RunContext) (restate.Void, error) { return restate.Void{}, nil }); ferr != nil {
		return res, s.cancelled(ctx, id, request, ferr)
	}
	outcome, err := runStep(ctx, s.hooks, sentinelCheck, func(rc restate.RunContext) (Outcome, error) { return s.evaluate(rc, id) })
	if err != nil {
		return res, s.cancelled(ctx, id, request, err)
	}
	if !outcome.Decided() {
		timer := restate.After(ctx, w.Timeout)
		first, werr := restate.WaitFirst(ctx, awk, timer)
		if werr != nil {
			return res, s.cancelled(ctx, id, request, werr)
		}
		if first == timer {
			if outcome, err = runStep(ctx, s.hooks, sentinelFinalCheck, func(rc restate.RunContext) (Outcome, error) { return s.evaluate(rc, id) }); err != nil {
				return res, s.cancelled(ctx, id, request, err)
			}
			if !outcome.Decided() {
				outcome = Outcome{Result: ResultFailed, Message: fmt.Sprintf("timed out after %s waiting for sentinel %s to run %s healthy at version %d: %s",
					w.Timeout, id, w.Image, w.Version, outcome.Message)}
			}
		} else {
			n, aerr := awk.Result()
			if aerr != nil {
				return res, s.cancelled(ctx, id, request, aerr)
			}
			outcome = Outcome{Result: n.Result, Message: n.Message}
		}
	}
	restate.Clear(ctx, notifyReadyKey)
	status, err := s.finish(ctx, id, request, outcome)
	if err != nil {
		return res, err
	}
	res.Status, res.Message = status, outcome.Message
	return res, nil
}

// write is Deploy's first step (see deploy). It runs in a restate.Run and
// may run twice: a second run finds the row owned by this deploy already
// (deploy_request), and answers what the first run decided, recorded with
// it (the version it stamped, whether it changed the configuration, whether
// it was ready at once).
func (s *sentinels) write(ctx context.Context, id, request string, req SentinelDeployRequest) (deployWrite, error) {
	var w deployWrite
	stamped, err := s.store.WriteTx(ctx, func(ctx context.Context, tx *store.Tx) error {
		w = deployWrite{}
		row, err := tx.LockSentinel(ctx, id)
		if errors.Is(err, store.ErrNotFound) {
			return restate.ToTerminalError(fmt.Errorf("sentinel %s does not exist (it may have been deleted); nothing to deploy", id), restate.WithErrorCode(codeNotFound))
		}
		if err != nil {
			return err
		}
		if row.DeployRequest == request {
			w.Image, w.Version, w.Changed, w.Ready = row.Image, row.Version, row.DeployChanged, row.DeployStatus == store.SentinelReady
			return nil
		}
		next := row.Sentinel
		stopped := row.DesiredState != "running" && req.KeepStopped
		if !stopped {
			next.DesiredState = "running" // a deploy of a stopped sentinel starts it again
		}
		if req.Image != "" {
			next.Image = req.Image
		}
		if req.Replicas != 0 {
			next.Replicas = req.Replicas
		}
		if req.CPUMillicores != 0 {
			next.CPUMillicores = req.CPUMillicores
		}
		if req.MemoryMiB != 0 {
			next.MemoryMiB = req.MemoryMiB
		}
		w.Image, w.Version = next.Image, row.Version
		// New credentials change the sentinel unless the API found them
		// equal to the ones it still holds.
		newCredentials := len(req.EncryptedCredentials) > 0 &&
			(len(req.CredentialsSameAs) == 0 || !bytes.Equal(req.CredentialsSameAs, row.EncryptedCredentials))
		if newCredentials {
			if err := tx.SetSentinelCredentials(ctx, id, row.Region, req.EncryptedCredentials, req.CredentialNames); err != nil {
				return err
			}
		}
		if stopped {
			// Nothing of it runs, so nothing to wait for: it starts on
			// this configuration.
			w.Ready, w.Changed = true, next != row.Sentinel || newCredentials
			if next != row.Sentinel {
				if err := tx.PutSentinel(ctx, next); err != nil {
					return err
				}
			}
			return tx.SetSentinelDeploy(ctx, id, request, store.SentinelReady, w.Changed)
		}
		if next == row.Sentinel && !newCredentials {
			if rules.SentinelConverged(row) {
				w.Ready = true
				return tx.SetSentinelDeploy(ctx, id, request, store.SentinelReady, false)
			}
			return tx.SetSentinelDeploy(ctx, id, request, store.SentinelProgressing, false)
		}
		w.Changed = true
		if next != row.Sentinel {
			if err := tx.PutSentinel(ctx, next); err != nil {
				return err
			}
		}
		return tx.SetSentinelDeploy(ctx, id, request, store.SentinelProgressing, true)
	})
	if err != nil {
		return deployWrite{}, err
	}
	for _, st := range stamped {
		if st.Kind == kinds.Sentinel && st.ID == id {
			w.Version = st.Version
		}
	}
	w.Timeout = s.timeout // configuration: journaled with the step
	if req.TimeoutSeconds > 0 {
		w.Timeout = time.Duration(req.TimeoutSeconds) * time.Second
	}
	return w, nil
}

// evaluate reads the sentinel and its apply errors and decides.
func (s *sentinels) evaluate(ctx context.Context, id string) (Outcome, error) {
	row, err := s.store.GetSentinel(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return Outcome{Result: ResultFailed, Message: fmt.Sprintf("sentinel %s was deleted while it deployed", id)}, nil
	}
	if err != nil {
		return Outcome{}, err
	}
	errs, err := s.store.ApplyErrors(ctx, kinds.Sentinel, row.Region, id)
	if err != nil {
		return Outcome{}, err
	}
	return rules.EvaluateSentinel(row, errs), nil
}

// finish records the outcome, provided this deploy still owns the row,
// and returns the status to report.
func (s *sentinels) finish(ctx restate.ObjectContext, id, request string, o Outcome) (string, error) {
	status := store.SentinelFailed
	if o.Result == ResultReady {
		status = store.SentinelReady
	}
	_, err := runStep(ctx, s.hooks, sentinelFinish, func(rc restate.RunContext) (restate.Void, error) {
		_, _, err := s.store.FinishSentinelDeploy(rc, id, request, status, o.Message)
		if errors.Is(err, store.ErrNotFound) {
			err = nil // deleted meanwhile: nothing to record
		}
		return restate.Void{}, err
	})
	return o.Result, err
}

// cancelled cleans up after the invocation was cancelled in Restate (or
// another terminal failure while waiting): the stored awakeable goes, the
// deploy is recorded as failed, and the error is returned.
func (s *sentinels) cancelled(ctx restate.ObjectContext, id, request string, cause error) error {
	restate.Clear(ctx, notifyReadyKey)
	msg := "the deploy stopped waiting: " + cause.Error()
	if te := restate.AsTerminalError(cause); te != nil && te.Code() == codeCancelled {
		msg = "the deploy's invocation was cancelled in Restate"
	}
	if _, err := s.finish(ctx, id, request, Outcome{Result: ResultFailed, Message: msg}); err != nil {
		return err
	}
	return cause
}
