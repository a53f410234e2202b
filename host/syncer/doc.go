// Package syncer runs one sync loop per resource kind: it streams desired
// state from ctrl, applies it through the kind's plugin, garbage-collects
// after a complete bootstrap, and resyncs periodically.
//
// A loop runs one session per plugin instance. A session starts with a
// bootstrap from version 0 (a restarted plugin has lost nothing in the
// cluster, but the host no longer knows what it finished), then follows
// the Watch stream, reconnecting from its committed cursor.
//
// # Invariants
//
// The numbers are those of Krane's invariants; the README states them as
// promises. Each has a test that fails without it.
//
//  2. Per-object order. The queue runs at most one apply per object and
//     hands out only a change newer than the one last applied or parked
//     for it, so a stale apply never undoes a newer one, not even for a
//     change a resumed stream replays (TestQueueOrdersPerObjectAndCoalesces,
//     TestQueueForgetsNothingAStreamMayReplay, TestLoopRandomized).
//     Different objects apply in parallel, Options.Workers at a time.
//  3. One bad object blocks nothing. A permanent failure, or a retryable
//     one after Options.MaxAttempts, is reported upstream and parked. A
//     parked object never counts against the stream's read-ahead
//     (Options.MaxPending), and a change of an object the queue holds never
//     waits for it (TestLoopParkedObjectsDoNotStallTheStream). A parked
//     change is retried after its park backoff, at every resync
//     (TestLoopResyncRetriesParkedObjects), and whenever a newer version
//     arrives, which replaces it. A reported failure is cleared when the
//     object is applied or desired state no longer names it
//     (TestLoopClearsFailuresOfObjectsNoLongerDesired).
//  4. Cursor meaning. The committed cursor V means: every stream change
//     <= V is applied or parked. A change that a resync's repair carries
//     waits for that repair (TestQueueCursorWaitsForAPendingRepair); an
//     apply cut short by the session's end has no outcome
//     (TestLoopCursorStaysHonestWhenASessionEnds). Resuming from V is
//     safe; a bootstrap from 0 always is. V is only meaningful in the
//     history of ctrl's database that gave it (its generation, stated by
//     the stream): when ctrl refuses it (OUT_OF_RANGE: the database was
//     restored or failed over), the session ends and a new one, with a
//     queue of its own, bootstraps again; its garbage collection does not
//     let the old history's versions keep an object
//     (TestLoopBootstrapsAgainAfterCtrlsDatabaseWentBack).
//  5. Safe GC. Deletion happens only after an explicit BootstrapComplete
//     (or a complete resync listing), only of what the plugin's inventory
//     holds (objects with Krane's label), never of an object applied at a
//     version newer than the snapshot, and never of more than a fraction
//     of the inventory in one pass unless overridden (GCOptions;
//     TestLoopBootstrap here, TestGCBrake in host/agent).
//  6. Drift is corrected. Every Options.ResyncInterval the loop lists
//     desired state and re-applies it; plugins answer Unchanged without a
//     write when nothing drifted (TestSyncEndToEnd in host/agent).
//
// And what keeps the loop itself healthy:
//
//   - Bounded memory. The queue forgets an object once it is finished at
//     or below both the cursor read before a resync's listing and what the
//     current stream has delivered (queue.Forget says why that is safe);
//     it does so at every resync (TestLoopForgetsFinishedObjects).
//   - No stuck stream. A Watch stream silent for Options.StreamTimeout (no
//     change, not even a keep-alive) is torn down and resumed from the
//     cursor; a silent resync listing is abandoned, and a resync pass lasts
//     at most one interval (TestLoopTearsDownASilentStream).
//   - No leak. A resync releases its listing (TestLoopResyncReleasesItsStream)
//     and a session waits for every goroutine it started
//     (TestLoopRandomized checks with goleak).
package syncer
