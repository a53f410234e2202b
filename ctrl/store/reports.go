package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	clusterv1 "krane.dev/proto/krane/cluster/v1"
	"krane.dev/shared/kinds"
)

// Observation orders status reports of one cluster on one object: by the
// desired version the cluster had applied, then by when it looked. A report
// older than the cluster's last accepted one is ignored, so a delayed
// report never overwrites a newer one. Reports of different clusters are
// not ordered against each other (their clocks differ) and never touch
// each other: each cluster's last report is a row of its own
// (object_reports).
type Observation struct {
	Version uint64
	At      time.Time
}

// ReportReorderWindow is how long after a report is written a report of
// the same cluster observed earlier at the same version is still taken for
// a copy delayed in flight, and dropped. Past it, the earlier observation
// time comes from a clock behind the last one (a new leader of the
// cluster), and the report is accepted. A report is applied within its
// call's deadline (seconds), so a delayed copy never arrives this late.
const ReportReorderWindow = time.Minute

// guard is the stored report of one cluster on one object.
type guard struct {
	version          uint64
	atNs, receivedNs int64
	sum              uint64
	deleted          bool
}

// admits reports whether a report observed as o, arriving at nowNs, is not
// older than the guarded one. Equal reports are admitted (a resend is
// harmless and makes the call idempotent).
func (g guard) admits(o Observation, nowNs int64) bool {
	switch {
	case o.Version != g.version:
		return o.Version > g.version
	case o.At.UnixNano() >= g.atNs:
		return true
	}
	return nowNs-g.receivedNs > ReportReorderWindow.Nanoseconds()
}

// now is the clock of the report guards.
func (s *Store) now() time.Time {
	if h := s.testHooks(); h.Now != nil {
		return h.Now()
	}
	return time.Now()
}

// Report is one cluster's report on one object of its region, as the
// store keeps it.
type Report struct {
	Kind, Region, ClusterID, ID string
	Obs                         Observation
	// Deleted: the cluster reports the object gone.
	Deleted bool
	// Status is the status as JSON (nil: none). Built-in kinds: the
	// protojson form of their status message with proto field names (see
	// StatusReport).
	Status []byte
	// Instances are a deployment's instances on the cluster: a full
	// snapshot, instances it no longer lists are removed.
	Instances []*clusterv1.Instance
}

// sum hashes everything the report carries but its observation, so that
// a report equal to the stored one is recognised and writes nothing.
func (r *Report) sum() uint64 {
	h := fnv.New64a()
	h.Write(r.Status)
	if r.Deleted {
		h.Write([]byte{1})
	}
	m := proto.MarshalOptions{Deterministic: true}
	for _, in := range r.Instances {
		b, _ := m.Marshal(in) // an Instance always marshals
		h.Write([]byte{0})
		h.Write(b)
	}
	return h.Sum64()
}

// statusJSON is how a built-in kind's status is stored.
var statusJSON = protojson.MarshalOptions{UseProtoNames: true}

// StatusReport makes the Report of a built-in kind's status message
// (*clusterv1.DeploymentStatus, *clusterv1.SentinelStatus,
// *clusterv1.CiliumNetworkPolicyStatus): its JSON, its deleted flag and,
// for a deployment, its instances (stored apart, in instances).
func StatusReport(kind, region, clusterID, id string, obs Observation, st proto.Message) (Report, error) {
	r := Report{Kind: kind, Region: region, ClusterID: clusterID, ID: id, Obs: obs}
	switch m := st.(type) {
	case *clusterv1.DeploymentStatus:
		r.Deleted = m.GetDeleted()
		if !r.Deleted {
			r.Instances = m.GetInstances()
		}
		summary := proto.Clone(m).(*clusterv1.DeploymentStatus)
		summary.Instances, summary.DeploymentId, summary.Deleted = nil, "", false
		st = summary
	case *clusterv1.SentinelStatus:
		r.Deleted = m.GetDeleted()
		c := proto.Clone(m).(*clusterv1.SentinelStatus)
		c.SentinelId, c.Deleted = "", false
		st = c
	case *clusterv1.CiliumNetworkPolicyStatus:
		r.Deleted = m.GetDeleted()
		c := proto.Clone(m).(*clusterv1.CiliumNetworkPolicyStatus)
		c.Id, c.Deleted = "", false
		st = c
	default:
		return r, fmt.Errorf("store: %T is not the status of a built-in kind", st)
	}
	b, err := statusJSON.Marshal(st)
	if err != nil {
		return r, fmt.Errorf("store: encode the status of %s %s: %w", kind, id, err)
	}
	r.Status = b
	return r, nil
}

