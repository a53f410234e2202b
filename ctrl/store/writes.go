package store

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"krane.dev/ctrl/deployspec"
	"krane.dev/shared/kinds"
)

// Deployment is a deployments row: the deployment's Spec (one build of a
// workload, the same in every region; where and how many run is its
// topology) and its lifecycle. Its workload is one JSON document
// (workload.go). Deployment is not JSON-encoded: the Spec's JSON methods
// would stand for the whole of it.
type Deployment struct {
	deployspec.Spec
	// Status: pending (default), deploying, network, ready, failed, stopped.
	Status         string
	Error          string
	IdempotencyKey string
	// Regions and TimeoutSeconds are what the deploy was asked for (empty
	// regions: every region with a cluster). Written by CreateDeployment
	// and EnsureDeployment only.
	Regions        []string
	TimeoutSeconds int32
	// Read only.
	CreatedAt, UpdatedAt time.Time
}

func (d *Deployment) check() error {
	if d.ID == "" || d.K8sName == "" || d.K8sNamespace == "" || d.Workload.GetImage() == "" {
		return fmt.Errorf("store: deployment %q needs an id, k8s namespace, k8s name and a workload's image", d.ID)
	}
	return nil
}

// secretKeysJSON is the secret_env_keys column: NULL without secrets.
func secretKeysJSON(keys []string) sql.NullString {
	if len(keys) == 0 {
		return sql.NullString{}
	}
	b, _ := json.Marshal(keys)
	return sql.NullString{String: string(b), Valid: true}
}

func (d *Deployment) applyDefaults() {
	if d.Status == "" {
		d.Status = StatusPending
	}
}

