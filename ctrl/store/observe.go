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
// desired state and its cluster's last report say together.
const (
	TopologyStarting = "starting" // desired running, fewer ready replicas than desired
	TopologyStarted  = "started"  // desired running, every desired replica ready
	TopologyStopping = "stopping" // desired stopped, not yet reported deleted
	TopologyStopped  = "stopped"  // desired stopped and reported deleted
)

// TopologyStates counts the stamped topology rows of every region by state
// (one grouped query over deployment_topology).
func (s *Store) TopologyStates(ctx context.Context) ([]RegionCount, error) {
	return s.regionCounts(ctx, "topology rows", `SELECT region, CASE
  WHEN desired_status = 'running' AND reported_ready_replicas >= desired_replicas THEN '`+TopologyStarted+`'
  WHEN desired_status = 'running' THEN '`+TopologyStarting+`'
  WHEN reported_deleted THEN '`+TopologyStopped+`'
  ELSE '`+TopologyStopping+`' END AS state, COUNT(*)
FROM deployment_topology WHERE version > 0 GROUP BY region, state ORDER BY region, state`)
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
