package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"krane.dev/ctrl/actual"
	"krane.dev/shared/kinds"
)

// Deployment statuses. A deploy moves pending -> deploying -> network ->
// ready, or to failed from any of the first three; stopped is an operator's
// decision. Every change is a compare-and-set (TransitionDeployment), so a
// late or repeated step never overwrites a later status.
const (
	StatusPending   = "pending"
	StatusDeploying = "deploying"
	StatusNetwork   = "network"
	StatusReady     = "ready"
	StatusFailed    = "failed"
	StatusStopped   = "stopped"
)

// InProgress lists the statuses of a deploy that has not finished.
var InProgress = []string{StatusPending, StatusDeploying, StatusNetwork}

const deploymentColumns = `id, workspace_id, project_id, environment_id, app_id, k8s_namespace, k8s_name,
  replicas, workload, encrypted_env, secret_env_keys, status, error, idempotency_key, rolled_back_from, requested_regions, timeout_seconds, created_at, updated_at`

func scanDeploymentRow(s scanner) (Deployment, error) {
	var (
		d                         Deployment
		workload, regions         []byte
		secretKeys                []byte
		errMsg, idemKey, rollback sql.NullString
		created, updated          int64
	)
	if err := s.Scan(&d.ID, &d.WorkspaceID, &d.ProjectID, &d.EnvironmentID, &d.AppID, &d.K8sNamespace, &d.K8sName,
		&d.Replicas, &workload, &d.EncryptedEnv, &secretKeys, &d.Status, &errMsg, &idemKey, &rollback, &regions, &d.TimeoutSeconds, &created, &updated); err != nil {
		return Deployment{}, err
	}
	d.Error, d.IdempotencyKey, d.RolledBackFrom = errMsg.String, idemKey.String, rollback.String
	d.CreatedAt, d.UpdatedAt = time.UnixMilli(created).UTC(), time.UnixMilli(updated).UTC()
	var err error
	if d.Workload, err = decodeWorkload(d.ID, workload); err != nil {
		return Deployment{}, err
	}
	if len(secretKeys) > 0 && string(secretKeys) != "null" {
		if err := json.Unmarshal(secretKeys, &d.SecretEnvKeys); err != nil {
			return Deployment{}, fmt.Errorf("deployments.secret_env_keys of %s is not a JSON array of strings: %w", d.ID, err)
		}
	}
	if len(regions) > 0 && string(regions) != "null" {
		if err := json.Unmarshal(regions, &d.Regions); err != nil {
			return Deployment{}, fmt.Errorf("deployments.requested_regions of %s is not a JSON array of strings: %w", d.ID, err)
		}
	}
	return d, nil
}

