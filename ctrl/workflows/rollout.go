package workflows

import (
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"

	restate "github.com/restatedev/sdk-go"

	"krane.dev/ctrl/deployspec"
	"krane.dev/ctrl/rules"
	"krane.dev/ctrl/store"
)

// The fleet rollout: a virtual object with the single key "singleton"
// (every rollout operation is serialised), its state under "rollout", and a
// plain service whose invocations wait for the sentinels of one batch.
const (
	RolloutServiceName = "SentinelRolloutService"
	RolloutWorkerName  = "SentinelRolloutWorker"
	RolloutKey         = "singleton"
	rolloutStateKey    = "rollout"

	// rolloutPageSize sentinels are listed per step when a rollout starts.
	rolloutPageSize = 500
	// rolloutBatchSize bounds the sentinels one worker invocation waits
	// for, and so its journal (two entries per sentinel).
	rolloutBatchSize = 100
	// MaxRolloutSentinels bounds one rollout (its state holds every id).
	MaxRolloutSentinels = 20_000
	// MaxBakeSeconds bounds the pause between waves.
	MaxBakeSeconds = 24 * 60 * 60
)

// Rollout states.
const (
	RolloutIdle        = "idle"
	RolloutInProgress  = "in_progress"
	RolloutPaused      = "paused"
	RolloutRollingBack = "rolling_back"
	RolloutCancelled   = "cancelled"
	RolloutCompleted   = "completed"
)

// Wave states.
const (
	WavePending    = "pending"
	WaveInProgress = "in_progress"
	WaveCompleted  = "completed"
	WaveFailed     = "failed"
	WaveSkipped    = "skipped"
)

// Kinds of launches: a batch of SentinelService.Deploy calls whose results
// come back to BatchDone.
const (
	launchWave     = "wave"
	launchRetry    = "retry"
	launchRollback = "rollback"
)

// RolloutRequest starts a fleet rollout (SentinelRolloutService.Rollout).
type RolloutRequest struct {
	Image string `json:"image"`
	// WavePercentages are cumulative; empty means rules.DefaultWavePercentages.
	WavePercentages []int32 `json:"wave_percentages,omitempty"`
	// SlackWebhookURL receives a message at every transition.
	SlackWebhookURL string `json:"slack_webhook_url,omitempty"`
	// BakeSeconds is the pause after a wave succeeds before the next one.
	BakeSeconds int32 `json:"bake_seconds,omitempty"`
	// DeployTimeoutSeconds bounds each sentinel's deploy; 0 means ctrl's
	// sentinel.deploy_timeout.
	DeployTimeoutSeconds int32 `json:"deploy_timeout_seconds,omitempty"`
}

// Validate checks a rollout request; the error names the field.
func (r RolloutRequest) Validate() error {
	if err := deployspec.ValidImage("image", r.Image); err != nil {
		return err
	}
	if len(r.WavePercentages) > 0 {
		if err := rules.ValidWavePercentages("wave_percentages", r.WavePercentages); err != nil {
			return err
		}
	}
	if r.SlackWebhookURL != "" {
		u, err := url.Parse(r.SlackWebhookURL)
		if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || len(r.SlackWebhookURL) > 2048 {
			return deployspec.Errorf("slack_webhook_url", "not an http(s) URL (want https://hooks.slack.com/services/...)")
		}
	}
	if r.BakeSeconds < 0 || r.BakeSeconds > MaxBakeSeconds {
		return deployspec.Errorf("bake_seconds", "%d is out of range 0..%d", r.BakeSeconds, MaxBakeSeconds)
	}
	if r.DeployTimeoutSeconds < 0 || r.DeployTimeoutSeconds > deployspec.MaxTimeout {
		return deployspec.Errorf("deploy_timeout_seconds", "%d is out of range 0..%d (0: ctrl's sentinel.deploy_timeout)", r.DeployTimeoutSeconds, deployspec.MaxTimeout)
	}
	return nil
}

// ResumeRequest continues a paused rollout.
type ResumeRequest struct {
	// RetryFailed deploys the failed sentinels again before the next wave;
	// otherwise the rollout moves past them (they stay failed).
	RetryFailed bool `json:"retry_failed,omitempty"`
}

