package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"krane.dev/internal/kinds"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
)

// Observation orders status reports of one cluster on one object: by the
// desired version the cluster had applied, then by when it looked. A report
// older than the cluster's last accepted one is ignored, so a delayed
// report never overwrites a newer one. Reports of different clusters are
// not ordered against each other (their clocks differ): each cluster's
// last report is guarded on its own (report_guards).
type Observation struct {
	Version uint64
	At      time.Time
}

// ReportReorderWindow is how long after a report is accepted a report of
// the same cluster observed earlier at the same version is still taken for
// a copy delayed in flight, and dropped. Past it, the earlier observation
// time comes from a clock behind the last one (a new leader of the
// cluster), and the report is accepted. A report is applied within its
// call's deadline (seconds), so a delayed copy never arrives this late.
const ReportReorderWindow = time.Minute

// guard is the last report accepted from one cluster on one object.
type guard struct {
	version          uint64
	atNs, receivedNs int64
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

// readGuards locks and reads the guards of one cluster on ids of a kind in
// a region (absent ids have none: every report is admitted).
func (t *Tx) readGuards(ctx context.Context, kind, region, clusterID string, ids []string) (map[string]guard, error) {
	args := []any{kind, region, clusterID}
	for _, id := range ids {
		args = append(args, id)
	}
	rows, err := t.Query(ctx, `SELECT id, observed_version, observed_at_ns, received_at_ns FROM report_guards
WHERE kind = ? AND region = ? AND cluster_id = ? AND id IN (`+placeholders(len(ids))+") ORDER BY id FOR UPDATE", args...)
	if err != nil {
		return nil, fmt.Errorf("store: read report guards of cluster %s in %s: %w", clusterID, region, err)
	}
	defer rows.Close()
	out := make(map[string]guard, len(ids))
	for rows.Next() {
		var id string
		var g guard
		if err := rows.Scan(&id, &g.version, &g.atNs, &g.receivedNs); err != nil {
			return nil, fmt.Errorf("store: read report guards of cluster %s in %s: %w", clusterID, region, err)
		}
		out[id] = g
	}
	return out, rows.Err()
}

// guardedReport is a report to record in report_guards.
type guardedReport struct {
	id  string
	obs Observation
}

// writeGuards records accepted reports as their cluster's latest.
func (t *Tx) writeGuards(ctx context.Context, kind, region, clusterID string, reps []guardedReport, nowNs int64) error {
	if len(reps) == 0 {
		return nil
	}
	var b strings.Builder
	args := make([]any, 0, 7*len(reps))
	b.WriteString("INSERT INTO report_guards (kind, region, id, cluster_id, observed_version, observed_at_ns, received_at_ns) VALUES ")
	for i, r := range reps {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString("(?, ?, ?, ?, ?, ?, ?)")
		args = append(args, kind, region, r.id, clusterID, r.obs.Version, r.obs.At.UnixNano(), nowNs)
	}
	b.WriteString(` ON DUPLICATE KEY UPDATE observed_version = VALUES(observed_version), observed_at_ns = VALUES(observed_at_ns),
  received_at_ns = VALUES(received_at_ns)`)
	if _, err := t.Exec(ctx, b.String(), args...); err != nil {
		return fmt.Errorf("store: write report guards of cluster %s in %s: %w", clusterID, region, err)
	}
	return nil
}

// ReportDeployment records a cluster's report on one deployment in region:
// its instances (a full snapshot for that cluster: instances it no longer
// lists are removed) and the replica summary. It returns accepted=false,
// and changes nothing, when the report is older than the cluster's last
// accepted one; ErrNotFound when the deployment has no topology in region.
func (s *Store) ReportDeployment(ctx context.Context, region, clusterID string, obs Observation, st *clusterv1.DeploymentStatus) (bool, error) {
	res, err := s.ReportDeployments(ctx, region, clusterID, []DeploymentReport{{Obs: obs, Status: st}})
	if err != nil {
		return false, err
	}
	return res[0].Accepted, res[0].Err
}

// DeploymentReport is one cluster's report on one deployment.
type DeploymentReport struct {
	Obs    Observation
	Status *clusterv1.DeploymentStatus
}

// ReportResult answers one report of a batch: Err is ErrNotFound when the
// object has no row in the region; Accepted is false when the report was
// older than the cluster's last accepted one.
type ReportResult struct {
	Accepted bool
	Err      error
	// Started holds, for an accepted report, how long each instance it
	// shows running for the first time took from its creation (instances
	// with a creation time only).
	Started []time.Duration
}

// ReportDeployments records many reports of one cluster, as
// ReportDeployment would one after the other, in one transaction of four
// statements however many there are (a deployment named twice splits the
// batch, so the later report is judged against the earlier one). The
// error is the batch's own: when it is set, some groups may have been
// stored; reports are idempotent, so sending them all again is safe.
func (s *Store) ReportDeployments(ctx context.Context, region, clusterID string, reps []DeploymentReport) ([]ReportResult, error) {
	results := make([]ReportResult, len(reps))
	for _, r := range reps {
		for _, in := range r.Status.GetInstances() {
			if in.GetK8SName() == "" {
				return nil, fmt.Errorf("store: report on deployment %s lists an instance without a pod name", r.Status.GetDeploymentId())
			}
		}
	}
	for start := 0; start < len(reps); {
		end, seen := start, map[string]bool{}
		for end < len(reps) && !seen[reps[end].Status.GetDeploymentId()] {
			seen[reps[end].Status.GetDeploymentId()] = true
			end++
		}
		group := reps[start:end]
		_, err := s.WriteTxAlone(ctx, func(ctx context.Context, tx *Tx) error {
			return reportDeploymentGroup(ctx, tx, region, clusterID, group, results[start:end], s.now().UnixNano())
		})
		if err != nil {
			return nil, err
		}
		start = end
	}
	return results, nil
}

// reportDeploymentGroup stores reports on distinct deployments: lock their
// topology rows, keep the reports not older than what is stored, then
// upsert their instances, remove the instances they no longer list, and
// write their summaries.
func reportDeploymentGroup(ctx context.Context, tx *Tx, region, clusterID string, reps []DeploymentReport, results []ReportResult, nowNs int64) error {
	ids := make([]any, 0, len(reps)+1)
	ids = append(ids, region)
	for _, r := range reps {
		ids = append(ids, r.Status.GetDeploymentId())
	}
	rows, err := tx.Query(ctx, "SELECT deployment_id, version FROM deployment_topology WHERE region = ? AND deployment_id IN ("+
		placeholders(len(reps))+") ORDER BY deployment_id FOR UPDATE", ids...)
	if err != nil {
		return fmt.Errorf("store: lock %d deployments in %s for their reports: %w", len(reps), region, err)
	}
	current := make(map[string]uint64, len(reps)) // each row's version
	for rows.Next() {
		var id string
		var v uint64
		if err := rows.Scan(&id, &v); err != nil {
			rows.Close()
			return fmt.Errorf("store: read deployments in %s for their reports: %w", region, err)
		}
		current[id] = v
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("store: read deployments in %s for their reports: %w", region, err)
	}
	known := make([]string, 0, len(current))
	for id := range current {
		known = append(known, id)
	}
	slices.Sort(known)
	var guards map[string]guard
	if len(known) > 0 {
		if guards, err = tx.readGuards(ctx, kinds.Deployment, region, clusterID, known); err != nil {
			return err
		}
	}
	now := nowNs
	var take []int
	var taken []guardedReport
	for i, r := range reps {
		id := r.Status.GetDeploymentId()
		cur, ok := current[id]
		g, guarded := guards[id]
		results[i] = ReportResult{}
		switch {
		case !ok:
			results[i].Err = ErrNotFound
		case r.Obs.Version > cur:
			results[i].Err = &VersionAheadError{Ref: Ref{Kind: kinds.Deployment, Region: region, ID: id}, Reported: r.Obs.Version, Current: cur}
		case !guarded || g.admits(r.Obs, now):
			take = append(take, i)
			taken = append(taken, guardedReport{id: id, obs: r.Obs})
		}
	}
	if len(take) == 0 {
		return nil
	}
	if err := tx.writeGuards(ctx, kinds.Deployment, region, clusterID, taken, now); err != nil {
		return err
	}
	started, err := startedInstances(ctx, tx, region, clusterID, reps, take)
	if err != nil {
		return err
	}
	if err := upsertInstances(ctx, tx, region, clusterID, reps, take); err != nil {
		return err
	}
	if err := removeGoneInstances(ctx, tx, region, clusterID, reps, take); err != nil {
		return err
	}
	if err := writeReportSummaries(ctx, tx, region, reps, take); err != nil {
		return err
	}
	for _, i := range take {
		results[i].Accepted, results[i].Started = true, started[i]
	}
	return nil
}

func liveInstances(st *clusterv1.DeploymentStatus) []*clusterv1.Instance {
	if st.GetDeleted() {
		return nil
	}
	return st.GetInstances()
}

// instanceRowsPerInsert bounds one INSERT (14 placeholders a row; MySQL
// allows 65,535 in a statement).
const instanceRowsPerInsert = 1000

func upsertInstances(ctx context.Context, tx *Tx, region, clusterID string, reps []DeploymentReport, take []int) error {
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
		if _, err := tx.Exec(ctx, b.String(), args...); err != nil {
			return fmt.Errorf("store: write %d instances in %s: %w", n, region, err)
		}
		b.Reset()
		args, n = args[:0], 0
		return nil
	}
	for _, i := range take {
		r := reps[i]
		for _, in := range liveInstances(r.Status) {
			if n == 0 {
				b.WriteString(`INSERT INTO instances (deployment_id, region, cluster_id, k8s_name, address, cpu_millicores, memory_mib,
  status, reason, message, zone, observed_version, observed_at_ns, updated_at) VALUES `)
			} else {
				b.WriteString(", ")
			}
			b.WriteString("(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")
			args = append(args, r.Status.GetDeploymentId(), region, clusterID, in.GetK8SName(), in.GetAddress(), in.GetCpuMillicores(), in.GetMemoryMib(),
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

// removeGoneInstances deletes this cluster's instances of the reported
// deployments that their reports no longer list.
func removeGoneInstances(ctx context.Context, tx *Tx, region, clusterID string, reps []DeploymentReport, take []int) error {
	var b strings.Builder
	args := []any{region, clusterID}
	b.WriteString("DELETE FROM instances WHERE region = ? AND cluster_id = ? AND deployment_id IN (" + placeholders(len(take)) + ")")
	for _, i := range take {
		args = append(args, reps[i].Status.GetDeploymentId())
	}
	kept := 0
	for _, i := range take {
		for _, in := range liveInstances(reps[i].Status) {
			if kept == 0 {
				b.WriteString(" AND (deployment_id, k8s_name) NOT IN ((?, ?)")
			} else {
				b.WriteString(", (?, ?)")
			}
			args = append(args, reps[i].Status.GetDeploymentId(), in.GetK8SName())
			kept++
		}
	}
	if kept > 0 {
		b.WriteString(")")
	}
	if _, err := tx.Exec(ctx, b.String(), args...); err != nil {
		return fmt.Errorf("store: remove gone instances of %d deployments in %s: %w", len(take), region, err)
	}
	return nil
}

// writeReportSummaries sets each reported deployment's summary columns in
// one UPDATE (a CASE per column: portable across MySQL and MariaDB).
func writeReportSummaries(ctx context.Context, tx *Tx, region string, reps []DeploymentReport, take []int) error {
	columns := []struct {
		name  string
		value func(DeploymentReport) any
	}{
		{"report_observed_version", func(r DeploymentReport) any { return r.Obs.Version }},
		{"report_observed_at_ns", func(r DeploymentReport) any { return r.Obs.At.UnixNano() }},
		{"reported_desired_replicas", func(r DeploymentReport) any { return r.Status.GetDesiredReplicas() }},
		{"reported_ready_replicas", func(r DeploymentReport) any { return r.Status.GetReadyReplicas() }},
		{"reported_available_replicas", func(r DeploymentReport) any { return r.Status.GetAvailableReplicas() }},
		{"reported_deleted", func(r DeploymentReport) any { return r.Status.GetDeleted() }},
	}
	var b strings.Builder
	args := make([]any, 0, len(take)*(2*len(columns)+1)+1)
	b.WriteString("UPDATE deployment_topology SET ")
	for c, col := range columns {
		if c > 0 {
			b.WriteString(", ")
		}
		b.WriteString(col.name + " = CASE deployment_id")
		for _, i := range take {
			b.WriteString(" WHEN ? THEN ?")
			args = append(args, reps[i].Status.GetDeploymentId(), col.value(reps[i]))
		}
		b.WriteString(" END")
	}
	b.WriteString(" WHERE region = ? AND deployment_id IN (" + placeholders(len(take)) + ")")
	args = append(args, region)
	for _, i := range take {
		args = append(args, reps[i].Status.GetDeploymentId())
	}
	if _, err := tx.Exec(ctx, b.String(), args...); err != nil {
		return fmt.Errorf("store: write report summaries of %d deployments in %s: %w", len(take), region, err)
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

func healthName(h clusterv1.Health) string {
	switch h {
	case clusterv1.Health_HEALTH_HEALTHY:
		return "healthy"
	case clusterv1.Health_HEALTH_UNHEALTHY:
		return "unhealthy"
	case clusterv1.Health_HEALTH_PAUSED:
		return "paused"
	default:
		return "unknown"
	}
}

// ReportSentinel records a cluster's report on a sentinel's actual state.
// accepted=false when the report is older than the cluster's last one;
// ErrNotFound when there is no such sentinel in region; a
// *VersionAheadError when its version is above the sentinel's.
func (s *Store) ReportSentinel(ctx context.Context, region, clusterID string, obs Observation, st *clusterv1.SentinelStatus) (bool, error) {
	args := []any{st.GetRunningImage(), st.GetAvailableReplicas(), st.GetUpdatedReplicas(), st.GetReadyReplicas(),
		st.GetObservedGeneration(), healthName(st.GetHealth()), st.GetReason(), st.GetDeleted(), obs.Version, obs.At.UnixNano()}
	return s.report(ctx, Ref{Kind: kinds.Sentinel, Region: region, ID: st.GetSentinelId()}, clusterID, obs, `UPDATE sentinels SET running_image = ?, available_replicas = ?, updated_replicas = ?,
  ready_replicas = ?, observed_generation = ?, health = ?, health_reason = ?, reported_deleted = ?,
  report_observed_version = ?, report_observed_at_ns = ?
WHERE id = ? AND region = ?`, args)
}

// ReportCiliumNetworkPolicy records whether a policy was applied.
func (s *Store) ReportCiliumNetworkPolicy(ctx context.Context, region, clusterID string, obs Observation, st *clusterv1.CiliumNetworkPolicyStatus) (bool, error) {
	args := []any{st.GetApplied(), nullString(st.GetMessage()), st.GetDeleted(), obs.Version, obs.At.UnixNano()}
	return s.report(ctx, Ref{Kind: kinds.CiliumNetworkPolicy, Region: region, ID: st.GetId()}, clusterID, obs, `UPDATE cilium_network_policies SET status_applied = ?, status_message = ?,
  reported_deleted = ?, report_observed_version = ?, report_observed_at_ns = ?
WHERE id = ? AND region = ?`, args)
}

// ReportResource records the status (a JSON document) of a generic
// resource.
func (s *Store) ReportResource(ctx context.Context, kind, region, clusterID, id string, obs Observation, statusJSON []byte) (bool, error) {
	args := []any{string(statusJSON), obs.Version, obs.At.UnixNano()}
	return s.report(ctx, Ref{Kind: kind, Region: region, ID: id}, clusterID, obs, `UPDATE resources SET status = ?, report_observed_version = ?, report_observed_at_ns = ?
WHERE kind = ? AND region = ? AND id = ?`, args)
}

// report records one cluster's report on the object r in one
// transaction: lock the object's row (ErrNotFound when there is none; a
// *VersionAheadError when the report's version is above the row's), judge
// the report against the cluster's guard, and when it is not older run
// update (whose WHERE clause is the object's key columns, in keyArgs order)
// and record the guard.
func (s *Store) report(ctx context.Context, r Ref, clusterID string, obs Observation, update string, args []any) (bool, error) {
	def := lookupKind(r.Kind)
	var accepted bool
	_, err := s.WriteTxAlone(ctx, func(ctx context.Context, tx *Tx) error {
		accepted = false
		var cur uint64
		err := tx.QueryRow(ctx, def.rowVersionSQL(true), def.keyArgs(r)...).Scan(&cur)
		if errors.Is(err, sql.ErrNoRows) {
			return ErrNotFound
		}
		if err != nil {
			return fmt.Errorf("store: lock %s for a report: %w", r, err)
		}
		if obs.Version > cur {
			return &VersionAheadError{Ref: r, Reported: obs.Version, Current: cur}
		}
		guards, err := tx.readGuards(ctx, r.Kind, r.Region, clusterID, []string{r.ID})
		if err != nil {
			return err
		}
		now := s.now().UnixNano()
		if g, ok := guards[r.ID]; ok && !g.admits(obs, now) {
			return nil
		}
		if _, err := tx.Exec(ctx, update, append(args, def.keyArgs(r)...)...); err != nil {
			return fmt.Errorf("store: write report on %s: %w", r, err)
		}
		accepted = true
		return tx.writeGuards(ctx, r.Kind, r.Region, clusterID, []guardedReport{{id: r.ID, obs: obs}}, now)
	})
	if err != nil {
		return false, err
	}
	return accepted, nil
}
