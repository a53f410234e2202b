package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	clusterv1 "krane.dev/proto/krane/cluster/v1"
)

// Observation orders status reports: by the desired version the cluster had
// applied, then by when it looked. A report older than the stored one is
// ignored, so a delayed report never overwrites a newer one.
type Observation struct {
	Version uint64
	At      time.Time
}

// guardSQL is true when the report (?, ?, ?) = (version, version, at_ns) is
// not older than the stored one. Equal reports are accepted (a resend is
// harmless and makes the call idempotent).
const guardSQL = "(report_observed_version < ? OR (report_observed_version = ? AND report_observed_at_ns <= ?))"

func (o Observation) guardArgs() []any {
	return []any{o.Version, o.Version, o.At.UnixNano()}
}

func (o Observation) newerThanOrEqual(version uint64, atNs int64) bool {
	return o.Version > version || (o.Version == version && o.At.UnixNano() >= atNs)
}

// ReportDeployment records a cluster's report on one deployment in region:
// its instances (a full snapshot for that cluster: instances it no longer
// lists are removed) and the replica summary. It returns accepted=false,
// and changes nothing, when the report is older than the stored one;
// ErrNotFound when the deployment has no topology in region.
func (s *Store) ReportDeployment(ctx context.Context, region, clusterID string, obs Observation, st *clusterv1.DeploymentStatus) (bool, error) {
	id := st.GetDeploymentId()
	accepted := false
	_, err := s.WriteTx(ctx, func(ctx context.Context, tx *Tx) error {
		accepted = false
		var storedVersion uint64
		var storedAt int64
		err := tx.QueryRow(ctx, "SELECT report_observed_version, report_observed_at_ns FROM deployment_topology WHERE deployment_id = ? AND region = ? FOR UPDATE",
			id, region).Scan(&storedVersion, &storedAt)
		if errors.Is(err, sql.ErrNoRows) {
			return ErrNotFound
		}
		if err != nil {
			return fmt.Errorf("store: read report guard of deployment %s in %s: %w", id, region, err)
		}
		if !obs.newerThanOrEqual(storedVersion, storedAt) {
			return nil
		}
		instances := st.GetInstances()
		if st.GetDeleted() {
			instances = nil
		}
		now := nowMillis()
		if len(instances) > 0 {
			var b strings.Builder
			args := make([]any, 0, len(instances)*14)
			b.WriteString(`INSERT INTO instances (deployment_id, region, cluster_id, k8s_name, address, cpu_millicores, memory_mib,
  status, reason, message, zone, observed_version, observed_at_ns, updated_at) VALUES `)
			for i, in := range instances {
				if in.GetK8SName() == "" {
					return fmt.Errorf("store: report on deployment %s lists an instance without a pod name", id)
				}
				if i > 0 {
					b.WriteString(", ")
				}
				b.WriteString("(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")
				args = append(args, id, region, clusterID, in.GetK8SName(), in.GetAddress(), in.GetCpuMillicores(), in.GetMemoryMib(),
					instanceStatus(in.GetStatus()), in.GetReason(), nullString(in.GetMessage()), in.GetZone(), obs.Version, obs.At.UnixNano(), now)
			}
			b.WriteString(` ON DUPLICATE KEY UPDATE address = VALUES(address), cpu_millicores = VALUES(cpu_millicores),
  memory_mib = VALUES(memory_mib), status = VALUES(status), reason = VALUES(reason), message = VALUES(message),
  zone = VALUES(zone), observed_version = VALUES(observed_version), observed_at_ns = VALUES(observed_at_ns),
  updated_at = VALUES(updated_at)`)
			if _, err := tx.Exec(ctx, b.String(), args...); err != nil {
				return fmt.Errorf("store: write instances of deployment %s in %s: %w", id, region, err)
			}
		}
		// Remove this cluster's instances the report no longer lists.
		del := "DELETE FROM instances WHERE deployment_id = ? AND region = ? AND cluster_id = ?"
		args := []any{id, region, clusterID}
		if len(instances) > 0 {
			del += " AND k8s_name NOT IN (?" + strings.Repeat(", ?", len(instances)-1) + ")"
			for _, in := range instances {
				args = append(args, in.GetK8SName())
			}
		}
		if _, err := tx.Exec(ctx, del, args...); err != nil {
			return fmt.Errorf("store: remove gone instances of deployment %s in %s: %w", id, region, err)
		}
		if _, err := tx.Exec(ctx, `UPDATE deployment_topology SET report_observed_version = ?, report_observed_at_ns = ?,
  reported_desired_replicas = ?, reported_ready_replicas = ?, reported_available_replicas = ?, reported_deleted = ?
WHERE deployment_id = ? AND region = ?`,
			obs.Version, obs.At.UnixNano(), st.GetDesiredReplicas(), st.GetReadyReplicas(), st.GetAvailableReplicas(), st.GetDeleted(),
			id, region); err != nil {
			return fmt.Errorf("store: write report summary of deployment %s in %s: %w", id, region, err)
		}
		accepted = true
		return nil
	})
	return accepted, err
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

// ReportSentinel records a sentinel's actual state with one guarded UPDATE.
// accepted=false when the report is older than the stored one; ErrNotFound
// when there is no such sentinel in region.
func (s *Store) ReportSentinel(ctx context.Context, region string, obs Observation, st *clusterv1.SentinelStatus) (bool, error) {
	args := []any{st.GetRunningImage(), st.GetAvailableReplicas(), st.GetUpdatedReplicas(), st.GetReadyReplicas(),
		st.GetObservedGeneration(), healthName(st.GetHealth()), st.GetReason(), st.GetDeleted(), obs.Version, obs.At.UnixNano(),
		st.GetSentinelId(), region}
	return s.guardedReport(ctx, "sentinels", `UPDATE sentinels SET running_image = ?, available_replicas = ?, updated_replicas = ?,
  ready_replicas = ?, observed_generation = ?, health = ?, health_reason = ?, reported_deleted = ?,
  report_observed_version = ?, report_observed_at_ns = ?
WHERE id = ? AND region = ? AND `+guardSQL, append(args, obs.guardArgs()...),
		"SELECT COUNT(*) FROM sentinels WHERE id = ? AND region = ?", st.GetSentinelId(), region)
}

// ReportCiliumNetworkPolicy records whether a policy was applied.
func (s *Store) ReportCiliumNetworkPolicy(ctx context.Context, region string, obs Observation, st *clusterv1.CiliumNetworkPolicyStatus) (bool, error) {
	args := []any{st.GetApplied(), nullString(st.GetMessage()), st.GetDeleted(), obs.Version, obs.At.UnixNano(), st.GetId(), region}
	return s.guardedReport(ctx, "cilium_network_policies", `UPDATE cilium_network_policies SET status_applied = ?, status_message = ?,
  reported_deleted = ?, report_observed_version = ?, report_observed_at_ns = ?
WHERE id = ? AND region = ? AND `+guardSQL, append(args, obs.guardArgs()...),
		"SELECT COUNT(*) FROM cilium_network_policies WHERE id = ? AND region = ?", st.GetId(), region)
}

// ReportResource records the status (a JSON document) of a generic
// resource.
func (s *Store) ReportResource(ctx context.Context, kind, region, id string, obs Observation, statusJSON []byte) (bool, error) {
	args := []any{string(statusJSON), obs.Version, obs.At.UnixNano(), kind, region, id}
	return s.guardedReport(ctx, "resources", `UPDATE resources SET status = ?, report_observed_version = ?, report_observed_at_ns = ?
WHERE kind = ? AND region = ? AND id = ? AND `+guardSQL, append(args, obs.guardArgs()...),
		"SELECT COUNT(*) FROM resources WHERE kind = ? AND region = ? AND id = ?", kind, region, id)
}

// guardedReport runs a guarded UPDATE; when it matches nothing, exists
// tells a stale report (false, nil) from a missing object (ErrNotFound).
func (s *Store) guardedReport(ctx context.Context, table, update string, args []any, exists string, existsArgs ...any) (bool, error) {
	res, err := s.db.ExecContext(ctx, update, args...)
	if err != nil {
		return false, fmt.Errorf("store: write report to %s: %w", table, err)
	}
	if n, err := res.RowsAffected(); err == nil && n > 0 {
		return true, nil
	}
	var count int
	if err := s.db.QueryRowContext(ctx, exists, existsArgs...).Scan(&count); err != nil {
		return false, fmt.Errorf("store: check report target in %s: %w", table, err)
	}
	if count == 0 {
		return false, ErrNotFound
	}
	return false, nil
}