// ReportResult answers one report: Err is ErrNotFound when the object has
// no row in the region, a *VersionAheadError when the report's version is
// above the object's, ErrClusterNotRegistered when the cluster is not
// registered in the region (it was removed). Accepted is false when the report was older than
// the cluster's last one (or than another report of the same cluster on
// the same object in the same batch); Changed is false when it was
// accepted but said what was stored already, and wrote nothing.
type ReportResult struct {
	Accepted, Changed bool
	Err               error
	// Started holds, for a changed report, how long each instance it
	// shows running for the first time took from its creation (instances
	// with a creation time only).
	Started []time.Duration
}

// MaxReportsPerBatch bounds one Ingest call's transaction.
const MaxReportsPerBatch = 5000

// Ingest stores the reports of any number of clusters in one transaction
// of a few statements, however many reports there are: one read of the
// reported objects' versions per kind table, one of the reporting
// clusters (share mode: a removal waits), one locking read of the stored
// reports (their rows only: the desired-state rows are read
// without a lock, so no report waits on an operator's write or holds one
// up), and one multi-row statement for each of object_reports and
// instances that has something to write. Reports equal to the stored ones
// write nothing. A report that a cluster makes of an object deleted at
// the version it reports is the last one needed: its rows are pruned
// instead of written.
//
// The error is the batch's own (the database failed): nothing of the
// batch is stored then, and sending it again is safe.
func (s *Store) Ingest(ctx context.Context, reps []Report) ([]ReportResult, error) {
	if len(reps) > MaxReportsPerBatch {
		return nil, fmt.Errorf("store: %d reports in one batch; at most %d", len(reps), MaxReportsPerBatch)
	}
	for _, r := range reps {
		for _, in := range r.Instances {
			if in.GetK8SName() == "" {
				return nil, fmt.Errorf("store: report on %s %s by cluster %s lists an instance without a pod name", r.Kind, r.ID, r.ClusterID)
			}
		}
	}
	results := make([]ReportResult, len(reps))
	hold := s.testHooks().BeforeReportCommit
	err := s.reportTx(ctx, s.ingest, func(ctx context.Context, tx *sql.Tx) error {
		clear(results)
		if err := ingest(ctx, tx, reps, results, s.now().UnixNano()); err != nil {
			return err
		}
		if hold != nil {
			hold(ctx, len(reps))
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return results, nil
}

// reportTx runs fn in a transaction of db's, again after a deadlock. Each ctrl
// stores its reports one batch at a time, so only batches of different
// ctrl replicas can meet on a row (or a gap beside one); a deadlock
// between them is retried.
func (s *Store) reportTx(ctx context.Context, db *sql.DB, fn func(context.Context, *sql.Tx) error) error {
	for attempt := 1; ; attempt++ {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return fmt.Errorf("store: begin a report transaction: %w", err)
		}
		err = fn(ctx, tx)
		if err == nil {
			err = tx.Commit()
		} else {
			_ = tx.Rollback()
		}
		if err == nil || !isRetryable(err) || attempt == 5 {
			return err
		}
		if err := sleepCtx(ctx, time.Duration(attempt)*5*time.Millisecond); err != nil {
			return err
		}
	}
}

// objKey names an object in a region; repKey a cluster's report on it.
type (
	objKey struct{ kind, region, id string }
	repKey struct {
		objKey
		cluster string
	}
)

func (r *Report) key() repKey {
	return repKey{objKey{r.Kind, r.Region, r.ID}, r.ClusterID}
}

// desiredRow is what a report is judged against.
type desiredRow struct {
	version uint64
	deleted bool
}

func ingest(ctx context.Context, tx *sql.Tx, reps []Report, results []ReportResult, nowNs int64) error {
	objs := map[objKey]bool{}
	for i := range reps {
		objs[reps[i].key().objKey] = true
	}
	desired, err := readDesired(ctx, tx, objs)
	if err != nil {
		return err
	}
	registered, err := readClusters(ctx, tx, reps)
	if err != nil {
		return err
	}
	// A report of a cluster that is not registered (removed meanwhile), on
	// an unknown object, or above its version, is refused on its own.
	// Of the others, or above its version, is refused on
	// the newest of each (object, cluster) in the batch speaks; the rest are superseded within the batch, as they
	// would have been one call later.
	valid := make([]bool, len(reps))
	newest := map[repKey]int{}
	for i := range reps {
		r := &reps[i]
		d, ok := desired[r.key().objKey]
		switch {
		case registered[r.ClusterID] != r.Region:
			results[i].Err = fmt.Errorf("store: cluster %s is not registered in region %s: %w", r.ClusterID, r.Region, ErrClusterNotRegistered)
			continue
		case !ok:
			results[i].Err = ErrNotFound
			continue
		case r.Obs.Version > d.version:
			results[i].Err = &VersionAheadError{Ref: Ref{Kind: r.Kind, Region: r.Region, ID: r.ID}, Reported: r.Obs.Version, Current: d.version}
			continue
		}
		valid[i] = true
		k := r.key()
		j, seen := newest[k]
		if !seen || (guard{version: reps[j].Obs.Version, atNs: reps[j].Obs.At.UnixNano()}).admits(r.Obs, 0) {
			newest[k] = i
		}
	}
	keys := make([]repKey, 0, len(newest))
	for k := range newest {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, compareRepKeys) // one lock order for every batch
	stored, err := readReports(ctx, tx, keys)
	if err != nil {
		return err
	}
	var write, prune []int // indexes in reps
	for _, k := range keys {
		i := newest[k]
		r := &reps[i]
		d := desired[k.objKey]
		g, had := stored[k]
		switch {
		case had && !g.admits(r.Obs, nowNs):
		case !had && staleAfterDelete(d, r):
		case d.deleted && r.Deleted && r.Obs.Version >= d.version:
			// The cluster applied the delete: nothing of it is left to
			// show, and its rows go.
			results[i].Accepted, results[i].Changed = true, had
			if had {
				prune = append(prune, i)
			}
		case had && g.version == r.Obs.Version && g.sum == r.sum():
			results[i].Accepted = true
		default:
			results[i].Accepted, results[i].Changed = true, true
			write = append(write, i)
		}
	}
	// The superseded ones are answered as if each had come in its own
	// call, in batch order: accepted when newer than what was stored and
	// than the earlier ones of the batch.
	running := make(map[repKey]guard, len(keys))
	for k, g := range stored {
		running[k] = g
	}
	for i := range reps {
		if !valid[i] {
			continue
		}
		k := reps[i].key()
		g, had := running[k]
		admitted := had && g.admits(reps[i].Obs, nowNs) || !had && !staleAfterDelete(desired[k.objKey], &reps[i])
		if admitted {
			running[k] = guard{version: reps[i].Obs.Version, atNs: reps[i].Obs.At.UnixNano(), receivedNs: nowNs}
		}
		if j := newest[k]; j != i {
			results[i] = ReportResult{Accepted: admitted, Changed: admitted && results[j].Changed}
		}
	}
	if err := writeReports(ctx, tx, reps, write, nowNs); err != nil {
		return err
	}
	if err := pruneReports(ctx, tx, reps, prune); err != nil {
		return err
	}
	var deps []int
	for _, i := range append(slices.Clone(write), prune...) {
		if reps[i].Kind == kinds.Deployment {
			deps = append(deps, i)
		}
	}
	if len(deps) == 0 {
		return nil
	}
	started, err := startedInstances(ctx, tx, reps, deps)
	if err != nil {
		return err
	}
	for i, d := range started {
		results[i].Started = d
	}
	if err := upsertInstances(ctx, tx, reps, deps); err != nil {
		return err
	}
	return removeGoneInstances(ctx, tx, reps, deps)
}

// staleAfterDelete: r is a report from before its object's delete, and
// the cluster has no report row on the object. The delete-applied report
// removed that row, which was also the order guard of the cluster's
// reports; a report sent earlier and arriving later must not bring the
// deleted object's state back (nor leave a row no later report removes).
// Until the cluster applies the delete, its row guards as usual.
func staleAfterDelete(d desiredRow, r *Report) bool {
	return d.deleted && r.Obs.Version < d.version
}

func compareRepKeys(a, b repKey) int {
	return cmpJoin(strings.Compare(a.kind, b.kind), strings.Compare(a.region, b.region), strings.Compare(a.id, b.id), strings.Compare(a.cluster, b.cluster))
}

func cmpJoin(cs ...int) int {
	for _, c := range cs {
		if c != 0 {
			return c
		}
	}
	return 0
}

// ErrClusterNotRegistered refuses a report of a cluster that is not (or no
// longer) registered in its region.
var ErrClusterNotRegistered = errors.New("the cluster is not registered")

// readClusters reads the regions of the reporting clusters, locking their
// rows in share mode until the batch commits: a removal of one of them
// (RemoveCluster locks its row to delete it and its reports) waits for
// the batch, or the batch for the removal, so no report of a removed
// cluster is stored after its rows went.
func readClusters(ctx context.Context, tx *sql.Tx, reps []Report) (map[string]string, error) {
	ids := distinct(reps, func(r Report) string { return r.ClusterID })
	out := make(map[string]string, len(ids))
	if len(ids) == 0 {
		return out, nil
	}
	rows, err := tx.QueryContext(ctx, "SELECT id, region FROM clusters WHERE id IN ("+placeholders(len(ids))+") LOCK IN SHARE MODE", ids...)
	if err != nil {
		return nil, fmt.Errorf("store: read the %d clusters of a report batch: %w", len(ids), err)
	}
	defer rows.Close()
	for rows.Next() {
		var id, region string
		if err := rows.Scan(&id, &region); err != nil {
			return nil, fmt.Errorf("store: read the clusters of a report batch: %w", err)
		}
		out[id] = region
	}
	return out, rows.Err()
}

// readDesired reads the version, and whether it is deleted, of each
// object, without locking: one statement per kind table.
func readDesired(ctx context.Context, tx *sql.Tx, objs map[objKey]bool) (map[objKey]desiredRow, error) {
	type family struct {
		query         string // with %ids, %regions (and %kinds) for the lists
		kinds         bool   // the generic table: kind is a key column
		ids, regs, ks []any
		seen          map[string]bool
	}
	fams := map[string]*family{}
	for o := range objs {
		name := o.kind
		if !IsBuiltIn(o.kind) {
			name = ""
		}
		f := fams[name]
		if f == nil {
			f = &family{seen: map[string]bool{}}
			switch name {
			case kinds.Deployment:
				f.query = "SELECT 'deployment', region, deployment_id, version, NOT (desired_status = 'running' AND desired_replicas > 0) FROM deployment_topology WHERE deployment_id IN (%ids) AND region IN (%regions)"
			case kinds.Sentinel:
				f.query = "SELECT 'sentinel', region, id, version, desired_state <> 'running' FROM sentinels WHERE id IN (%ids) AND region IN (%regions)"
			case kinds.CiliumNetworkPolicy:
				f.query = "SELECT 'ciliumnetworkpolicy', region, id, version, deleted FROM cilium_network_policies WHERE id IN (%ids) AND region IN (%regions)"
			default:
				f.query, f.kinds = "SELECT kind, region, id, version, deleted FROM resources WHERE id IN (%ids) AND region IN (%regions) AND kind IN (%kinds)", true
			}
			fams[name] = f
		}
		for _, v := range []struct {
			prefix, s string
			list      *[]any
		}{{"i", o.id, &f.ids}, {"r", o.region, &f.regs}, {"k", o.kind, &f.ks}} {
			if !f.seen[v.prefix+v.s] {
				f.seen[v.prefix+v.s] = true
				*v.list = append(*v.list, v.s)
			}
		}
	}
	out := make(map[objKey]desiredRow, len(objs))
	for _, f := range fams {
		query := strings.Replace(f.query, "%ids", placeholders(len(f.ids)), 1)
		query = strings.Replace(query, "%regions", placeholders(len(f.regs)), 1)
		args := append(append([]any{}, f.ids...), f.regs...)
		if f.kinds {
			query = strings.Replace(query, "%kinds", placeholders(len(f.ks)), 1)
			args = append(args, f.ks...)
		}
		rows, err := tx.QueryContext(ctx, query, args...)
		if err != nil {
			return nil, fmt.Errorf("store: read the versions of %d reported objects: %w", len(f.ids), err)
		}
		for rows.Next() {
			var k objKey
			var d desiredRow
			if err := rows.Scan(&k.kind, &k.region, &k.id, &d.version, &d.deleted); err != nil {
				rows.Close()
				return nil, fmt.Errorf("store: read the versions of reported objects: %w", err)
			}
			if objs[k] {
				out[k] = d
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("store: read the versions of reported objects: %w", err)
		}
	}
	return out, nil
}

// repKeyCond is the condition selecting keys' rows of a table keyed by
// (kind, region, id, cluster_id): one range of the primary key per key,
// grouped by (kind, region, cluster).
func repKeyCond(keys []repKey) (string, []any) {
	type group struct{ kind, region, cluster string }
	ids := map[group][]any{}
	var order []group
	for _, k := range keys {
		g := group{k.kind, k.region, k.cluster}
		if _, ok := ids[g]; !ok {
			order = append(order, g)
		}
		ids[g] = append(ids[g], k.id)
	}
	var b strings.Builder
	var args []any
	for n, g := range order {
		if n > 0 {
			b.WriteString(" OR ")
		}
		b.WriteString("(kind = ? AND region = ? AND cluster_id = ? AND id IN (" + placeholders(len(ids[g])) + "))")
		args = append(append(args, g.kind, g.region, g.cluster), ids[g]...)
	}
	return b.String(), args
}

// readReports locks and reads the stored reports of keys.
func readReports(ctx context.Context, tx *sql.Tx, keys []repKey) (map[repKey]guard, error) {
	out := make(map[repKey]guard, len(keys))
	if len(keys) == 0 {
		return out, nil
	}
	cond, args := repKeyCond(keys)
	rows, err := tx.QueryContext(ctx, `SELECT kind, region, id, cluster_id, observed_version, observed_at_ns, received_at_ns, status_sum, deleted
FROM object_reports WHERE `+cond+" FOR UPDATE", args...)
	if err != nil {
		return nil, fmt.Errorf("store: read the stored reports of %d objects: %w", len(keys), err)
	}
	defer rows.Close()
	for rows.Next() {
		var k repKey
		var g guard
		if err := rows.Scan(&k.kind, &k.region, &k.id, &k.cluster, &g.version, &g.atNs, &g.receivedNs, &g.sum, &g.deleted); err != nil {
			return nil, fmt.Errorf("store: read the stored reports: %w", err)
		}
		out[k] = g
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: read the stored reports: %w", err)
	}
	return out, nil
}

// statementBytes bounds the data one multi-row statement carries, well
// under max_allowed_packet (16 MiB by default on MariaDB, 64 MiB on MySQL
// 8): statuses are up to hundreds of KiB each.
const statementBytes = 4 << 20

// chunks splits idx into runs of at most rows items and about
// statementBytes (by size; a larger item goes alone).
func chunks(idx []int, rows int, size func(int) int) [][]int {
	var out [][]int
	start, bytes := 0, 0
	for n, i := range idx {
		b := size(i)
		if n > start && (n-start == rows || bytes+b > statementBytes) {
			out = append(out, idx[start:n])
			start, bytes = n, 0
		}
		bytes += b
	}
	if start < len(idx) {
		out = append(out, idx[start:])
	}
	return out
}

// writeReports upserts the reports at idx: one statement per about
// statementBytes of statuses (usually one).
func writeReports(ctx context.Context, tx *sql.Tx, reps []Report, idx []int, nowNs int64) error {
	for _, part := range chunks(idx, 5000, func(i int) int { return len(reps[i].Status) + 128 }) {
		args := make([]any, 0, 10*len(part))
		for _, i := range part {
			r := &reps[i]
			var status any
			if r.Status != nil {
				status = string(r.Status)
			}
			args = append(args, r.Kind, r.Region, r.ID, r.ClusterID, r.Obs.Version, r.Obs.At.UnixNano(), nowNs, r.Deleted, status, r.sum())
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO object_reports (kind, region, id, cluster_id, observed_version, observed_at_ns, received_at_ns, deleted, status, status_sum)
VALUES `+rowGroups(len(part), 10)+`
ON DUPLICATE KEY UPDATE observed_version = VALUES(observed_version), observed_at_ns = VALUES(observed_at_ns),
  received_at_ns = VALUES(received_at_ns), deleted = VALUES(deleted), status = VALUES(status), status_sum = VALUES(status_sum)`, args...)
		if err != nil {
			return fmt.Errorf("store: write %d reports (first: %s %s by cluster %s): %w", len(part), reps[part[0]].Kind, reps[part[0]].ID, reps[part[0]].ClusterID, err)
		}
	}
	return nil
}

// pruneReports deletes the rows (report and apply errors) of clusters
// that applied an object's delete.
func pruneReports(ctx context.Context, tx *sql.Tx, reps []Report, idx []int) error {
	if len(idx) == 0 {
		return nil
	}
	keys := make([]repKey, len(idx))
	for n, i := range idx {
		keys[n] = reps[i].key()
	}
	cond, args := repKeyCond(keys)
	for _, table := range []string{"object_reports", "apply_errors"} {
		if _, err := tx.ExecContext(ctx, "DELETE FROM "+table+" WHERE "+cond, args...); err != nil {
			return fmt.Errorf("store: prune %s of %d deleted objects: %w", table, len(idx), err)
		}
	}
	return nil
}

// instanceRowsPerInsert bounds one INSERT (14 placeholders a row; MySQL
// allows 65,535 in a statement).
const instanceRowsPerInsert = 1000

func upsertInstances(ctx context.Context, tx *sql.Tx, reps []Report, idx []int) error {
	now := nowMillis()
	var b strings.Builder
	var args []any
	n := 0
	flush := func() error {
		if n == 0 {
			return nil
		}
		b.WriteString(` ON DUPLICATE KEY UPDATE address = VALUES(address), cpu_millicores = VALUES(cpu_millicores),
  memory_mib = VALUES(memory_mib), status = VALUES(status), reason = VALUES(reason), message = VALUES(message),
  zone = VALUES(zone), observed_version = VALUES(observed_version), observed_at_ns = VALUES(observed_at_ns),
  updated_at = VALUES(updated_at)`)
		if _, err := tx.ExecContext(ctx, b.String(), args...); err != nil {
			return fmt.Errorf("store: write %d instances: %w", n, err)
		}
		b.Reset()
		args, n = args[:0], 0
		return nil
	}
	for _, i := range idx {
		r := &reps[i]
		for _, in := range r.Instances {
			if n == 0 {
				b.WriteString(`INSERT INTO instances (deployment_id, region, cluster_id, k8s_name, address, cpu_millicores, memory_mib,
  status, reason, message, zone, observed_version, observed_at_ns, updated_at) VALUES `)
			} else {
				b.WriteString(", ")
			}
			b.WriteString("(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")
			args = append(args, r.ID, r.Region, r.ClusterID, in.GetK8SName(), in.GetAddress(), in.GetCpuMillicores(), in.GetMemoryMib(),
				instanceStatus(in.GetStatus()), in.GetReason(), nullString(in.GetMessage()), in.GetZone(), r.Obs.Version, r.Obs.At.UnixNano(), now)
			if n++; n == instanceRowsPerInsert {
				if err := flush(); err != nil {
					return err
				}
			}
		}
	}
	return flush()
}

// removeGoneInstances deletes each reporting cluster's instances of the
// reported deployments that its report no longer lists: one range of the
// primary key per (deployment, region, cluster).
func removeGoneInstances(ctx context.Context, tx *sql.Tx, reps []Report, idx []int) error {
	var b strings.Builder
	var args []any
	for n, i := range idx {
		r := &reps[i]
		if n > 0 {
			b.WriteString(" OR ")
		}
		b.WriteString("(deployment_id = ? AND region = ? AND cluster_id = ?")
		args = append(args, r.ID, r.Region, r.ClusterID)
		if len(r.Instances) > 0 {
			b.WriteString(" AND k8s_name NOT IN (" + placeholders(len(r.Instances)) + ")")
			for _, in := range r.Instances {
				args = append(args, in.GetK8SName())
			}
		}
		b.WriteString(")")
	}
	if _, err := tx.ExecContext(ctx, "DELETE FROM instances WHERE "+b.String(), args...); err != nil {
		return fmt.Errorf("store: remove gone instances of %d deployment reports: %w", len(idx), err)
	}
	return nil
}

func instanceStatus(s clusterv1.Instance_Status) string {
	switch s {
	case clusterv1.Instance_STATUS_PENDING:
		return "pending"
	case clusterv1.Instance_STATUS_RUNNING:
		return "running"
	case clusterv1.Instance_STATUS_FAILED:
		return "failed"
	default:
		return "inactive"
	}
}

// DeploymentReport is one cluster's report on one deployment.
type DeploymentReport struct {
	Obs    Observation
	Status *clusterv1.DeploymentStatus
}

// ReportDeployments is Ingest for reports of one cluster on deployments.
func (s *Store) ReportDeployments(ctx context.Context, region, clusterID string, reps []DeploymentReport) ([]ReportResult, error) {
	all := make([]Report, len(reps))
	for i, r := range reps {
		var err error
		if all[i], err = StatusReport(kinds.Deployment, region, clusterID, r.Status.GetDeploymentId(), r.Obs, r.Status); err != nil {
			return nil, err
		}
	}
	return s.Ingest(ctx, all)
}

// ReportSentinel records a cluster's report on a sentinel's actual state.
// accepted=false when the report is older than the cluster's last one;
// ErrNotFound when there is no such sentinel in region; a
// *VersionAheadError when its version is above the sentinel's.
func (s *Store) ReportSentinel(ctx context.Context, region, clusterID string, obs Observation, st *clusterv1.SentinelStatus) (bool, error) {
	return s.reportOne(StatusReport(kinds.Sentinel, region, clusterID, st.GetSentinelId(), obs, st))(ctx, s)
}

// ReportCiliumNetworkPolicy records whether a policy was applied.
func (s *Store) ReportCiliumNetworkPolicy(ctx context.Context, region, clusterID string, obs Observation, st *clusterv1.CiliumNetworkPolicyStatus) (bool, error) {
	return s.reportOne(StatusReport(kinds.CiliumNetworkPolicy, region, clusterID, st.GetId(), obs, st))(ctx, s)
}

// ReportResource records the status (a JSON document) of a generic
// resource.
func (s *Store) ReportResource(ctx context.Context, kind, region, clusterID, id string, obs Observation, statusJSON []byte) (bool, error) {
	return s.reportOne(Report{Kind: kind, Region: region, ClusterID: clusterID, ID: id, Obs: obs, Status: statusJSON}, nil)(ctx, s)
}

// reportOne ingests one report, answering as a single-report call does.
func (s *Store) reportOne(r Report, err error) func(context.Context, *Store) (bool, error) {
	return func(ctx context.Context, s *Store) (bool, error) {
		if err != nil {
			return false, err
		}
		res, err := s.Ingest(ctx, []Report{r})
		if err != nil {
			return false, err
		}
		return res[0].Accepted, res[0].Err
	}
}