// RolloutStatus is a rollout as the operators see it (Status and every
// operator handler return it). Waves and CurrentWave count from 1.
type RolloutStatus struct {
	Run         string       `json:"run,omitempty"`
	State       string       `json:"state"`
	Image       string       `json:"image,omitempty"`
	CurrentWave int          `json:"current_wave,omitempty"`
	Waves       []WaveStatus `json:"waves,omitempty"`
	Total       int          `json:"total"`
	Succeeded   int          `json:"succeeded"`
	Failed      int          `json:"failed"`
	FailedIDs   []string     `json:"failed_ids,omitempty"`
	Message     string       `json:"message,omitempty"`
	BakeSeconds int32        `json:"bake_seconds,omitempty"`
	StartedAtMs int64        `json:"started_at_ms,omitempty"`
	UpdatedAtMs int64        `json:"updated_at_ms,omitempty"`
	// The last RollbackAll: how many touched sentinels it deploys back,
	// how many are back (ready on their previous image), which failed.
	RollbackTotal     int      `json:"rollback_total,omitempty"`
	Reverted          int      `json:"reverted,omitempty"`
	RollbackFailedIDs []string `json:"rollback_failed_ids,omitempty"`
}

// WaveStatus is one wave of a rollout.
type WaveStatus struct {
	Index      int    `json:"index"`
	Percentage int32  `json:"percentage"`
	Size       int    `json:"size"`
	Succeeded  int    `json:"succeeded"`
	Failed     int    `json:"failed"`
	State      string `json:"state"`
}

// rolloutState is the object's state under rolloutStateKey.
type rolloutState struct {
	// Run names the rollout: its number and a random suffix (it scopes the
	// idempotency keys of its deploys).
	Run                  string            `json:"run"`
	Runs                 int               `json:"runs"`
	State                string            `json:"state"`
	Image                string            `json:"image"`
	Waves                []waveState       `json:"waves"`
	CurrentWave          int               `json:"current_wave"`
	PreviousImages       map[string]string `json:"previous_images"`
	SucceededIDs         []string          `json:"succeeded_ids"`
	FailedIDs            []string          `json:"failed_ids"`
	SlackWebhookURL      string            `json:"slack_webhook_url,omitempty"`
	BakeSeconds          int32             `json:"bake_seconds,omitempty"`
	DeployTimeoutSeconds int32             `json:"deploy_timeout_seconds,omitempty"`
	Message              string            `json:"message,omitempty"`
	StartedAtMs          int64             `json:"started_at_ms"`
	UpdatedAtMs          int64             `json:"updated_at_ms"`

	// Launches numbers launches within the run; Forward is the wave or
	// retry in flight, Rollback the RollbackAll in flight.
	Launches int         `json:"launches"`
	Forward  launchState `json:"forward"`
	Rollback launchState `json:"rollback"`

	RollbackTotal     int      `json:"rollback_total,omitempty"`
	Reverted          int      `json:"reverted,omitempty"`
	RollbackFailedIDs []string `json:"rollback_failed_ids,omitempty"`
}

type waveState struct {
	Percentage int32    `json:"percentage"`
	IDs        []string `json:"ids"`
	Succeeded  int      `json:"succeeded"`
	Failed     int      `json:"failed"`
	State      string   `json:"state"`
}

// launchState is a launch in flight (ID 0: none).
type launchState struct {
	ID      int    `json:"id,omitempty"`
	Kind    string `json:"kind,omitempty"`
	Pending int    `json:"pending,omitempty"` // batches not reported yet
	// Failed are the launch's sentinels that did not end ready.
	Failed []string `json:"failed,omitempty"`
}

func (st *rolloutState) total() int {
	n := 0
	for _, w := range st.Waves {
		n += len(w.IDs)
	}
	return n
}

func (st *rolloutState) view() RolloutStatus {
	v := RolloutStatus{
		Run: st.Run, State: st.State, Image: st.Image, Total: st.total(), Succeeded: len(st.SucceededIDs), Failed: len(st.FailedIDs),
		FailedIDs: st.FailedIDs, Message: st.Message, BakeSeconds: st.BakeSeconds, StartedAtMs: st.StartedAtMs, UpdatedAtMs: st.UpdatedAtMs,
		RollbackTotal: st.RollbackTotal, Reverted: st.Reverted, RollbackFailedIDs: st.RollbackFailedIDs,
	}
	if v.State == "" {
		v.State = RolloutIdle
	}
	if len(st.Waves) > 0 {
		v.CurrentWave = st.CurrentWave + 1
	}
	for i, w := range st.Waves {
		v.Waves = append(v.Waves, WaveStatus{Index: i + 1, Percentage: w.Percentage, Size: len(w.IDs), Succeeded: w.Succeeded, Failed: w.Failed, State: w.State})
	}
	return v
}