// PutDeployment inserts or replaces a deployment's content. Every topology
// row of the deployment is touched, so each region receives the new
// content as a new version.
func (t *Tx) PutDeployment(ctx context.Context, d Deployment) error {
	if err := d.check(); err != nil {
		return err
	}
	d.applyDefaults()
	workload, err := encodeWorkload(d.Workload)
	if err != nil {
		return fmt.Errorf("store: write deployment %s: encode its workload: %w", d.ID, err)
	}
	now := nowMillis()
	_, err = t.Exec(ctx, `INSERT INTO deployments (id, workspace_id, project_id, environment_id, app_id, k8s_namespace, k8s_name,
  replicas, workload, encrypted_env, secret_env_keys, status, error, idempotency_key, rolled_back_from, created_at, updated_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
ON DUPLICATE KEY UPDATE workspace_id = VALUES(workspace_id), project_id = VALUES(project_id),
  environment_id = VALUES(environment_id), app_id = VALUES(app_id), k8s_namespace = VALUES(k8s_namespace),
  k8s_name = VALUES(k8s_name), replicas = VALUES(replicas), workload = VALUES(workload),
  encrypted_env = VALUES(encrypted_env), secret_env_keys = VALUES(secret_env_keys), status = VALUES(status),
  error = VALUES(error), idempotency_key = VALUES(idempotency_key), rolled_back_from = VALUES(rolled_back_from),
  updated_at = VALUES(updated_at)`,
		d.ID, d.WorkspaceID, d.ProjectID, d.EnvironmentID, d.AppID, d.K8sNamespace, d.K8sName,
		d.Replicas, workload, d.EncryptedEnv, secretKeysJSON(d.SecretEnvKeys), d.Status, nullString(d.Error), nullString(d.IdempotencyKey), nullString(d.RolledBackFrom), now, now)
	if err != nil {
		return fmt.Errorf("store: write deployment %s: %w", d.ID, err)
	}
	rows, err := t.Query(ctx, "SELECT region FROM deployment_topology WHERE deployment_id = ? ORDER BY region FOR UPDATE", d.ID)
	if err != nil {
		return fmt.Errorf("store: read topology of deployment %s: %w", d.ID, err)
	}
	var regions []string
	for rows.Next() {
		var r string
		if err := rows.Scan(&r); err != nil {
			rows.Close()
			return err
		}
		regions = append(regions, r)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	for _, r := range regions {
		t.Touch(kinds.Deployment, r, d.ID)
	}
	return nil
}

// Topology is a deployment's desired state in one region.
type Topology struct {
	DeploymentID    string
	Region          string
	DesiredReplicas int32
	// DesiredStatus: running or stopped. Stopped (or 0 replicas) is how a
	// deployment is deleted from a region.
	DesiredStatus string
}

// PutTopology inserts or replaces a deployment's topology in one region and
// touches it. The deployments row must exist.
func (t *Tx) PutTopology(ctx context.Context, tp Topology) error {
	return t.putTopology(ctx, tp, true)
}

// PutTopologyContent writes a topology row like PutTopology but does not
// touch it: the caller stamps it after the commit with StampCommitted (the
// VersioningService does, exactly once). Until then a new row has version
// 0 and is invisible to agents; an existing row shows its new content at
// its old version, which the later stamp supersedes.
func (t *Tx) PutTopologyContent(ctx context.Context, tp Topology) error {
	return t.putTopology(ctx, tp, false)
}

func (t *Tx) putTopology(ctx context.Context, tp Topology, touch bool) error {
	if tp.DesiredStatus == "" {
		tp.DesiredStatus = "running"
	}
	if tp.DesiredStatus != "running" && tp.DesiredStatus != "stopped" {
		return fmt.Errorf("store: topology of deployment %s in %s: desired status %q is not running or stopped", tp.DeploymentID, tp.Region, tp.DesiredStatus)
	}
	var exists int
	if err := t.QueryRow(ctx, "SELECT COUNT(*) FROM deployments WHERE id = ?", tp.DeploymentID).Scan(&exists); err != nil {
		return fmt.Errorf("store: check deployment %s: %w", tp.DeploymentID, err)
	}
	if exists == 0 {
		return fmt.Errorf("store: topology of deployment %s in %s: the deployment does not exist (write it first)", tp.DeploymentID, tp.Region)
	}
	now := nowMillis()
	if _, err := t.Exec(ctx, `INSERT INTO deployment_topology (deployment_id, region, desired_replicas, desired_status, created_at, updated_at)
VALUES (?, ?, ?, ?, ?, ?)
ON DUPLICATE KEY UPDATE desired_replicas = VALUES(desired_replicas), desired_status = VALUES(desired_status), updated_at = VALUES(updated_at)`,
		tp.DeploymentID, tp.Region, tp.DesiredReplicas, tp.DesiredStatus, now, now); err != nil {
		return fmt.Errorf("store: write topology of deployment %s in %s: %w", tp.DeploymentID, tp.Region, err)
	}
	if touch {
		t.Touch(kinds.Deployment, tp.Region, tp.DeploymentID)
	}
	return nil
}

// Sentinel is the desired state of one sentinel (an environment's routing
// proxy in one region).
type Sentinel struct {
	ID, Region                                   string
	WorkspaceID, ProjectID, AppID, EnvironmentID string
	K8sName                                      string
	Image                                        string
	Replicas                                     int32
	CPUMillicores, MemoryMiB                     int64
	// DesiredState: running or stopped (stopped deletes it from the cluster).
	DesiredState string
}

// PutSentinel inserts or replaces a sentinel's desired fields (its actual
// fields are only written by reports) and touches it. A sentinel's region
// never changes.
func (t *Tx) PutSentinel(ctx context.Context, s Sentinel) error {
	if s.DesiredState == "" {
		s.DesiredState = "running"
	}
	if s.DesiredState != "running" && s.DesiredState != "stopped" {
		return fmt.Errorf("store: sentinel %s: desired state %q is not running or stopped", s.ID, s.DesiredState)
	}
	if s.ID == "" || s.Region == "" || s.K8sName == "" || s.Image == "" {
		return fmt.Errorf("store: sentinel %q needs an id, region, k8s name and image", s.ID)
	}
	var region string
	err := t.QueryRow(ctx, "SELECT region FROM sentinels WHERE id = ? FOR UPDATE", s.ID).Scan(&region)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("store: read sentinel %s: %w", s.ID, err)
	}
	if err == nil && region != s.Region {
		return fmt.Errorf("store: sentinel %s is in region %s; it cannot move to %s (create a new sentinel)", s.ID, region, s.Region)
	}
	now := nowMillis()
	if _, err := t.Exec(ctx, `INSERT INTO sentinels (id, region, workspace_id, project_id, app_id, environment_id, k8s_name,
  image, replicas, cpu_millicores, memory_mib, desired_state, created_at, updated_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
ON DUPLICATE KEY UPDATE workspace_id = VALUES(workspace_id), project_id = VALUES(project_id), app_id = VALUES(app_id),
  environment_id = VALUES(environment_id), k8s_name = VALUES(k8s_name), image = VALUES(image), replicas = VALUES(replicas),
  cpu_millicores = VALUES(cpu_millicores), memory_mib = VALUES(memory_mib), desired_state = VALUES(desired_state),
  updated_at = VALUES(updated_at)`,
		s.ID, s.Region, s.WorkspaceID, s.ProjectID, s.AppID, s.EnvironmentID, s.K8sName,
		s.Image, s.Replicas, s.CPUMillicores, s.MemoryMiB, s.DesiredState, now, now); err != nil {
		return fmt.Errorf("store: write sentinel %s: %w", s.ID, err)
	}
	t.Touch(kinds.Sentinel, s.Region, s.ID)
	return t.RefreshRoutes(ctx, s.EnvironmentID)
}

