package store

import (
	"context"
	"fmt"
)

// RegionCount is a number of rows of one region in one state.
type RegionCount struct {
	Region, State string
	N             int64
}

// Topology states, the design notes' names for what a topology row's
// desired state and its clusters' last reports say together.
const (
	TopologyStarting = "starting" // desired running, a reporting cluster has fewer ready replicas than desired (or none reported)
	TopologyStarted  = "started"  // desired running, every reporting cluster has every desired replica ready
	TopologyStopping = "stopping" // desired stopped, a cluster's report still shows it
	TopologyStopped  = "stopped"  // desired stopped, every report says deleted (or was pruned for it)
)

// TopologyStates counts the stamped topology rows of every region by state
// (one grouped query over deployment_topology and the clusters' reports).
// A metric over every row: it counts the reports of every cluster, live or
// not, where the readers of one object apply the rule of ctrl/actual.
func (s *Store) TopologyStates(ctx context.Context) ([]RegionCount, error) {
	return s.regionCounts(ctx, "topology rows", `SELECT t.region, CASE
  WHEN t.desired_status = 'running' AND r.min_ready >= t.desired_replicas THEN '`+TopologyStarted+`'
  WHEN t.desired_status = 'running' THEN '`+TopologyStarting+`'
  WHEN r.id IS NULL OR r.all_deleted THEN '`+TopologyStopped+`'
  ELSE '`+TopologyStopping+`' END AS state, COUNT(*)
FROM deployment_topology t LEFT JOIN (
  SELECT region, id, MIN(COALESCE(CAST(JSON_VALUE(status, '$.ready_replicas') AS SIGNED), 0)) AS min_ready, MIN(deleted) AS all_deleted
  FROM object_reports WHERE kind = 'deployment' GROUP BY region, id) r ON r.region = t.region AND r.id = t.deployment_id
WHERE t.version > 0 GROUP BY t.region, state ORDER BY t.region, state`)
}

// InstanceStates counts the instances clusters reported, by region and
// status (pending, running, failed, inactive).
func (s *Store) InstanceStates(ctx context.Context) ([]RegionCount, error) {
	return s.regionCounts(ctx, "instances", "SELECT region, status, COUNT(*) FROM instances GROUP BY region, status ORDER BY region, status")
}

func (s *Store) regionCounts(ctx context.Context, what, query string) ([]RegionCount, error) {
	rows, err := s.db.QueryContext(ctx, query)
	if err != nil {
		return nil, fmt.Errorf("store: count %s by region and state: %w", what, err)
	}
	defer rows.Close()
	var out []RegionCount
	for rows.Next() {
		var c RegionCount
		if err := rows.Scan(&c.Region, &c.State, &c.N); err != nil {
			return nil, fmt.Errorf("store: count %s by region and state: %w", what, err)
		}
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: count %s by region and state: %w", what, err)
	}
	return out, nil
}