// where is "wave 3/5" for messages.
func (st *rolloutState) where() string {
	return fmt.Sprintf("wave %d/%d", st.CurrentWave+1, len(st.Waves))
}

// rolloutItem is one sentinel to deploy in a launch.
type rolloutItem struct {
	ID    string `json:"id"`
	Image string `json:"image"`
	Key   string `json:"key"`
}

// rolloutJob is one batch of a launch, run by the worker.
type rolloutJob struct {
	Run            string        `json:"run"`
	Launch         int           `json:"launch"`
	Kind           string        `json:"kind"`
	TimeoutSeconds int32         `json:"timeout_seconds,omitempty"`
	Items          []rolloutItem `json:"items"`
}

// batchResult is what the worker reports for one batch.
type batchResult struct {
	Run      string          `json:"run"`
	Launch   int             `json:"launch"`
	Kind     string          `json:"kind"`
	Outcomes []deployOutcome `json:"outcomes"`
}

type deployOutcome struct {
	ID      string `json:"id"`
	Ready   bool   `json:"ready"`
	Message string `json:"message,omitempty"`
}

// startWave is the delayed self-message that starts a wave after a bake.
type startWave struct {
	Run  string `json:"run"`
	Wave int    `json:"wave"`
}

// The rollout's steps.
var (
	rolloutListSentinels = newReadStep(RolloutServiceName, "list-sentinels")
	rolloutNow           = newReadStep(RolloutServiceName, "now")
	rolloutSlack         = newReadStep(RolloutServiceName, "slack")
)

type rollouts struct {
	store *store.Store
	slack *slackClient
	hooks Hooks
}

// NewSentinelRolloutService is the SentinelRolloutService (see the package
// documentation). Its handlers are short: none waits for sentinels, so
// Status (shared) answers at once and Cancel takes effect between waves
// without waiting for one to end.
func NewSentinelRolloutService(d Deps) restate.ServiceDefinition {
	r := &rollouts{store: d.Store, slack: newSlackClient(), hooks: d.Hooks}
	return restate.NewObject(RolloutServiceName, RetryPolicy(), private()).
		Handler("Rollout", restate.NewObjectHandler(r.rollout)).
		Handler("Status", restate.NewObjectSharedHandler(r.status)).
		Handler("Resume", restate.NewObjectHandler(r.resume)).
		Handler("Cancel", restate.NewObjectHandler(r.cancel)).
		Handler("RollbackAll", restate.NewObjectHandler(r.rollbackAll)).
		Handler("StartWave", restate.NewObjectHandler(r.startWave)).
		Handler("BatchDone", restate.NewObjectHandler(r.batchDone))
}

// NewSentinelRolloutWorker is the service whose invocations wait for one
// batch of a launch: it calls SentinelService.Deploy for each sentinel with
// the launch's idempotency key (so it joins the deploy the rollout object
// already sent), collects the results and sends them to BatchDone.
func NewSentinelRolloutWorker(Deps) restate.ServiceDefinition {
	return restate.NewService(RolloutWorkerName, RetryPolicy(), private()).
		Handler("Run", restate.NewServiceHandler(runBatch))
}

func runBatch(ctx restate.Context, job rolloutJob) (restate.Void, error) {
	futs := make([]restate.ResponseFuture[SentinelDeployResult], len(job.Items))
	for i, it := range job.Items {
		futs[i] = restate.Object[SentinelDeployResult](ctx, SentinelServiceName, it.ID, "Deploy").
			RequestFuture(SentinelDeployRequest{Image: it.Image, TimeoutSeconds: job.TimeoutSeconds, KeepStopped: true}, restate.WithIdempotencyKey(it.Key))
	}
	out := batchResult{Run: job.Run, Launch: job.Launch, Kind: job.Kind, Outcomes: make([]deployOutcome, len(job.Items))}
	for i, f := range futs {
		res, err := f.Response()
		o := deployOutcome{ID: job.Items[i].ID}
		switch {
		case err != nil:
			o.Message = err.Error() // the sentinel is gone or stopped, or this wait was cancelled
		case res.Status != ResultReady:
			o.Message = res.Message
		default:
			o.Ready = true
		}
		out.Outcomes[i] = o
	}
	// Sent even after a cancellation: the rollout must learn how the batch
	// ended.
	restate.ObjectSend(ctx, RolloutServiceName, RolloutKey, "BatchDone").Send(out)
	return restate.Void{}, nil
}

