package store

import (
	"context"
	"fmt"
)

// ApplyErrorKey names the apply errors of one cluster on one kind.
type ApplyErrorKey struct {
	ClusterID string
	Kind      string
}

// ApplyErrorCounts counts the objects each cluster reported it could not
// apply, by cluster and kind (the fleet overview: what is stuck where).
func (s *Store) ApplyErrorCounts(ctx context.Context) (map[ApplyErrorKey]int, error) {
	rows, err := s.db.QueryContext(ctx, "SELECT cluster_id, kind, COUNT(*) FROM apply_errors GROUP BY cluster_id, kind")
	if err != nil {
		return nil, fmt.Errorf("store: count apply errors: %w", err)
	}
	defer rows.Close()
	out := map[ApplyErrorKey]int{}
	for rows.Next() {
		var k ApplyErrorKey
		var n int
		if err := rows.Scan(&k.ClusterID, &k.Kind, &n); err != nil {
			return nil, fmt.Errorf("store: count apply errors: %w", err)
		}
		out[k] = n
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: count apply errors: %w", err)
	}
	return out, nil
}
