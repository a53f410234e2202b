// Package workflows is ctrl's durable side, run by Restate: the handlers
// of the VersioningService, the DeployWorkflow, the SentinelService, the
// SentinelRolloutService and its worker, and CtrlIngress. The rest lives
// by concern: the endpoint Restate calls them on and its registration in
// ctrl/restateendpoint, the signed ingress client ctrl calls them with in
// ctrl/restateingress, the loops Restate does not run (the Notifier that
// wakes deploys when clusters report, the sentinel sweeper) in
// ctrl/background, and the rules the handlers apply (when a deploy is
// decided, how a rollout cuts its waves, when a sentinel has converged) in
// ctrl/rules. The deploy metrics (metrics.go) stay here: they are the
// handlers' own instrumentation, counted only inside the Run body whose
// compare-and-set moved a row, which no other package sees.
//
// # VersioningService: exactly-once versions, no lost change
//
// Invariant 1 ("no lost change") is kept by the store's lock-ordered
// stamping (ctrl/store, package documentation): a version is assigned
// only while the stamping transaction holds the version_seq row lock, which
// it keeps until COMMIT, so commit order equals version order and a reader
// that sees version M sees every version below M. That holds for every
// writer, in every ctrl process, whether or not it goes through Restate.
//
// What the VersioningService adds is exactly-once numbering for steps that
// Restate may run twice. Stamp(refs) is one restate.Run around
// store.StampCommitted(refs, grantKey) with the invocation id as grantKey:
// the grant (first and last version) is recorded in version_grants in the
// same transaction as the stamps. If the Run body runs again (ctrl or
// Restate crashed after the commit and before Restate journaled the
// result), StampCommitted finds the grant and returns the same versions
// without stamping: no duplicate, and no gap from a rolled-back second
// attempt (a rollback also returns its numbers). Callers inside Restate
// call Stamp with restate.Object(...).Request, which is journaled, so the
// call itself happens once; callers outside use an idempotency key.
//
// It is a virtual object with the single key "singleton" and an exclusive
// handler, so stamps are also serialised in Restate; the database lock is
// what makes them correct. A shared handler would be correct too and
// about twice as fast for single-ref calls, but under a burst every
// concurrent call would hold a database connection while it queues for the
// version_seq lock, starving the pool the watch streams share; exclusive,
// the versioning path holds at most one. Throughput comes from batching
// instead: a deploy to N regions stamps N rows in one call, one Restate
// round trip and one transaction for the lot.
//
// An exclusive singleton has one weakness: an invocation of it that does
// not end (paused by Restate after its retries, or stuck) holds every Stamp
// queued behind it. So a deploy waits for the VersioningService at most a
// minute; then it cancels its queued call and stamps its rows itself, in a
// step of its own with its own grant key (still exactly once, still in
// version order: the database lock orders versions), notes that in the
// deployment's history (`ctrl deploy get`) and counts it in
// krane_ctrl_versioning_bypassed_total.
//
// # DeployWorkflow
//
// A Restate workflow keyed by the deployment id. Run:
//
//  1. validates the request (a terminal error, code 400, and the deployment
//     marked failed, for bad input);
//  2. ensures the deployment row exists (insert if absent; the API created
//     it already) and stops unless it is pending;
//  3. resolves the target regions: the request's, each of which must have a
//     registered cluster, or every region with one;
//  4. pending -> deploying;
//  5. writes every region's topology row (desired replicas, running) as
//     content, then stamps all of them with ONE VersioningService call;
//  6. ensures the environment has a sentinel per region (insert and version
//     in one transaction; an existing sentinel is never upgraded, a stopped
//     one is set running again), configured from sentinel.default_*;
//  7. waits, still deploying, for the sentinels it created or set running
//     again, and for any sentinel of the environment that has not been
//     ready yet while the environment has no live deployment (another
//     deploy created it and may still wait; this one could otherwise go
//     live first with nothing to route through). A sentinel that is ready,
//     or that serves a live deployment, is not waited for: a failed fleet
//     rollout must not hold every deploy of its environments. The wait is
//     SentinelService.Deploy with an empty request (change nothing, return
//     once converged), one call per sentinel in parallel, each bounded by
//     sentinel.deploy_timeout; the history notes "waiting for sentinel S in
//     region R" and "sentinel S ready in region R". A sentinel that fails
//     (its timeout, a permanent apply error, stopped or cancelled) fails
//     the deploy with its reason, and the failure path below runs; the
//     sentinel stays for the next deploy (or the idle sweep, see
//     SentinelSweeper). The outcome promise is raced along, so a failed
//     instance or an operator's stop ends the wait at once. The deploy's
//     own timeout starts after this wait;
//  8. deploying -> network;
//  9. waits for readiness: every region with at least its desired replicas
//     running (as clusters report them in instances). A failed instance, or
//     a permanent apply error of the deployment, fails it at once with the
//     region, the pods and their reasons, or the cluster's own message.
//     The wait is a workflow promise resolved by Notify (shared handler),
//     which ctrl calls after a report decides the deploy; a promise keeps a
//     value resolved before anyone waits, so no wake-up is lost, and a
//     database check right after taking the promise covers reports that
//     came before ctrl could notify. restate.WaitFirst races it against the
//     deploy's timeout (request timeout_seconds, else deploy.timeout);
//  10. ready: network -> ready and, in the same transaction, the deployment
//     becomes its environment's live one when the environment has none, or
//     when it is a rollback; otherwise it waits for an explicit Promote.
//     Failed or timed out: the topology is soft-deleted (stopped, new
//     versions through the VersioningService) and the deployment marked
//     failed with the reason.
//
// Every status change is a compare-and-set in SQL with a history entry
// (deployment_events), so a step run twice, or a late step after an
// operator stopped the deployment, changes nothing. A status step run
// twice finds the row at its target already: the workflow reads that as
// done (its own earlier run), not as someone else's move. StopDeployment
// notifies the workflow, which then ends without touching the row.
//
// Determinism: handler code outside restate.Run reads no clock, database,
// configuration or randomness (ids come from restate.Rand), and decides
// call order from sorted slices, never from map iteration. Each Run body is
// idempotent because it may run twice: every Run of every service goes
// through runStep with a Step declared by newStep (it commits to the
// database) or newReadStep (it writes nothing; Steps lists them all), and
// the crash-point suite (TestCrashPoints) runs each one twice, and answers
// each commit of each newStep step "bad connection" once, and expects the
// same result and database as an uninterrupted run; a newReadStep step's
// re-run is also checked by the result it journaled (an evaluation may see
// reports that arrived meanwhile). A new step is covered by that suite as
// soon as a scenario reaches it, and fails it until one does; a newStep
// step in which no scenario commits fails it too, by name, and so does a
// newReadStep step that commits.
//
// # SentinelService: one sentinel's convergence
//
// A virtual object keyed by sentinel id. Deploy (exclusive) merges the
// request over the row under a row lock, writes the configuration and a
// new version in one transaction with deploy_status = progressing owned by
// the invocation (deploy_request), and waits, on an awakeable stored under
// "notify_ready_awakeable", until the cluster reports the sentinel healthy
// on the image at that version (rules.SentinelConverged), a permanent apply error
// fails it, or the timeout (sentinel.deploy_timeout, or the request's). The
// Notifier calls NotifyReady or NotifyFailed (shared) for the owner; a
// fence step and a database check after storing the awakeable close the
// window in which a report would find no awakeable (see deploy in
// sentinel.go). Ready and failed are compare-and-sets on the owner, so a
// late step never overwrites a newer deploy. No rollback of one sentinel.
// A Deploy of a stopped sentinel sets it running again, unless it says
// KeepStopped (fleet rollouts): then it only sets the configuration, which
// the sentinel starts on, and is ready at once.
//
// Sentinels end by a soft delete (store.StopSentinel: desired_state
// stopped at a new version, the row stays): through the operator API's
// StopSentinel, or by the SentinelSweeper, which every ctrl runs and which
// stops a sentinel its environment has not needed for
// sentinel.idle_stop_after (no live deployment in its region, no deploy in
// progress). The next deploy of the environment starts it again.
//
// # SentinelRolloutService: fleet rollouts
//
// A virtual object keyed "singleton", its state under "rollout". Rollout
// lists the sentinels in pages, running and stopped (a stopped one keeps
// stopped and gets the image, so it starts on it; see KeepStopped),
// records the previous image of each one to change, splits them into waves by cumulative percentage
// (ComputeWaves) and launches the first. A launch sends every
// SentinelService.Deploy of the wave from the exclusive handler, each with
// an idempotency key of the run and launch, and starts a
// SentinelRolloutWorker invocation per batch of 100, which joins those
// deploys by the same keys, waits for them and reports to BatchDone (a short
// exclusive handler). So no handler of the singleton waits for sentinels:
// Status (shared) answers at once, Cancel takes effect before the next
// wave, and every invocation's journal is bounded by a batch or a wave. A
// wave with a failure pauses; all ready: the next wave, after bake_seconds
// (a delayed StartWave). Resume moves past the failed wave or retries the
// failed sentinels; RollbackAll deploys every sentinel of a wave that
// started (failed ones included) back to its previous image; Cancel also
// ends a rollback that does not end, so no stuck deploy holds the
// singleton for good. Transitions
// are posted to Slack in order, in a Run with bounded retries; a webhook
// failure never fails the rollout.
//
// # Observability: metrics and one trace per deploy, despite replays
//
// Restate runs a handler's code again on every replay and may run a Run
// body twice, so nothing is counted or traced in handler code. Metrics
// (metrics.go) are counted in the Run body of a status change, only when
// its compare-and-set moved the row. A deploy's trace (tracing.go, and
// ctrl/deploytrace for the span tree) has ids derived from the deployment
// id and spans created with explicit start and end times inside the Run
// body that did the work: topology.create in the topology step,
// events.emit in the VersioningService's stamp step unless it found its
// grant recorded already, workflow and status.poll in the step that moved
// the deployment to ready or failed. The watch streams attach the
// events.emit span's context to the deployment's changes while the deploy
// is in progress, so each cluster's apply continues the trace with nothing
// stored.
//
// # Who may call: CtrlIngress and request identity
//
// Every service above is private to Restate's ingress: only other handlers
// call it. ctrl's own calls from outside Restate (the operators' APIs, the
// Notifier) go through CtrlIngress.Call, the one public handler, which
// forwards to the private handler a call names after checking its
// signature, an HMAC with a key every ctrl replica shares through the
// database (see GatewayName). And with restate.identity_keys the endpoint
// answers only requests Restate signed, so nobody reaches the handlers by
// going around Restate either.
//
// # Failures
//
// See RetryPolicy: infrastructure errors are retried for about two hours,
// then the invocation pauses (and ctrl's resync reports it as overdue);
// impossible input is a terminal error with a code that is never 409
// (Restate's code for cancellation). Cancelling a deploy's invocation in
// Restate fails the deployment and cleans up its topology.
//
// # Upgrading ctrl
//
// Restate pins an invocation to the deployment (endpoint URL) it started
// on. restateendpoint.Register re-registers a known URL with force only when the handlers
// differ or another deployment took over one of the services; an in-place
// upgrade then replays in-flight invocations on the new code. A change to a
// handler's sequence of steps therefore breaks the invocations in flight
// across the upgrade (Restate stops them with a journal mismatch): such a
// release says so in docs/operating.md ("Upgrades"; the release in which
// deploys began to wait for their sentinels is one), and is installed when
// none is in flight or with a new endpoint URL, keeping the old ctrl until
// its invocations drain.
//
// # Adding a service
//
// Write the service in its own file with a constructor taking Deps, add it
// to the services declaration (services.go) and to ctrl/doc.go, and `ctrl serve` serves and registers it on the next start
// (restateendpoint.Register sees new handlers and re-registers with force).
package workflows