func (r *rollouts) load(ctx restate.ObjectSharedContext) (*rolloutState, error) {
	st, err := restate.Get[*rolloutState](ctx, rolloutStateKey)
	if err != nil {
		return nil, err
	}
	if st == nil {
		st = &rolloutState{State: RolloutIdle}
	}
	return st, nil
}

// save stamps the state with the time and stores it.
func (r *rollouts) save(ctx restate.ObjectContext, st *rolloutState) error {
	now, err := runStep(ctx, r.hooks, rolloutNow, func(restate.RunContext) (int64, error) { return time.Now().UnixMilli(), nil })
	if err != nil {
		return err
	}
	if st.StartedAtMs == 0 {
		st.StartedAtMs = now
	}
	st.UpdatedAtMs = now
	restate.Set(ctx, rolloutStateKey, st)
	return nil
}

func (r *rollouts) status(ctx restate.ObjectSharedContext, _ restate.Void) (RolloutStatus, error) {
	st, err := r.load(ctx)
	if err != nil {
		return RolloutStatus{}, err
	}
	return st.view(), nil
}

func precondition(format string, args ...any) error {
	return restate.ToTerminalError(fmt.Errorf(format, args...), restate.WithErrorCode(codePrecondition))
}

// rollout starts a rollout: it lists the sentinels page by page, running
// and stopped, leaves out those already on the image, records every other
// one's current image (what RollbackAll restores), splits them into waves
// and starts the first. A stopped sentinel stays stopped: its deploy
// (KeepStopped) sets its image and is ready at once, so it starts on the
// new image, not on the one it had before the rollout; one stopped while
// the rollout runs stays stopped the same way.
func (r *rollouts) rollout(ctx restate.ObjectContext, req RolloutRequest) (RolloutStatus, error) {
	if err := req.Validate(); err != nil {
		return RolloutStatus{}, restate.ToTerminalError(fmt.Errorf("rollout: %w", err), restate.WithErrorCode(codeInvalid))
	}
	cur, err := r.load(ctx)
	if err != nil {
		return RolloutStatus{}, err
	}
	switch cur.State {
	case RolloutIdle, RolloutCompleted, RolloutCancelled:
	case RolloutInProgress:
		return RolloutStatus{}, precondition("rollout %s of %s is in progress (%s): wait for it to end, or cancel it, before starting another", cur.Run, cur.Image, cur.where())
	case RolloutPaused:
		return RolloutStatus{}, precondition("rollout %s of %s is paused at %s: resume, cancel or roll it back before starting another", cur.Run, cur.Image, cur.where())
	default:
		return RolloutStatus{}, precondition("rollout %s of %s is %s: wait for it to end before starting another", cur.Run, cur.Image, cur.State)
	}
	pcts := req.WavePercentages
	if len(pcts) == 0 {
		pcts = rules.DefaultWavePercentages
	}

	var ids []string
	previous := map[string]string{}
	after, listed := "", 0
	for {
		page, err := runStep(ctx, r.hooks, rolloutListSentinels, func(rc restate.RunContext) ([]store.SentinelImage, error) {
			return r.store.RolloutSentinels(rc, after, rolloutPageSize)
		})
		if err != nil {
			return RolloutStatus{}, err
		}
		for _, s := range page {
			if s.Image != req.Image {
				ids = append(ids, s.ID)
				previous[s.ID] = s.Image
			}
		}
		listed += len(page)
		if len(ids) > MaxRolloutSentinels {
			return RolloutStatus{}, precondition("more than %d sentinels need image %s: one rollout holds at most %d", MaxRolloutSentinels, req.Image, MaxRolloutSentinels)
		}
		if len(page) < rolloutPageSize {
			break
		}
		after = page[len(page)-1].ID
	}

	rnd := restate.Rand(ctx)
	st := &rolloutState{
		Runs: cur.Runs + 1, State: RolloutInProgress, Image: req.Image, PreviousImages: previous,
		SlackWebhookURL: req.SlackWebhookURL, BakeSeconds: req.BakeSeconds, DeployTimeoutSeconds: req.DeployTimeoutSeconds,
	}
	st.Run = fmt.Sprintf("r%d-%06x", st.Runs, rnd.Uint32()&0xffffff)
	for _, w := range rules.ComputeWaves(ids, pcts) {
		st.Waves = append(st.Waves, waveState{Percentage: w.Percentage, IDs: w.IDs, State: WavePending})
	}
	if len(ids) == 0 {
		st.State = RolloutCompleted
		st.Message = fmt.Sprintf("nothing to do: all %d sentinels already have image %s", listed, req.Image)
		if listed == 0 {
			st.Message = "nothing to do: there is no sentinel"
		}
		r.notify(ctx, st, fmt.Sprintf("Sentinel rollout %s of %s: %s.", st.Run, st.Image, st.Message))
		if err := r.save(ctx, st); err != nil {
			return RolloutStatus{}, err
		}
		return st.view(), nil
	}
	sizes := make([]string, len(st.Waves))
	for i, w := range st.Waves {
		sizes[i] = fmt.Sprint(len(w.IDs))
	}
	r.notify(ctx, st, fmt.Sprintf("Sentinel rollout %s started: image %s to %d sentinels in %d waves (%s).",
		st.Run, st.Image, len(ids), len(st.Waves), strings.Join(sizes, ", ")))
	r.launchWave(ctx, st, 0)
	if err := r.save(ctx, st); err != nil {
		return RolloutStatus{}, err
	}
	return st.view(), nil
}

