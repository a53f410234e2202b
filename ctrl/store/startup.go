package store

import (
	"context"
	"fmt"
	"time"

	clusterv1 "krane.dev/proto/krane/cluster/v1"
)

// startedInstances finds the instances that the taken reports show running
// for the first time (not running in this cluster's stored rows) and
// returns, by index in reps, how long each took from its creation to the
// observation of the report. Only instances that carry their creation time
// are measured. The caller holds the topology rows' locks, so two reports
// of one deployment cannot both see an instance start.
func startedInstances(ctx context.Context, tx *Tx, region, clusterID string, reps []DeploymentReport, take []int) (map[int][]time.Duration, error) {
	var ids []any
	for _, i := range take {
		for _, in := range liveInstances(reps[i].Status) {
			if measurable(in) {
				ids = append(ids, reps[i].Status.GetDeploymentId())
				break
			}
		}
	}
	if len(ids) == 0 {
		return nil, nil // nothing to measure: no query on the report path
	}
	args := append([]any{region, clusterID}, ids...)
	rows, err := tx.Query(ctx, "SELECT deployment_id, k8s_name FROM instances WHERE region = ? AND cluster_id = ? AND status = 'running' AND deployment_id IN ("+
		placeholders(len(ids))+")", args...)
	if err != nil {
		return nil, fmt.Errorf("store: read running instances of %d deployments in %s: %w", len(ids), region, err)
	}
	defer rows.Close()
	running := map[string]bool{}
	for rows.Next() {
		var dep, name string
		if err := rows.Scan(&dep, &name); err != nil {
			return nil, fmt.Errorf("store: read running instances in %s: %w", region, err)
		}
		running[dep+"\x00"+name] = true
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: read running instances in %s: %w", region, err)
	}
	out := map[int][]time.Duration{}
	for _, i := range take {
		r := reps[i]
		for _, in := range liveInstances(r.Status) {
			if !measurable(in) || running[r.Status.GetDeploymentId()+"\x00"+in.GetK8SName()] {
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
