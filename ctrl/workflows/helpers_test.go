package workflows_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"krane.dev/ctrl/internal/ctrltest"
	"krane.dev/ctrl/store"
	"krane.dev/internal/testenv"
	ctrlv1 "krane.dev/proto/krane/ctrl/v1"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// world is a real ctrl (MySQL, Restate) with fake clusters that report
// through the real ClusterService.
type world struct {
	env      *ctrltest.Env
	api      ctrlv1.DeploymentServiceClient
	clusters map[string]*ctrltest.FakeCluster // by region
}

func newWorld(t *testing.T, o ctrltest.Options, regions ...string) *world {
	t.Helper()
	if o.Restate == nil {
		o.Restate = testenv.SharedRestate(t)
	}
	env := ctrltest.Start(t, o)
	w := &world{env: env, api: env.Deployments(t), clusters: map[string]*ctrltest.FakeCluster{}}
	for _, r := range regions {
		w.clusters[r] = env.FakeCluster(t, r, r+"-1")
	}
	return w
}

func (w *world) create(t *testing.T, req *ctrlv1.CreateDeploymentRequest) string {
	t.Helper()
	if req.WorkspaceId == "" {
		req.WorkspaceId, req.ProjectId, req.AppId = "ws1", "proj1", "app1"
	}
	resp, err := w.api.CreateDeployment(context.Background(), req)
	if err != nil {
		t.Fatalf("CreateDeployment: %v", err)
	}
	return resp.GetDeploymentId()
}

type topologyRow struct {
	Replicas int32
	Status   string
	Version  uint64
}

func topology(t *testing.T, db *sql.DB, id string) map[string]topologyRow {
	t.Helper()
	rows, err := db.Query("SELECT region, desired_replicas, desired_status, version FROM deployment_topology WHERE deployment_id = ?", id)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]topologyRow{}
	for rows.Next() {
		var region string
		var r topologyRow
		if err := rows.Scan(&region, &r.Replicas, &r.Status, &r.Version); err != nil {
			t.Fatal(err)
		}
		out[region] = r
	}
	return out
}

type policyRow struct {
	Policy  string
	Version uint64
	Deleted bool
}

// compactJSON strips the whitespace a MySQL JSON column may add.
func compactJSON(t *testing.T, s string) string {
	t.Helper()
	var b bytes.Buffer
	if err := json.Compact(&b, []byte(s)); err != nil {
		t.Fatalf("policy is not JSON: %v: %s", err, s)
	}
	return b.String()
}

// ingressPolicies returns a deployment's ingress policies by region.
func ingressPolicies(t *testing.T, db *sql.DB, id string) map[string]policyRow {
	t.Helper()
	rows, err := db.Query("SELECT region, policy, version, deleted FROM cilium_network_policies WHERE id LIKE ?", id+"-%")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]policyRow{}
	for rows.Next() {
		var region string
		var r policyRow
		if err := rows.Scan(&region, &r.Policy, &r.Version, &r.Deleted); err != nil {
			t.Fatal(err)
		}
		out[region] = r
	}
	return out
}

type sentinelRow struct {
	ID, Image string
	Version   uint64
	UpdatedAt int64
}

func sentinels(t *testing.T, db *sql.DB, env string) map[string]sentinelRow {
	t.Helper()
	rows, err := db.Query("SELECT region, id, image, version, updated_at FROM sentinels WHERE environment_id = ?", env)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]sentinelRow{}
	for rows.Next() {
		var region string
		var s sentinelRow
		if err := rows.Scan(&region, &s.ID, &s.Image, &s.Version, &s.UpdatedAt); err != nil {
			t.Fatal(err)
		}
		out[region] = s
	}
	return out
}

func history(t *testing.T, st *store.Store, id string) []string {
	t.Helper()
	events, err := st.DeploymentEvents(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range events {
		if len(out) == 0 || out[len(out)-1] != e.Status {
			out = append(out, e.Status)
		}
	}
	return out
}

func wantHistory(t *testing.T, st *store.Store, id string, want ...string) {
	t.Helper()
	if got := history(t, st, id); !slices.Equal(got, want) {
		t.Fatalf("history of %s = %v, want %v", id, got, want)
	}
}

// grantCovering returns the version grant that covers v (first, last).
func grantCovering(t *testing.T, db *sql.DB, v uint64) (uint64, uint64) {
	t.Helper()
	var first, last uint64
	if err := db.QueryRow("SELECT first_version, last_version FROM version_grants WHERE first_version <= ? AND last_version >= ?", v, v).Scan(&first, &last); err != nil {
		t.Fatalf("no version grant covers version %d: %v", v, err)
	}
	return first, last
}

func wait(t *testing.T, what string, timeout time.Duration, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

const (
	pending   = ctrlv1.DeploymentStatus_DEPLOYMENT_STATUS_PENDING
	deploying = ctrlv1.DeploymentStatus_DEPLOYMENT_STATUS_DEPLOYING
	network   = ctrlv1.DeploymentStatus_DEPLOYMENT_STATUS_NETWORK
	ready     = ctrlv1.DeploymentStatus_DEPLOYMENT_STATUS_READY
	failed    = ctrlv1.DeploymentStatus_DEPLOYMENT_STATUS_FAILED
	stopped   = ctrlv1.DeploymentStatus_DEPLOYMENT_STATUS_STOPPED
)