// launchWave starts wave w.
func (r *rollouts) launchWave(ctx restate.ObjectContext, st *rolloutState, w int) {
	st.CurrentWave = w
	wave := &st.Waves[w]
	wave.State = WaveInProgress
	items := make([]rolloutItem, len(wave.IDs))
	for i, id := range wave.IDs {
		items[i] = rolloutItem{ID: id, Image: st.Image}
	}
	st.Message = fmt.Sprintf("%s: deploying %d sentinels", st.where(), len(items))
	r.notify(ctx, st, fmt.Sprintf("Sentinel rollout %s: wave %d/%d started: %d sentinels (up to %d%% of the fleet).",
		st.Run, w+1, len(st.Waves), len(items), wave.Percentage))
	st.Forward = r.launch(ctx, st, launchWave, items)
}

// launch sends SentinelService.Deploy for every item, each with an
// idempotency key of this run and launch, then starts a worker per batch
// that joins those deploys (same keys) and reports to BatchDone.
//
// The deploys are sent from here, an exclusive handler, rather than by the
// workers: so they are queued on each sentinel in the order the rollout
// decided them. A RollbackAll after a Cancel then always lands after the
// forward deploys it reverts, even when a worker has not started yet.
func (r *rollouts) launch(ctx restate.ObjectContext, st *rolloutState, kind string, items []rolloutItem) launchState {
	st.Launches++
	id := st.Launches
	for i := range items {
		items[i].Key = fmt.Sprintf("rollout/%s/%d/%s", st.Run, id, items[i].ID)
		restate.ObjectSend(ctx, SentinelServiceName, items[i].ID, "Deploy").
			Send(SentinelDeployRequest{Image: items[i].Image, TimeoutSeconds: st.DeployTimeoutSeconds, KeepStopped: true}, restate.WithIdempotencyKey(items[i].Key))
	}
	batches := 0
	for b := range slices.Chunk(items, rolloutBatchSize) {
		restate.ServiceSend(ctx, RolloutWorkerName, "Run").
			Send(rolloutJob{Run: st.Run, Launch: id, Kind: kind, TimeoutSeconds: st.DeployTimeoutSeconds, Items: b})
		batches++
	}
	return launchState{ID: id, Kind: kind, Pending: batches}
}

// startWave starts the wave a bake delayed, unless the rollout moved on
// (cancelled, or another run) meanwhile.
func (r *rollouts) startWave(ctx restate.ObjectContext, in startWave) (restate.Void, error) {
	st, err := r.load(ctx)
	if err != nil {
		return restate.Void{}, err
	}
	if st.Run != in.Run || st.State != RolloutInProgress || st.Forward.ID != 0 || in.Wave != st.CurrentWave ||
		in.Wave >= len(st.Waves) || st.Waves[in.Wave].State != WavePending {
		ctx.Log().Info("ignoring a delayed wave start: the rollout moved on", "run", in.Run, "wave", in.Wave+1, "current_run", st.Run, "state", st.State)
		return restate.Void{}, nil
	}
	r.launchWave(ctx, st, in.Wave)
	return restate.Void{}, r.save(ctx, st)
}

