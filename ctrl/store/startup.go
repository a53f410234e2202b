package store

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	clusterv1 "krane.dev/proto/krane/cluster/v1"
)

// startedInstances finds the instances that the deployment reports at idx
// show running for the first time (not running in their cluster's stored
// rows) and returns, by index in reps, how long each took from its
// creation to the observation of the report. Only instances that carry
// their creation time are measured. The caller holds the reports' rows
// (object_reports, locked), so two reports of one cluster on one
// deployment cannot both see an instance start.
func startedInstances(ctx context.Context, tx *sql.Tx, reps []Report, idx []int) (map[int][]time.Duration, error) {
	var b strings.Builder
	var args []any
	for _, i := range idx {
		r := &reps[i]
		for _, in := range r.Instances {
			if measurable(in) {
				if len(args) > 0 {
					b.WriteString(" OR ")
				}
				b.WriteString("(deployment_id = ? AND region = ? AND cluster_id = ?)")
				args = append(args, r.ID, r.Region, r.ClusterID)
				break
			}
		}
	}
	if len(args) == 0 {
		return nil, nil // nothing to measure: no query on the report path
	}
	rows, err := tx.QueryContext(ctx, "SELECT deployment_id, region, cluster_id, k8s_name FROM instances WHERE status = 'running' AND ("+b.String()+")", args...)
	if err != nil {
		return nil, fmt.Errorf("store: read running instances of %d deployment reports: %w", len(args)/3, err)
	}
	defer rows.Close()
	running := map[string]bool{}
	for rows.Next() {
		var dep, region, cluster, name string
		if err := rows.Scan(&dep, &region, &cluster, &name); err != nil {
			return nil, fmt.Errorf("store: read running instances: %w", err)
		}
		running[dep+"\x00"+region+"\x00"+cluster+"\x00"+name] = true
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: read running instances: %w", err)
	}
	out := map[int][]time.Duration{}
	for _, i := range idx {
		r := &reps[i]
		for _, in := range r.Instances {
			if !measurable(in) || running[r.ID+"\x00"+r.Region+"\x00"+r.ClusterID+"\x00"+in.GetK8SName()] {
				continue
			}
			// A clock skew between the cluster and the pod's creation can
			// make this negative: not a startup time.
			if d := r.Obs.At.Sub(in.GetCreatedAt().AsTime()); d >= 0 {
				out[i] = append(out[i], d)
			}
		}
	}
	return out, nil
}

func measurable(in *clusterv1.Instance) bool {
	return in.GetStatus() == clusterv1.Instance_STATUS_RUNNING && in.GetCreatedAt().IsValid() &&
		(in.GetCreatedAt().GetSeconds() != 0 || in.GetCreatedAt().GetNanos() != 0)
}