// insertDeployment inserts a new row in status pending and the first entry
// of its history. A duplicate id or idempotency key is MySQL error 1062.
func insertDeployment(ctx context.Context, tx *Tx, d Deployment, note string) error {
	if err := d.check(); err != nil {
		return err
	}
	d.Status = StatusPending
	workload, err := encodeWorkload(d.Workload)
	if err != nil {
		return fmt.Errorf("store: create deployment %s: encode its workload: %w", d.ID, err)
	}
	var regions sql.NullString
	if len(d.Regions) > 0 {
		b, _ := json.Marshal(d.Regions)
		regions = sql.NullString{String: string(b), Valid: true}
	}
	now := nowMillis()
	if _, err := tx.Exec(ctx, `INSERT INTO deployments (id, workspace_id, project_id, environment_id, app_id, k8s_namespace, k8s_name,
  replicas, workload, encrypted_env, secret_env_keys, status, idempotency_key, rolled_back_from, requested_regions, timeout_seconds, created_at, updated_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		d.ID, d.WorkspaceID, d.ProjectID, d.EnvironmentID, d.AppID, d.K8sNamespace, d.K8sName,
		d.Replicas, workload, d.EncryptedEnv, secretKeysJSON(d.SecretEnvKeys),
		d.Status, nullString(d.IdempotencyKey), nullString(d.RolledBackFrom), regions, d.TimeoutSeconds, now, now); err != nil {
		return fmt.Errorf("store: create deployment %s: %w", d.ID, err)
	}
	return tx.RecordEvent(ctx, d.ID, StatusPending, note)
}

// CreateDeployment inserts a new deployment in status pending. When a
// deployment with the same idempotency key exists (or is created
// concurrently), it writes nothing and returns that deployment's id with
// existed = true.
func (s *Store) CreateDeployment(ctx context.Context, d Deployment, note string) (id string, existed bool, err error) {
	if d.IdempotencyKey != "" {
		id, err := s.DeploymentByIdempotencyKey(ctx, d.IdempotencyKey)
		if err == nil {
			return id, true, nil
		}
		if !errors.Is(err, ErrNotFound) {
			return "", false, err
		}
	}
	_, err = s.WriteTx(ctx, func(ctx context.Context, tx *Tx) error { return insertDeployment(ctx, tx, d, note) })
	if err != nil && mysqlErrNumber(err) == 1062 && d.IdempotencyKey != "" {
		// A concurrent request with the same key won the race.
		if id, err2 := s.DeploymentByIdempotencyKey(ctx, d.IdempotencyKey); err2 == nil {
			return id, true, nil
		}
	}
	if err != nil {
		return "", false, err
	}
	return d.ID, false, nil
}

// DeploymentByIdempotencyKey returns the id of the deployment created with
// key; ErrNotFound when there is none.
func (s *Store) DeploymentByIdempotencyKey(ctx context.Context, key string) (string, error) {
	var id string
	err := s.db.QueryRowContext(ctx, "SELECT id FROM deployments WHERE idempotency_key = ?", key).Scan(&id)
	if errors.Is(err, sql.ErrNoRows) {
		return "", ErrNotFound
	}
	if err != nil {
		return "", fmt.Errorf("store: look up idempotency key: %w", err)
	}
	return id, nil
}

// EnsureDeployment inserts d in status pending unless a row with its id
// exists, and returns the row's status: the deploy workflow's idempotent
// "create" step (the API normally created the row already).
func (s *Store) EnsureDeployment(ctx context.Context, d Deployment, note string) (string, error) {
	var status string
	_, err := s.WriteTx(ctx, func(ctx context.Context, tx *Tx) error {
		var err error
		status, err = tx.LockDeployment(ctx, d.ID)
		if !errors.Is(err, ErrNotFound) {
			return err
		}
		status = StatusPending
		return insertDeployment(ctx, tx, d, note)
	})
	return status, err
}

// GetDeployment reads one deployment; ErrNotFound when there is none.
func (s *Store) GetDeployment(ctx context.Context, id string) (Deployment, error) {
	d, err := scanDeploymentRow(s.db.QueryRowContext(ctx, "SELECT "+deploymentColumns+" FROM deployments WHERE id = ?", id))
	if errors.Is(err, sql.ErrNoRows) {
		return Deployment{}, ErrNotFound
	}
	if err != nil {
		return Deployment{}, fmt.Errorf("store: read deployment %s: %w", id, err)
	}
	return d, nil
}

// DeploymentCursor is a position in an environment's deployments, newest
// first (keyset paging: no page re-reads the rows before it).
type DeploymentCursor struct {
	CreatedAt int64 // unix milliseconds
	ID        string
}

// ListDeployments returns up to limit deployments of an environment, newest
// first, after the cursor (the zero cursor starts at the newest).
func (s *Store) ListDeployments(ctx context.Context, environmentID string, after DeploymentCursor, limit int) ([]Deployment, error) {
	q := "SELECT " + deploymentColumns + " FROM deployments WHERE environment_id = ?"
	args := []any{environmentID}
	if after.ID != "" {
		q += " AND (created_at < ? OR (created_at = ? AND id < ?))"
		args = append(args, after.CreatedAt, after.CreatedAt, after.ID)
	}
	q += " ORDER BY created_at DESC, id DESC LIMIT ?"
	rows, err := s.db.QueryContext(ctx, q, append(args, limit)...)
	if err != nil {
		return nil, fmt.Errorf("store: list deployments of environment %s: %w", environmentID, err)
	}
	defer rows.Close()
	var out []Deployment
	for rows.Next() {
		d, err := scanDeploymentRow(rows)
		if err != nil {
			return nil, fmt.Errorf("store: list deployments of environment %s: %w", environmentID, err)
		}
		out = append(out, d)
	}
	return out, rows.Err()
}

// LockDeployment locks a deployment's row until the transaction ends and
// returns its status; ErrNotFound when there is none. Every status change
// and every write of the deploy workflow takes this lock first, so they are
// serialised per deployment.
func (t *Tx) LockDeployment(ctx context.Context, id string) (string, error) {
	// A read of this one deployment: kept writes of others need not go
	// first (deferred.go).
	if err := t.prepare(ctx, false, id); err != nil {
		return "", err
	}
	var status string
	var replicas int32
	// The replicas come along for ScaleTopology, which would otherwise
	// read the locked row again.
	err := t.tx.QueryRowContext(ctx, "SELECT status, replicas FROM deployments WHERE id = ? FOR UPDATE", id).Scan(&status, &replicas)
	if errors.Is(err, sql.ErrNoRows) {
		return "", fmt.Errorf("store: deployment %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return "", fmt.Errorf("store: lock deployment %s: %w", id, err)
	}
	t.cacheReplicas(id, replicas)
	return status, nil
}

// LockDeploymentToScale is LockDeployment that also locks the
// deployment's topology rows (the rows ScaleTopology locks), in the same
// statement, so that ScaleTopology after it sends none.
func (t *Tx) LockDeploymentToScale(ctx context.Context, id string) (string, error) {
	if err := t.prepare(ctx, false, id); err != nil {
		return "", err
	}
	rows, err := t.tx.QueryContext(ctx, `SELECT d.status, d.replicas, t.region, t.desired_status, t.desired_replicas
FROM deployments d LEFT JOIN deployment_topology t ON t.deployment_id = d.id
WHERE d.id = ? ORDER BY t.region FOR UPDATE`, id)
	if err != nil {
		return "", fmt.Errorf("store: lock deployment %s: %w", id, err)
	}
	defer rows.Close()
	var status string
	var replicas int32
	found := false
	topology := []topologyRow{}
	for rows.Next() {
		var region, desired sql.NullString
		var n sql.NullInt32
		if err := rows.Scan(&status, &replicas, &region, &desired, &n); err != nil {
			return "", fmt.Errorf("store: lock deployment %s: %w", id, err)
		}
		found = true
		if region.Valid {
			topology = append(topology, topologyRow{region: region.String, running: desired.String == "running", replicas: n.Int32})
		}
	}
	if err := rows.Err(); err != nil {
		return "", fmt.Errorf("store: lock deployment %s: %w", id, err)
	}
	if !found {
		return "", fmt.Errorf("store: deployment %s: %w", id, ErrNotFound)
	}
	t.cacheReplicas(id, replicas)
	if t.topology == nil {
		t.topology = map[string][]topologyRow{}
	}
	t.topology[id] = topology
	return status, nil
}

// topologyRow is a locked topology row as LockDeploymentToScale read it.
type topologyRow struct {
	region   string
	running  bool
	replicas int32
}

func (t *Tx) cacheReplicas(id string, n int32) {
	if t.replicas == nil {
		t.replicas = map[string]int32{}
	}
	t.replicas[id] = n
}

// TransitionDeployment moves a deployment to status to if its status is
// one of from (compare-and-set), and records the change in its history.
// message becomes the deployment's error when to is failed. It returns
// whether it changed anything and the status the deployment has now.
func (t *Tx) TransitionDeployment(ctx context.Context, id string, from []string, to, message string) (bool, string, error) {
	cur, err := t.LockDeployment(ctx, id)
	if err != nil {
		return false, "", err
	}
	if !slices.Contains(from, cur) {
		return false, cur, nil
	}
	var errMsg sql.NullString
	if to == StatusFailed {
		errMsg = nullString(message)
	}
	if _, err := t.Exec(ctx, "UPDATE deployments SET status = ?, error = ?, updated_at = ? WHERE id = ?", to, errMsg, nowMillis(), id); err != nil {
		return false, "", fmt.Errorf("store: set status of deployment %s to %s: %w", id, to, err)
	}
	if err := t.RecordEvent(ctx, id, to, message); err != nil {
		return false, "", err
	}
	return true, to, nil
}

// TransitionDeployment is Tx.TransitionDeployment in a transaction of its
// own.
func (s *Store) TransitionDeployment(ctx context.Context, id string, from []string, to, message string) (changed bool, current string, err error) {
	_, err = s.WriteTx(ctx, func(ctx context.Context, tx *Tx) error {
		changed, current, err = tx.TransitionDeployment(ctx, id, from, to, message)
		return err
	})
	return changed, current, err
}

// RecordEvent appends to a deployment's history (status is the status the
// entry is filed under). The caller must hold the deployment's row lock
// (LockDeployment), so sequence numbers never collide. The entry is sent
// with the transaction's other kept writes (deferred.go): an error in it
// (an unknown status) fails the transaction, not this call.
func (t *Tx) RecordEvent(ctx context.Context, id, status, message string) error {
	t.own.events = append(t.own.events, deferredEvent{id: id, status: status, message: message, at: nowMillis()})
	return nil
}

// NoteDeployment adds message to a deployment's history, filed under its
// current status (no status change).
func (t *Tx) NoteDeployment(ctx context.Context, id, message string) error {
	status, err := t.LockDeployment(ctx, id)
	if err != nil {
		return err
	}
	return t.RecordEvent(ctx, id, status, message)
}

// DeploymentEvent is one entry of a deployment's status history.
type DeploymentEvent struct {
	Seq     int
	Status  string
	Message string
	At      time.Time
}

// DeploymentEvents returns a deployment's status history, oldest first.
func (s *Store) DeploymentEvents(ctx context.Context, id string) ([]DeploymentEvent, error) {
	rows, err := s.db.QueryContext(ctx, "SELECT seq, status, COALESCE(message, ''), created_at FROM deployment_events WHERE deployment_id = ? ORDER BY seq", id)
	if err != nil {
		return nil, fmt.Errorf("store: read history of deployment %s: %w", id, err)
	}
	defer rows.Close()
	var out []DeploymentEvent
	for rows.Next() {
		var e DeploymentEvent
		var at int64
		if err := rows.Scan(&e.Seq, &e.Status, &e.Message, &at); err != nil {
			return nil, err
		}
		e.At = time.UnixMilli(at).UTC()
		out = append(out, e)
	}
	return out, rows.Err()
}

// StopTopology marks every topology row of a deployment stopped (a soft
// delete), and deletes the ingress policies that let its environment reach
// it. With touch the rows get new versions when the transaction commits;
// without, the caller stamps the returned refs after the commit
// (StampCommitted). It returns the ref of every topology row and of every
// ingress policy of the deployment, deleted now or before, so a step run
// twice returns the same refs: the second run finds the deletes committed
// and must still hand them to the stamp that follows.
func (t *Tx) StopTopology(ctx context.Context, deploymentID string, touch bool) ([]Ref, error) {
	rows, err := t.Query(ctx, "SELECT region FROM deployment_topology WHERE deployment_id = ? ORDER BY region FOR UPDATE", deploymentID)
	if err != nil {
		return nil, fmt.Errorf("store: read topology of deployment %s: %w", deploymentID, err)
	}
	var regions []string
	for rows.Next() {
		var region string
		if err := rows.Scan(&region); err != nil {
			rows.Close()
			return nil, err
		}
		regions = append(regions, region)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if _, err := t.Exec(ctx, "UPDATE deployment_topology SET desired_status = 'stopped', updated_at = ? WHERE deployment_id = ? AND desired_status <> 'stopped'",
		nowMillis(), deploymentID); err != nil {
		return nil, fmt.Errorf("store: stop topology of deployment %s: %w", deploymentID, err)
	}
	refs := make([]Ref, 0, 2*len(regions))
	for _, region := range regions {
		refs = append(refs, Ref{Kind: kinds.Deployment, Region: region, ID: deploymentID})
	}
	// The ingress policies go with the deployment: every one that exists
	// (a deployment written before they existed has none), deleted now or
	// by an earlier run of the caller's step.
	for _, region := range regions {
		id := IngressPolicyID(deploymentID, region)
		var deleted bool
		err := t.QueryRow(ctx, "SELECT deleted FROM cilium_network_policies WHERE id = ? AND region = ? FOR UPDATE", id, region).Scan(&deleted)
		if errors.Is(err, sql.ErrNoRows) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("store: read ingress policy of deployment %s in %s: %w", deploymentID, region, err)
		}
		if !deleted {
			if _, err := t.Exec(ctx, "UPDATE cilium_network_policies SET deleted = TRUE, updated_at = ? WHERE id = ? AND region = ?", nowMillis(), id, region); err != nil {
				return nil, fmt.Errorf("store: delete ingress policy of deployment %s in %s: %w", deploymentID, region, err)
			}
		}
		refs = append(refs, Ref{Kind: kinds.CiliumNetworkPolicy, Region: region, ID: id})
	}
	if touch {
		for _, r := range refs {
			t.Touch(r.Kind, r.Region, r.ID)
		}
	}
	return refs, nil
}

// ScaleTopology sets the replicas per region of a deployment's running
// topology rows and of the deployment itself; changed rows get new
// versions when the transaction commits. It returns the replicas the
// deployment had before. The caller holds the deployment's row lock
// (LockDeployment; after LockDeploymentToScale, ScaleTopology sends no
// statement of its own).
func (t *Tx) ScaleTopology(ctx context.Context, deploymentID string, replicas int32) (int32, error) {
	if err := t.prepare(ctx, false, deploymentID); err != nil {
		return 0, err
	}
	var err error
	before, ok := t.replicas[deploymentID]
	if !ok {
		if err := t.tx.QueryRowContext(ctx, "SELECT replicas FROM deployments WHERE id = ?", deploymentID).Scan(&before); err != nil {
			return 0, fmt.Errorf("store: read replicas of deployment %s: %w", deploymentID, err)
		}
	}
	var regions []string
	if topology, ok := t.topology[deploymentID]; ok {
		for _, r := range topology {
			if r.running && r.replicas != replicas {
				regions = append(regions, r.region)
			}
		}
	} else if regions, err = t.lockScaledRegions(ctx, deploymentID, replicas); err != nil {
		return 0, err
	}
	// The rows are locked above, so the kept UPDATE changes exactly those
	// regions when it is sent.
	t.own.addScale(deferredScale{id: deploymentID, regions: regions, replicas: replicas})
	t.cacheReplicas(deploymentID, replicas)
	delete(t.topology, deploymentID) // read again (after sending) if asked again
	for _, region := range regions {
		t.Touch(kinds.Deployment, region, deploymentID)
	}
	return before, nil
}

// lockScaledRegions locks a deployment's running topology rows whose
// replicas are not n, and returns their regions.
func (t *Tx) lockScaledRegions(ctx context.Context, deploymentID string, n int32) ([]string, error) {
	rows, err := t.tx.QueryContext(ctx, "SELECT region FROM deployment_topology WHERE deployment_id = ? AND desired_status = 'running' AND desired_replicas <> ? ORDER BY region FOR UPDATE",
		deploymentID, n)
	if err != nil {
		return nil, fmt.Errorf("store: read topology of deployment %s: %w", deploymentID, err)
	}
	defer rows.Close()
	var regions []string
	for rows.Next() {
		var region string
		if err := rows.Scan(&region); err != nil {
			return nil, fmt.Errorf("store: read topology of deployment %s: %w", deploymentID, err)
		}
		regions = append(regions, region)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: read topology of deployment %s: %w", deploymentID, err)
	}
	return regions, nil
}

// Instance is one pod of a deployment as its cluster last reported it.
type Instance struct {
	Region, ClusterID, K8sName, Address string
	// Status: pending, running, failed or inactive.
	Status, Reason, Message string
	UpdatedAt               time.Time
}

// RegionState is a deployment in one region: what is desired and what the
// region's clusters report.
type RegionState struct {
	Region          string
	DesiredReplicas int32
	// DesiredStatus: running or stopped.
	DesiredStatus            string
	Version                  uint64
	Running, Pending, Failed int32
	Instances                []Instance
	// ApplyErrors are the changes of this deployment the region's clusters
	// could not apply.
	ApplyErrors []ApplyError
	// Actual is what the region's clusters reported, by the aggregation
	// rule (ctrl/actual): which clusters count, and which have applied
	// Version.
	Actual actual.Region
}

// CountedInstances are the instances of the clusters that count (by the
// aggregation rule), by cluster id.
func (r RegionState) CountedInstances() map[string][]Instance {
	out := make(map[string][]Instance, len(r.Actual.Counted))
	for _, id := range r.Actual.Counted {
		out[id] = nil
	}
	for _, in := range r.Instances {
		if _, ok := out[in.ClusterID]; ok {
			out[in.ClusterID] = append(out[in.ClusterID], in)
		}
	}
	return out
}

// RegionStates returns the per-region state of each of ids (regions in
// name order), with three queries whatever the number of ids.
func (s *Store) RegionStates(ctx context.Context, ids ...string) (map[string][]RegionState, error) {
	out := map[string][]RegionState{}
	if len(ids) == 0 {
		return out, nil
	}
	in := "(" + placeholders(len(ids)) + ")"
	args := make([]any, len(ids))
	for i, id := range ids {
		args[i] = id
	}
	type key struct{ id, region string }
	index := map[key]int{}

	rows, err := s.db.QueryContext(ctx, `SELECT deployment_id, region, desired_replicas, desired_status, version
FROM deployment_topology WHERE deployment_id IN `+in+` ORDER BY deployment_id, region`, args...)
	if err != nil {
		return nil, fmt.Errorf("store: read topology: %w", err)
	}
	for rows.Next() {
		var id string
		var r RegionState
		if err := rows.Scan(&id, &r.Region, &r.DesiredReplicas, &r.DesiredStatus, &r.Version); err != nil {
			rows.Close()
			return nil, err
		}
		index[key{id, r.Region}] = len(out[id])
		out[id] = append(out[id], r)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}

	rows, err = s.db.QueryContext(ctx, `SELECT deployment_id, region, cluster_id, k8s_name, address, status, reason, COALESCE(message, ''), updated_at
FROM instances WHERE deployment_id IN `+in+` ORDER BY deployment_id, region, cluster_id, k8s_name`, args...)
	if err != nil {
		return nil, fmt.Errorf("store: read instances: %w", err)
	}
	for rows.Next() {
		var id string
		var in Instance
		var at int64
		if err := rows.Scan(&id, &in.Region, &in.ClusterID, &in.K8sName, &in.Address, &in.Status, &in.Reason, &in.Message, &at); err != nil {
			rows.Close()
			return nil, err
		}
		in.UpdatedAt = time.UnixMilli(at).UTC()
		i, ok := index[key{id, in.Region}]
		if !ok {
			continue // a region the deployment has no topology in
		}
		r := &out[id][i]
		r.Instances = append(r.Instances, in)
		switch in.Status {
		case "running":
			r.Running++
		case "pending":
			r.Pending++
		case "failed":
			r.Failed++
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}

	rows, err = s.db.QueryContext(ctx, `SELECT kind, region, id, cluster_id, version, message, field, permanent, updated_at
FROM apply_errors WHERE kind = ? AND id IN `+in+` ORDER BY id, region, cluster_id`, append([]any{kinds.Deployment}, args...)...)
	if err != nil {
		return nil, fmt.Errorf("store: read apply errors: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var e ApplyError
		var at int64
		if err := rows.Scan(&e.Kind, &e.Region, &e.ID, &e.ClusterID, &e.Version, &e.Message, &e.Field, &e.Permanent, &at); err != nil {
			return nil, err
		}
		e.UpdatedAt = time.UnixMilli(at).UTC()
		if i, ok := index[key{e.ID, e.Region}]; ok {
			r := &out[e.ID][i]
			r.ApplyErrors = append(r.ApplyErrors, e)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	var ds []desiredObj
	errs := map[objKey][]ApplyError{}
	for id, regions := range out {
		for _, r := range regions {
			k := objKey{kinds.Deployment, r.Region, id}
			ds = append(ds, desiredObj{objKey: k, version: r.Version, deleted: r.DesiredStatus != "running" || r.DesiredReplicas <= 0})
			errs[k] = r.ApplyErrors
		}
	}
	rolled, err := s.rollUp(ctx, ds, errs)
	if err != nil {
		return nil, err
	}
	for id, regions := range out {
		for i := range regions {
			regions[i].Actual = rolled[objKey{kinds.Deployment, regions[i].Region, id}]
		}
	}
	return out, nil
}

// ClusterRegions returns the regions that have at least one registered
// cluster with a valid token, in name order.
func (s *Store) ClusterRegions(ctx context.Context) ([]string, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT DISTINCT c.region FROM clusters c
WHERE EXISTS (SELECT 1 FROM api_tokens t WHERE t.cluster_id = c.id AND t.kind = 'cluster' AND t.revoked_at IS NULL
  AND (t.expires_at IS NULL OR t.expires_at > ?))
ORDER BY c.region`, nowMillis())
	if err != nil {
		return nil, fmt.Errorf("store: list regions with clusters: %w", err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var r string
		if err := rows.Scan(&r); err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// EnsureSentinels makes sure, for the deploy of deployment, that the
// environment of each candidate has a running sentinel in the candidate's
// region, all in one transaction:
//   - none: the candidate is inserted and versioned in the same
//     transaction;
//   - a stopped one: it is set running again, keeping its image and size,
//     with a new version;
//   - a running one: nothing changes (a deploy never upgrades a sentinel).
//
// It returns the sentinels the deploy must wait for (see SentinelWait), in
// candidate order, and files "waiting for sentinel S in region R" in the
// deployment's history for each, once. Running it again changes nothing
// and returns the same, so it is safe in a step that may run twice.
func (s *Store) EnsureSentinels(ctx context.Context, deploymentID string, candidates []Sentinel, reseal Resealer) ([]SentinelWait, error) {
	var waits []SentinelWait
	_, err := s.WriteTx(ctx, func(ctx context.Context, tx *Tx) error {
		waits = nil
		for _, c := range candidates {
			var id, state, deployStatus string
			var by sql.NullString
			err := tx.QueryRow(ctx, "SELECT id, desired_state, deploy_status, ensured_by FROM sentinels WHERE environment_id = ? AND region = ? FOR UPDATE",
				c.EnvironmentID, c.Region).Scan(&id, &state, &deployStatus, &by)
			w := SentinelWait{Region: c.Region}
			switch {
			case errors.Is(err, sql.ErrNoRows):
				if err := tx.PutSentinel(ctx, c); err != nil {
					return err
				}
				id = c.ID
				if err := tx.inheritCredentials(ctx, deploymentID, c, reseal); err != nil {
					return err
				}
			case err != nil:
				return fmt.Errorf("store: read sentinel of environment %s in %s: %w", c.EnvironmentID, c.Region, err)
			case state != "running":
				if _, err := tx.Exec(ctx, "UPDATE sentinels SET desired_state = 'running', updated_at = ? WHERE id = ?", nowMillis(), id); err != nil {
					return fmt.Errorf("store: restart sentinel %s: %w", id, err)
				}
				tx.Touch(kinds.Sentinel, c.Region, id)
			case by.String == deploymentID:
				// An earlier run of this deploy's step created or restarted
				// it (and noted it).
				w.ID, w.Ensured = id, true
				waits = append(waits, w)
				continue
			default:
				// Someone else's sentinel: wait only when nothing routes
				// through it yet (no live deployment) and it has not been
				// ready since it was created or restarted.
				live, err := tx.liveDeploymentNoLock(ctx, c.EnvironmentID)
				if err != nil {
					return err
				}
				if live != "" || deployStatus == SentinelReady {
					continue
				}
				w.ID = id
				if err := tx.noteOnce(ctx, deploymentID, w.Note()); err != nil {
					return err
				}
				waits = append(waits, w)
				continue
			}
			if _, err := tx.Exec(ctx, "UPDATE sentinels SET ensured_by = ? WHERE id = ?", deploymentID, id); err != nil {
				return fmt.Errorf("store: record which deploy ensured sentinel %s: %w", id, err)
			}
			w.ID, w.Ensured = id, true
			if err := tx.noteOnce(ctx, deploymentID, w.Note()); err != nil {
				return err
			}
			waits = append(waits, w)
		}
		return nil
	})
	return waits, err
}

// Resealer re-seals a sentinel's sealed credentials for another sentinel
// (ctrl's vault: vault.Source.Reseal).
type Resealer interface {
	Reseal(fromID string, blob []byte, toID string) ([]byte, error)
}

// inheritCredentials gives a sentinel EnsureSentinels just created the
// sealed credentials of its environment's most recently changed sentinel
// that has some, re-sealed for its id, in the same transaction (so its
// first version already carries them). When that cannot be done (no
// vault, a blob the vault cannot open), the deployment's history says so
// and how to set them; the sentinel starts without.
func (t *Tx) inheritCredentials(ctx context.Context, deploymentID string, c Sentinel, reseal Resealer) error {
	var from string
	var blob, names []byte
	err := t.QueryRow(ctx, `SELECT id, encrypted_credentials, credential_names FROM sentinels
WHERE environment_id = ? AND id <> ? AND encrypted_credentials IS NOT NULL ORDER BY updated_at DESC, id LIMIT 1`, c.EnvironmentID, c.ID).Scan(&from, &blob, &names)
	if errors.Is(err, sql.ErrNoRows) {
		return nil // the environment's sentinels have none
	}
	if err != nil {
		return fmt.Errorf("store: read the credentials of environment %s's sentinels: %w", c.EnvironmentID, err)
	}
	var list []string
	if len(names) > 0 {
		if err := json.Unmarshal(names, &list); err != nil {
			return fmt.Errorf("sentinels.credential_names of %s is not a JSON array of strings: %w", from, err)
		}
	}
	cannot := func(why string) error {
		return t.noteOnce(ctx, deploymentID, fmt.Sprintf("sentinel %s in region %s starts without credentials: sentinel %s of the environment has sealed credentials, but %s; set them with `ctrl sentinel deploy %s --credentials-file FILE`", c.ID, c.Region, from, why, c.ID))
	}
	if reseal == nil {
		return cannot("this ctrl has no vault keyring (vault.keyring_file) to re-seal them")
	}
	sealed, err := reseal.Reseal(from, blob, c.ID)
	if err != nil {
		return cannot(fmt.Sprintf("they could not be re-sealed for it (%v)", err))
	}
	if err := t.SetSentinelCredentials(ctx, c.ID, c.Region, sealed, list); err != nil {
		return err
	}
	return t.noteOnce(ctx, deploymentID, fmt.Sprintf("sentinel %s in region %s inherits the sealed credentials of sentinel %s (%s)", c.ID, c.Region, from, strings.Join(list, ", ")))
}

// LiveDeployment returns an environment's live deployment ("" when none),
// locking the environment's row until the transaction ends.
func (t *Tx) LiveDeployment(ctx context.Context, environmentID string) (string, error) {
	var live sql.NullString
	err := t.QueryRow(ctx, "SELECT live_deployment_id FROM environments WHERE id = ? FOR UPDATE", environmentID).Scan(&live)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return "", fmt.Errorf("store: read live deployment of environment %s: %w", environmentID, err)
	}
	return live.String, nil
}

// SetLiveDeployment makes deploymentID the environment's live deployment
// ("" clears it).
func (t *Tx) SetLiveDeployment(ctx context.Context, environmentID, deploymentID string) error {
	if _, err := t.Exec(ctx, `INSERT INTO environments (id, live_deployment_id, updated_at) VALUES (?, ?, ?)
ON DUPLICATE KEY UPDATE live_deployment_id = VALUES(live_deployment_id), updated_at = VALUES(updated_at)`,
		environmentID, nullString(deploymentID), nowMillis()); err != nil {
		return fmt.Errorf("store: set live deployment of environment %s: %w", environmentID, err)
	}
	return t.RefreshRoutes(ctx, environmentID)
}

// LiveDeployment returns an environment's live deployment ("" when none).
func (s *Store) LiveDeployment(ctx context.Context, environmentID string) (string, error) {
	var live sql.NullString
	err := s.db.QueryRowContext(ctx, "SELECT live_deployment_id FROM environments WHERE id = ?", environmentID).Scan(&live)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return "", fmt.Errorf("store: read live deployment of environment %s: %w", environmentID, err)
	}
	return live.String, nil
}

// EverReady reports whether a deployment ever reached ready.
func (s *Store) EverReady(ctx context.Context, id string) (bool, error) {
	var n int
	if err := s.db.QueryRowContext(ctx, "SELECT COUNT(*) FROM deployment_events WHERE deployment_id = ? AND status = 'ready'", id).Scan(&n); err != nil {
		return false, fmt.Errorf("store: read history of deployment %s: %w", id, err)
	}
	return n > 0, nil
}

// LastReadyBefore returns the newest deployment of d's environment created
// before d that ever reached ready; ErrNotFound when there is none.
func (s *Store) LastReadyBefore(ctx context.Context, d Deployment) (string, error) {
	created := d.CreatedAt.UnixMilli()
	var id string
	err := s.db.QueryRowContext(ctx, `SELECT d.id FROM deployments d
WHERE d.environment_id = ? AND (d.created_at < ? OR (d.created_at = ? AND d.id < ?))
  AND EXISTS (SELECT 1 FROM deployment_events e WHERE e.deployment_id = d.id AND e.status = 'ready')
ORDER BY d.created_at DESC, d.id DESC LIMIT 1`, d.EnvironmentID, created, created, d.ID).Scan(&id)
	if errors.Is(err, sql.ErrNoRows) {
		return "", ErrNotFound
	}
	if err != nil {
		return "", fmt.Errorf("store: find the last ready deployment before %s: %w", d.ID, err)
	}
	return id, nil
}

// Updated is a row's id and when it last changed (unix milliseconds): a
// position in a list ordered by (updated_at, id), for keyset paging that
// reaches every row however many never change.
type Updated struct {
	ID string
	At int64
}

// Before orders positions: by change time, then id.
func (u Updated) Before(v Updated) bool { return u.At < v.At || (u.At == v.At && u.ID < v.ID) }

// DeploymentsInStatus returns up to limit deployments in status that have
// not changed since before, after the position after (the zero value starts
// at the oldest), oldest change first.
func (s *Store) DeploymentsInStatus(ctx context.Context, status string, before time.Time, after Updated, limit int) ([]Updated, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT id, updated_at FROM deployments WHERE status = ? AND updated_at < ?
  AND (updated_at > ? OR (updated_at = ? AND id > ?)) ORDER BY updated_at, id LIMIT ?`,
		status, before.UnixMilli(), after.At, after.At, after.ID, limit)
	if err != nil {
		return nil, fmt.Errorf("store: list %s deployments: %w", status, err)
	}
	return scanUpdated(rows)
}

func scanUpdated(rows *sql.Rows) ([]Updated, error) {
	defer rows.Close()
	var out []Updated
	for rows.Next() {
		var u Updated
		if err := rows.Scan(&u.ID, &u.At); err != nil {
			return nil, err
		}
		out = append(out, u)
	}
	return out, rows.Err()
}