// batchDone records one batch's results and, once the launch's last batch
// is in, decides what comes next.
func (r *rollouts) batchDone(ctx restate.ObjectContext, in batchResult) (restate.Void, error) {
	st, err := r.load(ctx)
	if err != nil {
		return restate.Void{}, err
	}
	l := &st.Forward
	if in.Kind == launchRollback {
		l = &st.Rollback
	}
	if st.Run != in.Run || l.ID != in.Launch || l.Pending == 0 {
		ctx.Log().Info("ignoring results of a launch that is no longer current", "run", in.Run, "launch", in.Launch, "current_run", st.Run)
		return restate.Void{}, nil
	}
	if in.Kind == launchRollback {
		for _, o := range in.Outcomes {
			if o.Ready {
				st.Reverted++
			} else {
				st.RollbackFailedIDs = append(st.RollbackFailedIDs, o.ID)
				l.Failed = append(l.Failed, o.ID)
			}
		}
	} else {
		st.record(in.Outcomes, l)
	}
	if l.Pending--; l.Pending > 0 {
		return restate.Void{}, r.save(ctx, st)
	}
	failed := l.Failed
	*l = launchState{}
	st.settleWaves()
	if in.Kind == launchRollback {
		st.State = RolloutCancelled
		st.Message = fmt.Sprintf("rolled back: %d of %d touched sentinels are on their previous image again", st.Reverted, st.RollbackTotal)
		if len(failed) > 0 {
			st.Message += fmt.Sprintf("; %d failed: %s", len(failed), listIDs(failed))
		}
		r.notify(ctx, st, fmt.Sprintf("Sentinel rollout %s: rollback completed: %s.", st.Run, st.Message))
		return restate.Void{}, r.save(ctx, st)
	}
	if st.State != RolloutInProgress {
		// Cancelled (or rolling back) while the wave ran: its results are
		// recorded, nothing follows.
		return restate.Void{}, r.save(ctx, st)
	}
	if len(failed) > 0 {
		st.State = RolloutPaused
		wave := st.Waves[st.CurrentWave]
		st.Message = fmt.Sprintf("paused at %s: %d sentinels failed (%s); resume (moving past them, or retrying them), cancel, or roll back",
			st.where(), len(failed), listIDs(failed))
		r.notify(ctx, st, fmt.Sprintf("Sentinel rollout %s paused: wave %d/%d: %d of %d sentinels ready, %d failed: %s.",
			st.Run, st.CurrentWave+1, len(st.Waves), wave.Succeeded, len(wave.IDs), len(failed), listIDs(failed)))
		return restate.Void{}, r.save(ctx, st)
	}
	wave := st.Waves[st.CurrentWave]
	if in.Kind == launchRetry {
		r.notify(ctx, st, fmt.Sprintf("Sentinel rollout %s: every retried sentinel is ready on %s.", st.Run, st.Image))
	} else {
		r.notify(ctx, st, fmt.Sprintf("Sentinel rollout %s: wave %d/%d completed: %d sentinels ready on %s.",
			st.Run, st.CurrentWave+1, len(st.Waves), wave.Succeeded, st.Image))
	}
	r.advance(ctx, st, true)
	return restate.Void{}, r.save(ctx, st)
}

// record applies a wave's or a retry's outcomes: a ready sentinel counts
// as succeeded (and leaves the failed list), a failed one as failed.
func (st *rolloutState) record(outcomes []deployOutcome, l *launchState) {
	waveOf := make(map[string]int, st.total())
	for i, w := range st.Waves {
		for _, id := range w.IDs {
			waveOf[id] = i
		}
	}
	failed := make(map[string]bool, len(st.FailedIDs))
	for _, id := range st.FailedIDs {
		failed[id] = true
	}
	for _, o := range outcomes {
		w := &st.Waves[waveOf[o.ID]]
		switch {
		case o.Ready:
			if failed[o.ID] { // a retry that worked
				delete(failed, o.ID)
				st.FailedIDs = slices.DeleteFunc(st.FailedIDs, func(id string) bool { return id == o.ID })
				w.Failed--
			}
			st.SucceededIDs = append(st.SucceededIDs, o.ID)
			w.Succeeded++
		default:
			l.Failed = append(l.Failed, o.ID)
			if !failed[o.ID] {
				failed[o.ID] = true
				st.FailedIDs = append(st.FailedIDs, o.ID)
				w.Failed++
			}
		}
	}
}

