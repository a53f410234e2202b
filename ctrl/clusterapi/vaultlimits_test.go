package clusterapi_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"krane.dev/ctrl/auth"
	"krane.dev/ctrl/internal/ctrltest"
	"krane.dev/ctrl/serve"
	"krane.dev/ctrl/store"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
)

func auditRows(t *testing.T, st *store.Store) int {
	t.Helper()
	var n int
	if err := st.DB().QueryRow("SELECT COUNT(*) FROM vault_audit").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestDecryptEnvIsRateLimitedPerCluster: a cluster looping DecryptEnv is
// told to retry later past vault.decrypt_per_minute, and those calls add
// no audit row; another cluster is not held back.
func TestDecryptEnvIsRateLimitedPerCluster(t *testing.T) {
	keyring := ctrltest.Keyring(t)
	env := ctrltest.Start(t, ctrltest.Options{Configure: func(c *serve.Config) {
		ctrltest.WithKeyring(keyring)(c)
		c.Vault.DecryptPerMinute = 3
	}})
	ctx := context.Background()
	one := env.Cluster(t, env.ClusterToken(t, "eu", "eu-1"))
	two := env.Cluster(t, env.ClusterToken(t, "eu", "eu-2"))
	req := &clusterv1.DecryptEnvRequest{DeploymentId: "dep_none", EncryptedEnv: []byte("x")}
	for i := range 3 {
		if _, err := one.DecryptEnv(ctx, req); status.Code(err) != codes.PermissionDenied {
			t.Fatalf("call %d: %v, want PERMISSION_DENIED (no such deployment)", i+1, err)
		}
	}
	if n := auditRows(t, env.Store); n != 3 {
		t.Fatalf("%d audit rows after 3 calls, want 3", n)
	}
	for range 5 {
		if _, err := one.DecryptEnv(ctx, req); status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("a call past the limit: %v, want RESOURCE_EXHAUSTED", err)
		}
	}
	if n := auditRows(t, env.Store); n != 3 {
		t.Fatalf("%d audit rows after the limited calls, want still 3", n)
	}
	if _, err := two.DecryptEnv(ctx, req); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("another cluster: %v, want PERMISSION_DENIED (it has its own limit)", err)
	}
}

// TestVaultAuditRowsExpire: rows older than vault.audit_retention are
// deleted (when ctrl starts, then hourly); newer ones stay.
func TestVaultAuditRowsExpire(t *testing.T) {
	first := ctrltest.Start(t, ctrltest.Options{})
	ctx := context.Background()
	now := time.Now()
	for _, e := range []store.VaultAuditEntry{
		{DeploymentID: "dep_old", Outcome: store.VaultDenied, At: now.Add(-3 * time.Hour)},
		{DeploymentID: "dep_older", Outcome: store.VaultDenied, At: now.Add(-48 * time.Hour)},
		{DeploymentID: "dep_new", Outcome: store.VaultDenied, At: now.Add(-30 * time.Minute)},
	} {
		if err := first.Store.RecordVaultAudit(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	ctrltest.Start(t, ctrltest.Options{DSN: first.DSN, Configure: func(c *serve.Config) { c.Vault.AuditRetention = 2 * time.Hour }})
	deadline := time.Now().Add(time.Minute)
	for auditRows(t, first.Store) != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("%d audit rows a minute after a ctrl with a 2h retention started, want the one of 30 minutes ago", auditRows(t, first.Store))
		}
		time.Sleep(20 * time.Millisecond)
	}
	var id string
	if err := first.Store.DB().QueryRow("SELECT deployment_id FROM vault_audit").Scan(&id); err != nil || id != "dep_new" {
		t.Fatalf("the row kept: %q %v, want dep_new", id, err)
	}
}

// TestRefusedDecryptEnvIsAuditedWithinTheLimit: calls refused at
// authentication (a cluster token claiming another region, an operator's
// token) are audited, but no faster than vault.decrypt_per_minute per
// token, checked before anything is written: 40 such calls add 3 rows.
func TestRefusedDecryptEnvIsAuditedWithinTheLimit(t *testing.T) {
	keyring := ctrltest.Keyring(t)
	env := ctrltest.Start(t, ctrltest.Options{Configure: func(c *serve.Config) {
		ctrltest.WithKeyring(keyring)(c)
		c.Vault.DecryptPerMinute = 3
	}})
	ctx := context.Background()
	elsewhere := env.Cluster(t, env.ClusterToken(t, "eu", "eu-1"), auth.RegionHeader, "us")
	operator := env.Cluster(t, env.OperatorToken(t, "ops"))
	req := &clusterv1.DecryptEnvRequest{DeploymentId: "dep_none", EncryptedEnv: []byte("x")}
	for name, cli := range map[string]clusterv1.ClusterServiceClient{"a cluster token claiming another region": elsewhere, "an operator token": operator} {
		before := auditRows(t, env.Store)
		for i := range 40 {
			if _, err := cli.DecryptEnv(ctx, req); status.Code(err) != codes.PermissionDenied {
				t.Fatalf("%s, call %d: %v; want PERMISSION_DENIED", name, i, err)
			}
		}
		if n := auditRows(t, env.Store) - before; n != 3 {
			t.Errorf("%s: 40 refused calls wrote %d audit rows; want 3 (vault.decrypt_per_minute)", name, n)
		}
	}
}
