package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"krane.dev/ctrl/api"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
	"krane.dev/shared/kinds"
)

// What a sentinel routes (SentinelRoutes: its environment's hosts and live
// deployment) is kept on each sentinel row, in sentinels.routes, so that it
// travels to the cluster as the sentinel's desired state: every change of
// either (a promote, a rollback, a deploy going live, new hosts, a new
// sentinel) rewrites the routes of the environment's sentinels whose routes
// differ, in the transaction that made it, and touches them, giving them
// new versions. The sentinel plugin hands them to the sentinel pods.

// routesJSON is how routes are stored.
var routesJSON = protojson.MarshalOptions{UseProtoNames: true}

// defaultPort is the port of a workload that names none (deployspec's
// default, which the stored workload already carries).
const defaultPort = 8080

// EnvironmentHosts returns an environment's hosts, sorted.
func (s *Store) EnvironmentHosts(ctx context.Context, environmentID string) ([]string, error) {
	rows, err := s.db.QueryContext(ctx, "SELECT host FROM environment_hosts WHERE environment_id = ? ORDER BY host", environmentID)
	if err != nil {
		return nil, fmt.Errorf("store: read the hosts of environment %s: %w", environmentID, err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var h string
		if err := rows.Scan(&h); err != nil {
			return nil, err
		}
		out = append(out, h)
	}
	return out, rows.Err()
}

// SetEnvironmentHosts replaces an environment's hosts (checked and lower
// cased by the caller) and refreshes its sentinels' routes. A host of
// another environment is refused, as an *api.FieldError naming it.
func (t *Tx) SetEnvironmentHosts(ctx context.Context, environmentID string, hosts []string) error {
	if len(hosts) > 0 {
		args := []any{environmentID}
		for _, h := range hosts {
			args = append(args, h)
		}
		var host, owner string
		err := t.QueryRow(ctx, "SELECT host, environment_id FROM environment_hosts WHERE environment_id != ? AND host IN ("+placeholders(len(hosts))+") LIMIT 1 FOR UPDATE", args...).Scan(&host, &owner)
		switch {
		case err == nil:
			return &api.FieldError{Field: "hosts", Reason: fmt.Sprintf("%s is a host of environment %s: remove it there first (a host routes to one environment)", host, owner)}
		case !errors.Is(err, sql.ErrNoRows):
			return fmt.Errorf("store: read the owners of hosts: %w", err)
		}
	}
	if _, err := t.Exec(ctx, "DELETE FROM environment_hosts WHERE environment_id = ?", environmentID); err != nil {
		return fmt.Errorf("store: replace the hosts of environment %s: %w", environmentID, err)
	}
	now := nowMillis()
	for _, h := range hosts {
		if _, err := t.Exec(ctx, "INSERT INTO environment_hosts (host, environment_id, created_at) VALUES (?, ?, ?)", h, environmentID, now); err != nil {
			if mysqlErrNumber(err) == 1062 {
				return &api.FieldError{Field: "hosts", Reason: fmt.Sprintf("%s became a host of another environment meanwhile: try again", h)}
			}
			return fmt.Errorf("store: add host %s to environment %s: %w", h, environmentID, err)
		}
	}
	return t.RefreshRoutes(ctx, environmentID)
}

// RefreshRoutes computes the routes of an environment's sentinels from its
// hosts and live deployment, writes them on every sentinel of the
// environment whose routes differ, and touches those.
func (t *Tx) RefreshRoutes(ctx context.Context, environmentID string) error {
	routes := &clusterv1.SentinelRoutes{}
	rows, err := t.Query(ctx, "SELECT host FROM environment_hosts WHERE environment_id = ? ORDER BY host", environmentID)
	if err != nil {
		return fmt.Errorf("store: read the hosts of environment %s: %w", environmentID, err)
	}
	for rows.Next() {
		var h string
		if err := rows.Scan(&h); err != nil {
			rows.Close()
			return err
		}
		routes.Hosts = append(routes.Hosts, h)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("store: read the hosts of environment %s: %w", environmentID, err)
	}
	var live sql.NullString
	if err := t.QueryRow(ctx, "SELECT live_deployment_id FROM environments WHERE id = ?", environmentID).Scan(&live); err != nil && !errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("store: read the live deployment of environment %s: %w", environmentID, err)
	}
	if live.String != "" {
		b := &clusterv1.RouteBackend{DeploymentId: live.String}
		var doc []byte
		err := t.QueryRow(ctx, "SELECT k8s_namespace, k8s_name, workload FROM deployments WHERE id = ?", live.String).Scan(&b.K8SNamespace, &b.K8SName, &doc)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			b = nil // the live deployment is gone: nothing to route to
		case err != nil:
			return fmt.Errorf("store: read live deployment %s of environment %s: %w", live.String, environmentID, err)
		default:
			w, err := decodeWorkload(live.String, doc)
			if err != nil {
				return err
			}
			b.Port = w.GetPort()
			if b.Port == 0 {
				b.Port = defaultPort
			}
		}
		routes.Backend = b
	}
	want, err := routesJSON.Marshal(routes)
	if err != nil {
		return fmt.Errorf("store: encode the routes of environment %s: %w", environmentID, err)
	}
	rows, err = t.Query(ctx, "SELECT id, region, routes FROM sentinels WHERE environment_id = ? FOR UPDATE", environmentID)
	if err != nil {
		return fmt.Errorf("store: read the sentinels of environment %s: %w", environmentID, err)
	}
	type sentinel struct{ id, region string }
	var stale []sentinel
	for rows.Next() {
		var s sentinel
		var have sql.NullString
		if err := rows.Scan(&s.id, &s.region, &have); err != nil {
			rows.Close()
			return err
		}
		if !sameRoutes(have.String, want) {
			stale = append(stale, s)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("store: read the sentinels of environment %s: %w", environmentID, err)
	}
	for _, s := range stale {
		if _, err := t.Exec(ctx, "UPDATE sentinels SET routes = ?, updated_at = ? WHERE id = ?", string(want), nowMillis(), s.id); err != nil {
			return fmt.Errorf("store: write the routes of sentinel %s: %w", s.id, err)
		}
		t.Touch(kinds.Sentinel, s.region, s.id)
	}
	return nil
}

// sameRoutes compares stored routes with new ones as messages (the
// database may have normalised the JSON's spacing).
func sameRoutes(have string, want []byte) bool {
	if have == "" {
		return false
	}
	a, b := &clusterv1.SentinelRoutes{}, &clusterv1.SentinelRoutes{}
	return protojson.Unmarshal([]byte(have), a) == nil && protojson.Unmarshal(want, b) == nil && proto.Equal(a, b)
}

// decodeRoutes reads a sentinel's stored routes (nil when none).
func decodeRoutes(id string, doc sql.NullString) (*clusterv1.SentinelRoutes, error) {
	if !doc.Valid || strings.TrimSpace(doc.String) == "" {
		return nil, nil
	}
	r := &clusterv1.SentinelRoutes{}
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal([]byte(doc.String), r); err != nil {
		return nil, fmt.Errorf("store: the routes of sentinel %s are corrupt: %w", id, err)
	}
	return r, nil
}