// settleWaves gives every wave whose sentinels all have a result its final
// state: failed when any of them failed, else completed.
func (st *rolloutState) settleWaves() {
	for i := range st.Waves {
		w := &st.Waves[i]
		if w.State == WavePending || w.State == WaveSkipped || w.Succeeded+w.Failed < len(w.IDs) {
			continue
		}
		if w.Failed > 0 {
			w.State = WaveFailed
		} else {
			w.State = WaveCompleted
		}
	}
}

// advance moves past the current wave: completed after the last one,
// otherwise the next wave, after the bake time when bake is set.
func (r *rollouts) advance(ctx restate.ObjectContext, st *rolloutState, bake bool) {
	next := st.CurrentWave + 1
	if next >= len(st.Waves) {
		st.State = RolloutCompleted
		st.Message = fmt.Sprintf("completed: %d of %d sentinels on %s", len(st.SucceededIDs), st.total(), st.Image)
		if len(st.FailedIDs) > 0 {
			st.Message += fmt.Sprintf("; %d failed: %s", len(st.FailedIDs), listIDs(st.FailedIDs))
		}
		r.notify(ctx, st, fmt.Sprintf("Sentinel rollout %s %s.", st.Run, st.Message))
		return
	}
	if bake && st.BakeSeconds > 0 {
		st.CurrentWave = next
		st.Message = fmt.Sprintf("baking %ds before wave %d/%d", st.BakeSeconds, next+1, len(st.Waves))
		restate.ObjectSend(ctx, RolloutServiceName, RolloutKey, "StartWave").
			Send(startWave{Run: st.Run, Wave: next}, restate.WithDelay(time.Duration(st.BakeSeconds)*time.Second))
		return
	}
	r.launchWave(ctx, st, next)
}

// resume continues a paused rollout: past the failed wave, or, with
// RetryFailed, by deploying every failed sentinel again first.
func (r *rollouts) resume(ctx restate.ObjectContext, req ResumeRequest) (RolloutStatus, error) {
	st, err := r.load(ctx)
	if err != nil {
		return RolloutStatus{}, err
	}
	if st.State != RolloutPaused {
		return RolloutStatus{}, precondition("only a paused rollout can be resumed; rollout %s is %s", orNone(st.Run), st.State)
	}
	st.State = RolloutInProgress
	if req.RetryFailed && len(st.FailedIDs) > 0 {
		items := make([]rolloutItem, len(st.FailedIDs))
		for i, id := range st.FailedIDs {
			items[i] = rolloutItem{ID: id, Image: st.Image}
		}
		st.Message = fmt.Sprintf("%s: retrying %d failed sentinels", st.where(), len(items))
		r.notify(ctx, st, fmt.Sprintf("Sentinel rollout %s resumed: retrying %d failed sentinels: %s.", st.Run, len(items), listIDs(st.FailedIDs)))
		st.Forward = r.launch(ctx, st, launchRetry, items)
	} else {
		r.notify(ctx, st, fmt.Sprintf("Sentinel rollout %s resumed after wave %d/%d; its %d failed sentinels are left as they are.",
			st.Run, st.CurrentWave+1, len(st.Waves), st.Waves[st.CurrentWave].Failed))
		r.advance(ctx, st, false)
	}
	if err := r.save(ctx, st); err != nil {
		return RolloutStatus{}, err
	}
	return st.view(), nil
}

// cancel stops a rollout: no further wave starts. Deploys already sent
// finish (their results are still recorded); sentinels keep whatever image
// they reach. A rollback that does not end (its deploys wait for clusters
// that never report, or are paused in Restate) is cancelled too, so it
// cannot hold the singleton for good: see cancelRollback.
func (r *rollouts) cancel(ctx restate.ObjectContext, _ restate.Void) (RolloutStatus, error) {
	st, err := r.load(ctx)
	if err != nil {
		return RolloutStatus{}, err
	}
	switch st.State {
	case RolloutInProgress, RolloutPaused:
	case RolloutRollingBack:
		return r.cancelRollback(ctx, st)
	default:
		return RolloutStatus{}, precondition("only a rollout in progress, paused or rolling back can be cancelled; rollout %s is %s", orNone(st.Run), st.State)
	}
	st.State = RolloutCancelled
	for i := range st.Waves {
		if st.Waves[i].State == WavePending {
			st.Waves[i].State = WaveSkipped
		}
	}
	st.Message = fmt.Sprintf("cancelled at %s", st.where())
	if st.Forward.ID != 0 {
		st.Message += "; the deploys of the wave in flight finish on their own"
	}
	r.notify(ctx, st, fmt.Sprintf("Sentinel rollout %s cancelled at wave %d/%d: %d sentinels on %s, %d failed.",
		st.Run, st.CurrentWave+1, len(st.Waves), len(st.SucceededIDs), st.Image, len(st.FailedIDs)))
	if err := r.save(ctx, st); err != nil {
		return RolloutStatus{}, err
	}
	return st.view(), nil
}

