package cli_test

//lint:file-ignore SA1019 typed-rpcs: removed no earlier than v0.4.0 (docs/compatibility.md); this file calls a deprecated typed ClusterService RPC

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"krane.dev/ctrl/internal/ctrltest"
	"krane.dev/ctrl/vault"
	"krane.dev/internal/testenv"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
	ctrlv1 "krane.dev/proto/krane/ctrl/v1"
)

func TestVaultInitRotate(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keyring.yaml")
	code, out, errOut := run(t, "vault", "init", "--keyring-file", path)
	if code != 0 || !strings.HasPrefix(out, "created "+path+" with key k") {
		t.Fatalf("vault init: %d %q %q", code, out, errOut)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("keyring mode: %v %v", fi, err)
	}
	if code, _, errOut := run(t, "vault", "init", "--keyring-file", path); code == 0 || !strings.Contains(errOut, "already exists") {
		t.Fatalf("second init: %d %q", code, errOut)
	}
	// The configured file is the default.
	t.Setenv("CTRL_VAULT_KEYRING_FILE", path)
	code, out, errOut = run(t, "vault", "rotate")
	if code != 0 || !strings.Contains(out, "(2 keys)") {
		t.Fatalf("vault rotate: %d %q %q", code, out, errOut)
	}
	f, err := vault.ReadFile(path)
	if err != nil || len(f.Keys) != 2 || !strings.Contains(out, f.Keys[1].ID) {
		t.Fatalf("keyring after rotate: %v %v", f, err)
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	if code, _, errOut := run(t, "vault", "rotate"); code == 0 || !strings.Contains(errOut, "owner only") {
		t.Fatalf("rotate of a world-readable keyring: %d %q", code, errOut)
	}
	t.Setenv("CTRL_VAULT_KEYRING_FILE", "")
	if code, _, errOut := run(t, "vault", "rotate"); code == 0 || !strings.Contains(errOut, "--keyring-file") {
		t.Fatalf("rotate without a file: %d %q", code, errOut)
	}
}

// TestDeployCreateWithSecrets: --secret-env and --secret-env-file reach
// ctrl sealed; `deploy get` shows the names only; `vault audit` lists the
// cluster's request.
func TestDeployCreateWithSecrets(t *testing.T) {
	env := ctrltest.Start(t, ctrltest.Options{Restate: testenv.SharedRestate(t), Configure: ctrltest.WithKeyring(ctrltest.Keyring(t))})
	eu := env.FakeCluster(t, "eu", "eu-1")
	t.Setenv("CTRL_ADDR", env.Server.GRPCAddr())
	t.Setenv("CTRL_TOKEN", env.OperatorToken(t, "cli test"))
	t.Setenv("CTRL_DB_DSN", env.DSN)
	t.Setenv("FROM_ENV", "value-of-from-env")
	file := filepath.Join(t.TempDir(), "prod.env")
	if err := os.WriteFile(file, []byte("FILE_SECRET=\"value of file\"\nFLAG_SECRET=overridden\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := run(t, append(create, "--environment", "sec", "--image", "registry.test/app:1", "--region", "eu",
		"--secret-env", "FLAG_SECRET=value-of-flag", "--secret-env", "FROM_ENV", "--secret-env-file", file)...)
	if code != 0 {
		t.Fatalf("create: %d %q %q", code, out, errOut)
	}
	id := strings.TrimSpace(out)
	want := map[string]string{"FLAG_SECRET": "value-of-flag", "FROM_ENV": "value-of-from-env", "FILE_SECRET": "value of file"}
	ctrltest.WaitStatus(t, env.Deployments(t), id, 30*time.Second, ctrlv1.DeploymentStatus_DEPLOYMENT_STATUS_NETWORK) // placed in eu
	st, err := eu.Client.GetDesiredDeploymentState(context.Background(), &clusterv1.GetDesiredDeploymentStateRequest{DeploymentId: id})
	if err != nil {
		t.Fatal(err)
	}
	got, err := eu.Client.DecryptEnv(context.Background(), &clusterv1.DecryptEnvRequest{DeploymentId: id, EncryptedEnv: st.GetApply().GetEncryptedEnv()})
	if err != nil || len(got.GetEnv()) != 3 {
		t.Fatalf("decrypt: %v %v", got, err)
	}
	for k, v := range want {
		if got.GetEnv()[k] != v {
			t.Errorf("%s: got a different value than given", k)
		}
	}
	code, out, _ = run(t, "deploy", "get", id)
	if code != 0 || !strings.Contains(out, "Secret env:   FILE_SECRET, FLAG_SECRET, FROM_ENV (sealed; values are never shown)") {
		t.Fatalf("deploy get:\n%s", out)
	}
	code, jsonOut, _ := run(t, "deploy", "get", id, "-o", "json")
	for _, v := range want {
		if strings.Contains(out, v) || strings.Contains(jsonOut, v) || code != 0 {
			t.Fatal("deploy get shows a secret value")
		}
	}
	code, out, errOut = run(t, "vault", "audit", "--deployment", id)
	if code != 0 || !strings.Contains(out, id) || !strings.Contains(out, "eu-1") || !strings.Contains(out, "allowed") {
		t.Fatalf("vault audit: %d\n%s%s", code, out, errOut)
	}
}
