// Package store is ctrl's MySQL access: the schema (embedded goose
// migrations), the version stamping that keeps invariant 1 ("no lost
// change"), the reads the ClusterService streams from, status reports,
// clusters and API tokens. SQL here is valid on MySQL 8 and MariaDB 10.11.
//
// # Versions
//
// Every desired-state row (a deployment's topology in one region, a sentinel,
// a Cilium network policy, a row of the generic resources table) carries a
// version. Versions come from one global sequence shared by all kinds and
// regions (table version_seq, a single row), so they are strictly increasing
// across the whole control plane, and each version names exactly one row at
// a time. Agents keep one cursor per kind and ask for "everything in my
// region with version > cursor".
//
// # Design: lock-ordered commit
//
// The only code that assigns versions is stamping, run as the LAST step of
// a write transaction ([Store.WriteTx], [Store.StampCommitted]):
//
//  0. lock every touched row (SELECT ... FOR UPDATE on the primary key), so
//     a missing row fails early and row locks are always taken before the
//     version_seq lock (one global lock order, no lock cycles through it);
//  1. SELECT head FROM version_seq WHERE id = 1 FOR UPDATE
//     (an exclusive row lock, held until COMMIT or ROLLBACK);
//  2. give the touched rows head+1 .. head+n, in the order they were
//     touched, with a monotonic guard: every locked row's version is below
//     the one it gets (checked on the versions step 0 read, and again in
//     the UPDATE's WHERE; a row that does not match is an error and aborts
//     the transaction);
//  3. raise change_heads(region, kind) to the highest version given to that
//     pair (the head poller's cheap "did anything change" check);
//  4. UPDATE version_seq SET head = head + n;
//  5. COMMIT.
//
// # Group commit
//
// Concurrent WriteTx calls share transactions (groupcommit.go): one
// transaction runs the callers' functions one after another, each inside
// its own SAVEPOINT (a caller whose function fails is rolled back to it,
// and answered with its own error once the batch's fate is known: that
// error may rest on what the callers before it wrote), then runs steps 0
// to 5 once for the rows of every caller kept, in caller order, and
// answers each caller with the versions of its own rows. A caller whose
// statement waited for a row lock longer than the batch's bound (1205), or
// was a deadlock's victim (1213), leaves the batch and runs alone; the
// server's error decides, whatever the caller's function made of it. A row touched by two callers of one batch gets
// two versions and keeps the later; the earlier is superseded inside the
// transaction that gave it, so no reader ever sees it. When the
// transaction fails as a whole before COMMIT (a deadlock, a missing row,
// a lost connection) it rolls back entirely, head update included, and
// its callers run again (as a batch after a deadlock, else each alone).
//
// Some writes are kept instead of sent at once (deferred.go): a scale's
// UPDATEs and history entries. A caller's kept writes join the batch's
// only if its function succeeds (else they are dropped, never sent); the
// batch sends them, one multi-row statement per table, after the last
// caller's function and before step 0; and a Tx sends whatever is kept
// before any statement that could read it, so every function reads what
// it would have read had each write been sent at once. A caller takes its
// savepoint before its first write sent, so a caller that sent none has
// nothing to roll back. For the argument below nothing changes: every
// content write of the transaction is sent before step 0, and a failure
// to send aborts the whole transaction, as any failure before COMMIT
// does.
//
// Rows are never hard-deleted on this path: a delete is a new version whose
// row says deleted (a stopped topology, a stopped sentinel, deleted = TRUE).
//
// # Why a cursor never skips a change
//
// Claim: when a reader's statement sees a row with version M, it also sees
// every row that is or ever will be stamped with a version v < M (or the row
// it has become since, stamped with a higher version).
//
// Proof. Let T(v) be the transaction that stamped v (with group commit, the
// batch transaction that stamped v among the versions of all its callers;
// nothing below depends on how many callers or versions one transaction
// carries). T(v) read head = h < v under the exclusive lock on version_seq
// and held that lock until it committed. If T(M) = T(v), the two versions
// commit atomically and every read view sees both or neither. Otherwise the
// two held the lock one after the other. Had T(M) held it first, it would
// have committed head >= M before T(v) read head, and T(v) would have given
// versions above M, not v < M. So T(v) held it first and released it only
// by committing (a rollback also rolls back its head update, so v would be
// handed out again and never seen as a gap). Hence T(v) committed before
// T(M) took the lock, before T(M) committed. A consistent read (InnoDB read
// view, REPEATABLE READ or READ COMMITTED) that includes T(M)'s commit
// includes every transaction committed before it, so it includes T(v). The guard in step 2 makes a row's version
// only ever grow, so "the row stamped v" is visible either with version v or
// with a later version of the same object.
//
// A watch query "version > c ORDER BY version LIMIT n" therefore returns a
// gap-free prefix of all versions > c that will ever exist for the (region,
// kind) (minus versions since superseded by a newer stamp of the same row,
// which the reader sees at their newer version), and setting the cursor to
// the last version returned can never jump over a change that commits later.
// Commit order equals version order for every writer in every ctrl process,
// because the lock lives in the database, not in a process.
//
// Bootstrap reads head H and then the rows with version <= H in one
// read-only snapshot transaction; by the same argument the snapshot holds
// every version <= H, so continuing the stream from H is gap-free too.
//
// A caller rolled back to its savepoint (or that sent no write, its kept
// writes dropped) touched nothing that is stamped: its rows are not in
// steps 0 to 4, and its writes are undone before COMMIT.
// A caller kept in the batch is answered only after COMMIT, with exactly the
// versions step 2 gave its rows. So each caller's versions are as visible,
// and as ordered, as if its call had been a transaction of its own that
// committed at the batch's commit.
//
// Cost: stamping serialises writers for the few statements between step 1
// and COMMIT. Writers do their content work first, unserialised, and stamp
// last; a batch pays steps 1 to 5 once for all its callers (one statement
// per table for steps 0 and 2, one for step 3), so under load the lock is
// held, and the log flushed, once per batch instead of once per write.
//
// [Store.StampCommitted] stamps rows whose content another transaction has
// already committed (for example a Restate step): content becomes visible
// before its version does, which is harmless — a reader sees the newer
// content at the old version, then the new version with the same content.
// It records the grant under a key (the Restate invocation id) in the same
// transaction, so a retried step gets the same versions back instead of new
// ones (exactly-once).
//
// # The assumption: the database does not go back in time
//
// The proof holds for one history of commits: a version, once committed,
// stays committed. A database restored from a backup, or a failover to an
// asynchronous replica that had not received the last commits, breaks
// that: the head goes back, versions at or below the cursors krane hosts
// hold are issued again to other changes, and a cursor would skip them
// (the loss the proof rules out). ctrl therefore names each history with
// a generation (generation.go, table db_generation): written when the
// schema is created, replaced by `ctrl admin db restored`, and replaced by ctrl
// itself when the cursors of several clusters are ahead of the head (the
// database went back, visibly; one cluster's cursor ahead is refused and
// recorded in cursor_claims but moves no one else, since a token or a host
// restored from an old backup could claim it: CheckCursor, rate-limited).
// Every stream states its generation (BootstrapComplete,
// KeepAlive), and a stream resuming from a cursor ahead of the head or of
// another generation is refused with OUT_OF_RANGE before the cursor is
// believed or anchors a shared feed ([Store.CheckCursor]); krane then
// bootstraps that kind again (it applies what the database holds and
// garbage-collects what it does not, under the usual brake, ignoring the
// versions of the old history its objects carry) and streams from the new
// head. What ctrl cannot see on its own is a database that went back and
// was then written past the old cursors before any host reconnected: that
// is why the restore and failover procedures (docs/operating.md) run
// `ctrl admin db restored` before ctrl serves again.
//
// # Deploy lifecycle
//
// deploys.go holds what the deploy workflow and the operators' API need:
// creating a deployment (with its idempotency key), status changes as
// compare-and-set with a history (deployment_events), topology content
// written without a version for the VersioningService to stamp
// (PutTopologyContent, StopTopology), sentinels ensured per environment and
// region (EnsureSentinels), per-region state with instances and apply
// errors (RegionStates), and each environment's live deployment
// (environments).
//
// # Actual state
//
// What clusters report lives apart from the desired state: one row per
// (object, cluster) in object_reports (version, observation time, deleted,
// status as JSON), instances per (deployment, region, cluster) in
// instances, apply errors per (object, cluster) in apply_errors. Ingest
// stores the reports of many clusters in one transaction (reports.go): it
// reads the desired versions without locks, takes the
// reporting clusters' rows in share mode (RemoveCluster takes them
// exclusively, so a removal and a batch are ordered), locks only the
// reports' own rows, and writes multi-row statements of at most 4 MiB. A
// report older than its cluster's stored one is dropped, one equal to it
// writes nothing, and one that applies an object's delete prunes the
// cluster's rows of it. Readers get a region's view through rollUp
// (actualstate.go), the one place that applies ctrl/actual's rule.
//
// # Kinds
//
// A registry maps each kind to its table, key columns and row conversion:
// "deployment" reads deployment_topology joined with deployments, "sentinel"
// reads sentinels, "ciliumnetworkpolicy" reads cilium_network_policies, and
// every other kind reads the generic resources table, whose spec is JSON sent
// as a google.protobuf.Struct. A new kind needs no change here.
//
// objects.go is the resource API's side (ctrl/resourceapi): kinds
// registered with the JSON Schema of their spec (resource_kinds), and
// objects, each a spec desired in a set of regions, put and deleted inside
// WriteTx like every other desired-state write, so an operator never
// writes a row (or a version) by hand.
package store