// cancelRollback ends a rollback before its last result is in: the
// rollout is cancelled at once and says which touched sentinels are back,
// which failed and how many were not reverted yet. Their deploys are not
// stopped (they finish, or time out, on their own); results that come in
// later are ignored, and a new rollout or RollbackAll may start.
func (r *rollouts) cancelRollback(ctx restate.ObjectContext, st *rolloutState) (RolloutStatus, error) {
	pending := st.RollbackTotal - st.Reverted - len(st.RollbackFailedIDs)
	st.State = RolloutCancelled
	st.Rollback = launchState{}
	st.Message = fmt.Sprintf("rollback cancelled: %d of %d touched sentinels are on their previous image again, %d failed, %d not reverted yet (their deploys finish on their own; RollbackAll starts a new rollback)",
		st.Reverted, st.RollbackTotal, len(st.RollbackFailedIDs), pending)
	if len(st.RollbackFailedIDs) > 0 {
		st.Message += "; failed: " + listIDs(st.RollbackFailedIDs)
	}
	r.notify(ctx, st, fmt.Sprintf("Sentinel rollout %s: %s.", st.Run, st.Message))
	if err := r.save(ctx, st); err != nil {
		return RolloutStatus{}, err
	}
	return st.view(), nil
}

// rollbackAll deploys every touched sentinel (every sentinel of a wave
// that started, failed ones included: their desired image changed too)
// back to the image it had when the rollout started. The rollout is
// rolling_back until the last result is in, then cancelled.
func (r *rollouts) rollbackAll(ctx restate.ObjectContext, _ restate.Void) (RolloutStatus, error) {
	st, err := r.load(ctx)
	if err != nil {
		return RolloutStatus{}, err
	}
	if st.State != RolloutPaused && st.State != RolloutCancelled {
		return RolloutStatus{}, precondition("only a paused or cancelled rollout can be rolled back; rollout %s is %s", orNone(st.Run), st.State)
	}
	var items []rolloutItem
	for _, w := range st.Waves {
		if w.State == WavePending || w.State == WaveSkipped {
			continue
		}
		for _, id := range w.IDs {
			items = append(items, rolloutItem{ID: id, Image: st.PreviousImages[id]})
		}
	}
	st.RollbackTotal, st.Reverted, st.RollbackFailedIDs = len(items), 0, nil
	for i := range st.Waves {
		if st.Waves[i].State == WavePending {
			st.Waves[i].State = WaveSkipped
		}
	}
	if len(items) == 0 {
		st.State = RolloutCancelled
		st.Message = "rolled back: no sentinel had been touched"
		r.notify(ctx, st, fmt.Sprintf("Sentinel rollout %s: %s.", st.Run, st.Message))
	} else {
		st.State = RolloutRollingBack
		st.Message = fmt.Sprintf("rolling back %d touched sentinels to their previous images", len(items))
		r.notify(ctx, st, fmt.Sprintf("Sentinel rollout %s: rollback started: %d touched sentinels go back to their previous images.", st.Run, len(items)))
		st.Rollback = r.launch(ctx, st, launchRollback, items)
	}
	if err := r.save(ctx, st); err != nil {
		return RolloutStatus{}, err
	}
	return st.view(), nil
}

// listIDs names up to five ids.
func listIDs(ids []string) string {
	if len(ids) <= 5 {
		return strings.Join(ids, ", ")
	}
	return strings.Join(ids[:5], ", ") + fmt.Sprintf(" and %d more", len(ids)-5)
}

func orNone(run string) string {
	if run == "" {
		return "(none yet)"
	}
	return run
}