// CiliumNetworkPolicy is the desired state of one Cilium network policy.
type CiliumNetworkPolicy struct {
	ID, Region            string
	K8sNamespace, K8sName string
	// Policy is a CiliumNetworkPolicy object (or its spec) as JSON.
	Policy  []byte
	Deleted bool
}

// PutCiliumNetworkPolicy inserts or replaces a policy and touches it.
func (t *Tx) PutCiliumNetworkPolicy(ctx context.Context, p CiliumNetworkPolicy) error {
	return t.putCiliumNetworkPolicy(ctx, p, true)
}

// PutCiliumNetworkPolicyContent writes a policy without versioning it
// (its version is stamped later, e.g. by the VersioningService together
// with a deployment's topology).
func (t *Tx) PutCiliumNetworkPolicyContent(ctx context.Context, p CiliumNetworkPolicy) error {
	return t.putCiliumNetworkPolicy(ctx, p, false)
}

func (t *Tx) putCiliumNetworkPolicy(ctx context.Context, p CiliumNetworkPolicy, touch bool) error {
	if p.ID == "" || p.Region == "" || p.K8sNamespace == "" || p.K8sName == "" {
		return fmt.Errorf("store: cilium network policy %q needs an id, region, k8s namespace and k8s name", p.ID)
	}
	if !json.Valid(p.Policy) {
		return fmt.Errorf("store: cilium network policy %s: the policy is not valid JSON", p.ID)
	}
	var region string
	err := t.QueryRow(ctx, "SELECT region FROM cilium_network_policies WHERE id = ? FOR UPDATE", p.ID).Scan(&region)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("store: read cilium network policy %s: %w", p.ID, err)
	}
	if err == nil && region != p.Region {
		return fmt.Errorf("store: cilium network policy %s is in region %s; it cannot move to %s", p.ID, region, p.Region)
	}
	now := nowMillis()
	if _, err := t.Exec(ctx, `INSERT INTO cilium_network_policies (id, region, k8s_namespace, k8s_name, policy, deleted, created_at, updated_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?)
ON DUPLICATE KEY UPDATE k8s_namespace = VALUES(k8s_namespace), k8s_name = VALUES(k8s_name), policy = VALUES(policy),
  deleted = VALUES(deleted), updated_at = VALUES(updated_at)`,
		p.ID, p.Region, p.K8sNamespace, p.K8sName, string(p.Policy), p.Deleted, now, now); err != nil {
		return fmt.Errorf("store: write cilium network policy %s: %w", p.ID, err)
	}
	if touch {
		t.Touch(kinds.CiliumNetworkPolicy, p.Region, p.ID)
	}
	return nil
}

// IngressPolicyID is the id of the policy that lets a deployment's
// environment reach it in one region (its ids fit the 64-character column
// whatever the region's name).
func IngressPolicyID(deploymentID, region string) string {
	sum := sha256.Sum256([]byte(region))
	return deploymentID + "-" + hex.EncodeToString(sum[:4])
}

// Resource is a row of the generic table, for kinds without their own.
type Resource struct {
	Kind, Region, ID string
	// Spec is a JSON object; agents receive it as a google.protobuf.Struct.
	Spec    []byte
	Deleted bool
}

// PutResource inserts or replaces a generic resource and touches it.
func (t *Tx) PutResource(ctx context.Context, r Resource) error {
	if IsBuiltIn(r.Kind) {
		return fmt.Errorf("store: kind %q has its own table; write it with its own method", r.Kind)
	}
	if !ValidKind(r.Kind) {
		return fmt.Errorf("store: %q is not a valid kind name (lowercase letters, digits, '.' and '-')", r.Kind)
	}
	if r.ID == "" || r.Region == "" {
		return fmt.Errorf("store: %s resource %q needs an id and a region", r.Kind, r.ID)
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(r.Spec, &obj); err != nil || obj == nil {
		return fmt.Errorf("store: %s %s: the spec must be a JSON object", r.Kind, r.ID)
	}
	now := nowMillis()
	if _, err := t.Exec(ctx, `INSERT INTO resources (kind, region, id, spec, deleted, created_at, updated_at)
VALUES (?, ?, ?, ?, ?, ?, ?)
ON DUPLICATE KEY UPDATE spec = VALUES(spec), deleted = VALUES(deleted), updated_at = VALUES(updated_at)`,
		r.Kind, r.Region, r.ID, string(r.Spec), r.Deleted, now, now); err != nil {
		return fmt.Errorf("store: write %s %s in %s: %w", r.Kind, r.ID, r.Region, err)
	}
	t.Touch(r.Kind, r.Region, r.ID)
	return nil
}
