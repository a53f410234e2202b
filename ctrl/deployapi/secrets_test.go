package deployapi_test

//lint:file-ignore SA1019 legacy-workload: removed no earlier than v0.3.0 (docs/compatibility.md); this file builds or reads the deprecated top-level workload fields

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"krane.dev/ctrl/deployspec"
	"krane.dev/ctrl/internal/ctrltest"
	"krane.dev/ctrl/store"
	"krane.dev/ctrl/vault"
	"krane.dev/internal/testenv"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
	ctrlv1 "krane.dev/proto/krane/ctrl/v1"
)

func secret(t *testing.T) string {
	t.Helper()
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return "s3cr3t-" + hex.EncodeToString(b)
}

// sealedOf reads a deployment's sealed blob as its cluster receives it.
func sealedOf(t *testing.T, c *ctrltest.FakeCluster, id string) []byte {
	t.Helper()
	st, err := c.Client.GetDesiredDeploymentState(context.Background(), &clusterv1.GetDesiredDeploymentStateRequest{DeploymentId: id})
	if err != nil {
		t.Fatalf("desired state of %s in %s: %v", id, c.Region, err)
	}
	return st.GetApply().GetEncryptedEnv()
}

func decrypt(c clusterv1.ClusterServiceClient, id string, blob []byte) (map[string]string, error) {
	resp, err := c.DecryptEnv(context.Background(), &clusterv1.DecryptEnvRequest{DeploymentId: id, EncryptedEnv: blob})
	return resp.GetEnv(), err
}

// TestSecretEnv covers the ctrl side of issue 10 against real MySQL and
// Restate: secrets are sealed at create, only their names come back, only a
// cluster of the deployment's region opens them (audited), a blob opens
// only for its own deployment, rotation keeps old blobs open, a rollback
// re-seals, and neither the database nor ctrl's log holds a value or token.
func TestSecretEnv(t *testing.T) {
	keyring := ctrltest.Keyring(t)
	env := ctrltest.Start(t, ctrltest.Options{Restate: testenv.SharedRestate(t), Configure: ctrltest.WithKeyring(keyring)})
	operator := env.OperatorToken(t, "secrets test")
	api := ctrlv1.NewDeploymentServiceClient(env.Dial(t, operator))
	euToken, usToken := env.ClusterToken(t, "eu", "eu-1"), env.ClusterToken(t, "us", "us-1")
	eu := ctrltest.NewFakeCluster(t, "eu", "eu-1", env.Cluster(t, euToken))
	us := env.Cluster(t, usToken)
	ctrltest.KeepHeartbeating(t, us)
	ctx := context.Background()

	secretsX := map[string]string{"DB_PASSWORD": secret(t), "API_TOKEN": secret(t)}
	secretsY := map[string]string{"DB_PASSWORD": secret(t)}
	rx := req("env-sec", "registry.test/app:1")
	rx.Regions, rx.SecretEnv, rx.EnvVars = []string{"eu"}, secretsX, map[string]string{"PLAIN": "visible"}
	x := deploy(t, api, eu, rx)
	if !slices.Equal(x.GetSecretEnvKeys(), []string{"API_TOKEN", "DB_PASSWORD"}) {
		t.Fatalf("secret_env_keys %v, want the names, sorted", x.GetSecretEnvKeys())
	}
	raw, _ := proto.Marshal(x)
	for _, v := range secretsX {
		if bytes.Contains(raw, []byte(v)) {
			t.Fatal("GetDeployment returned a secret value")
		}
	}

	// The region's cluster opens it; the blob it gets holds no plaintext.
	blobX := sealedOf(t, eu, x.GetId())
	for _, v := range secretsX {
		if len(blobX) == 0 || bytes.Contains(blobX, []byte(v)) {
			t.Fatalf("the cluster's encrypted_env (%d bytes) is empty or holds plaintext", len(blobX))
		}
	}
	start := time.Now()
	got, err := decrypt(eu.Client, x.GetId(), blobX)
	if err != nil || !maps.Equal(got, secretsX) {
		t.Fatalf("eu opens its deployment: %v", err)
	}
	t.Logf("DecryptEnv round trip (gRPC, token check, MySQL read, audit insert): %s", time.Since(start).Round(time.Microsecond))

	// Another region's token, an operator token, no token: refused.
	if _, err := decrypt(us, x.GetId(), blobX); code(err) != codes.PermissionDenied {
		t.Fatalf("us opens an eu deployment: %v, want PermissionDenied", err)
	}
	if _, err := decrypt(env.Cluster(t, operator), x.GetId(), blobX); code(err) != codes.PermissionDenied {
		t.Fatalf("an operator token opens it: %v, want PermissionDenied", err)
	}
	if _, err := decrypt(env.Cluster(t, ""), x.GetId(), blobX); code(err) != codes.Unauthenticated {
		t.Fatalf("no token: %v, want Unauthenticated", err)
	}
	// A cluster token claiming another region in its metadata: refused.
	if _, err := decrypt(env.Cluster(t, usToken, "x-krane-region", "eu"), x.GetId(), blobX); code(err) != codes.PermissionDenied {
		t.Fatalf("us token claiming eu: %v, want PermissionDenied", err)
	}

	// X's blob presented for Y, Y's for X, a forged one, a missing id: refused.
	ry := req("env-sec", "registry.test/app:2")
	ry.Regions, ry.SecretEnv = []string{"eu"}, secretsY
	y := deploy(t, api, eu, ry)
	blobY := sealedOf(t, eu, y.GetId())
	if _, err := decrypt(eu.Client, y.GetId(), blobX); code(err) != codes.PermissionDenied {
		t.Fatalf("X's blob for Y: %v, want PermissionDenied", err)
	}
	if _, err := decrypt(eu.Client, x.GetId(), blobY); code(err) != codes.PermissionDenied {
		t.Fatalf("Y's blob for X: %v, want PermissionDenied", err)
	}
	forged := bytes.Clone(blobX)
	forged[len(forged)-1] ^= 1
	if _, err := decrypt(eu.Client, x.GetId(), forged); code(err) != codes.PermissionDenied {
		t.Fatalf("altered blob: %v, want PermissionDenied", err)
	}
	if _, err := decrypt(eu.Client, "dep_nonexistent", blobX); code(err) != codes.PermissionDenied {
		t.Fatalf("unknown deployment: %v, want PermissionDenied (like another region's)", err)
	}
	if got, err := decrypt(eu.Client, y.GetId(), blobY); err != nil || !maps.Equal(got, secretsY) {
		t.Fatalf("eu opens Y: %v", err)
	}

	// Every request is audited: allowed and denied, with cluster, region
	// and (for the operator) the token's id.
	checkAudit(t, env.Store, x.GetId(), map[string]int{"allowed/eu/eu-1": 1, "denied/us/us-1": 1, "denied//": 1, "denied/claimed:eu/": 1, "denied/eu/eu-1": 2})

	// Rotation: blobs sealed before and after both open.
	key, err := vault.Rotate(keyring, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	rz := req("env-sec", "registry.test/app:3")
	rz.Regions, rz.SecretEnv = []string{"eu"}, map[string]string{"DB_PASSWORD": secret(t)}
	var z *ctrlv1.DeploymentInfo
	deadline := time.Now().Add(10 * time.Second)
	for {
		// ctrl re-reads the keyring within a second.
		z = deploy(t, api, eu, rz)
		if id, _ := vault.KeyID(sealedOf(t, eu, z.GetId())); id == key.ID {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("deployments are not sealed with the rotated key %s", key.ID)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if oldKey, _ := vault.KeyID(blobX); oldKey == key.ID {
		t.Fatal("X was sealed with the new key")
	}
	for _, c := range []struct {
		id   string
		blob []byte
		want map[string]string
	}{{x.GetId(), blobX, secretsX}, {z.GetId(), sealedOf(t, eu, z.GetId()), rz.SecretEnv}} {
		if got, err := decrypt(eu.Client, c.id, c.blob); err != nil || !maps.Equal(got, c.want) {
			t.Fatalf("after rotation, open %s: %v", c.id, err)
		}
	}

	// Rollback to X: a new deployment with X's secrets, re-sealed for it.
	if _, err := api.Promote(ctx, &ctrlv1.PromoteRequest{DeploymentId: z.GetId()}); err != nil {
		t.Fatal(err)
	}
	rb, err := api.Rollback(ctx, &ctrlv1.RollbackRequest{EnvironmentId: "env-sec", TargetDeploymentId: x.GetId()})
	if err != nil {
		t.Fatal(err)
	}
	r := reportReady(t, api, eu, rb.GetDeploymentId())
	blobR := sealedOf(t, eu, r.GetId())
	if bytes.Equal(blobR, blobX) || !slices.Equal(r.GetSecretEnvKeys(), x.GetSecretEnvKeys()) {
		t.Fatal("the rollback copied X's blob instead of re-sealing it")
	}
	if id, _ := vault.KeyID(blobR); id != key.ID {
		t.Errorf("rollback sealed with %s, want the newest key %s", id, key.ID)
	}
	if got, err := decrypt(eu.Client, r.GetId(), blobR); err != nil || !maps.Equal(got, secretsX) {
		t.Fatalf("open the rollback's secrets: %v", err)
	}

	// A stopped deployment's secrets no longer open.
	if _, err := api.StopDeployment(ctx, &ctrlv1.StopDeploymentRequest{DeploymentId: y.GetId()}); err != nil {
		t.Fatal(err)
	}
	if _, err := decrypt(eu.Client, y.GetId(), blobY); code(err) != codes.PermissionDenied {
		t.Fatalf("stopped deployment: %v, want PermissionDenied", err)
	}

	// The database holds ciphertext only; ctrl's log holds no value and no
	// token.
	values := []string{}
	for _, m := range []map[string]string{secretsX, secretsY, rz.SecretEnv} {
		values = append(values, slices.Collect(maps.Values(m))...)
	}
	found, cells, err := testenv.FindInDatabase(ctx, env.Store.DB(), values...)
	if err != nil {
		t.Fatal(err)
	}
	if len(found) > 0 {
		t.Fatalf("plaintext secrets in the database: %v", found)
	}
	t.Logf("searched %d cells of every table for %d secret values (plain, base64, hex): none found", cells, len(values))
	var stored []byte
	if err := env.Store.DB().QueryRow("SELECT encrypted_env FROM deployments WHERE id = ?", x.GetId()).Scan(&stored); err != nil || !bytes.Equal(stored, blobX) {
		t.Fatalf("deployments.encrypted_env of X is not the blob the cluster got: %v", err)
	}
	logs := env.Logs.String()
	for _, needle := range append(values, euToken, usToken, operator) {
		for _, form := range testenv.LeakForms(needle) {
			if strings.Contains(logs, form) {
				t.Fatalf("ctrl's log contains a secret value or token")
			}
		}
	}
	if !strings.Contains(logs, "secret environment opened") || !strings.Contains(logs, "decryption refused") {
		t.Error("ctrl's log does not record the decryptions (by id)")
	}
}

// TestSecretEnvValidation: bad names and values are refused naming the
// field, never echoing a value; a ctrl without keyring cannot open.
func TestSecretEnvValidation(t *testing.T) {
	env := ctrltest.Start(t, ctrltest.Options{Restate: testenv.SharedRestate(t), Configure: ctrltest.WithKeyring(ctrltest.Keyring(t))})
	api := env.Deployments(t)
	env.FakeCluster(t, "eu", "eu-1")
	value := secret(t)
	for name, mutate := range map[string]func(*ctrlv1.CreateDeploymentRequest){
		"bad name": func(r *ctrlv1.CreateDeploymentRequest) { r.SecretEnv = map[string]string{"1BAD": value} },
		"also plain": func(r *ctrlv1.CreateDeploymentRequest) {
			r.SecretEnv, r.EnvVars = map[string]string{"A": value}, map[string]string{"A": "x"}
		},
		"NUL in value": func(r *ctrlv1.CreateDeploymentRequest) { r.SecretEnv = map[string]string{"A": value + "\x00"} },
		"too large": func(r *ctrlv1.CreateDeploymentRequest) {
			r.SecretEnv = map[string]string{"A": value + strings.Repeat("x", vault.MaxBlobSize)}
		},
	} {
		r := req("env-v", "registry.test/app:1")
		mutate(r)
		_, err := api.CreateDeployment(context.Background(), r)
		if code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "secret_env") || strings.Contains(err.Error(), value) {
			t.Errorf("%s: %v, want InvalidArgument naming secret_env without the value", name, err)
		}
	}

	// Without a keyring, ctrl refuses to open (and says why), audited.
	bare := ctrltest.Start(t, ctrltest.Options{})
	c := bare.FakeCluster(t, "eu", "eu-1")
	d := store.Deployment{Spec: deployspec.Spec{ID: "dep_x", WorkspaceID: "w", ProjectID: "p", EnvironmentID: "e", AppID: "a", K8sNamespace: "ws-w", K8sName: "dep-x", Replicas: 1, EncryptedEnv: []byte("sealed elsewhere"), SecretEnvKeys: []string{"A"}, Workload: &clusterv1.Workload{Image: "registry.test/app:1", CpuMillicores: 1, MemoryMib: 1}}}
	if _, err := bare.Store.WriteTx(context.Background(), func(ctx context.Context, tx *store.Tx) error {
		if err := tx.PutDeployment(ctx, d); err != nil {
			return err
		}
		return tx.PutTopology(ctx, store.Topology{DeploymentID: d.ID, Region: "eu", DesiredReplicas: 1, DesiredStatus: "running"})
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := decrypt(c.Client, d.ID, d.EncryptedEnv); code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "vault.keyring_file") {
		t.Fatalf("ctrl without keyring: %v, want FailedPrecondition naming vault.keyring_file", err)
	}
	if a, _ := bare.Store.VaultAudit(context.Background(), d.ID, 10); len(a) != 1 || a[0].Outcome != store.VaultFailed {
		t.Fatalf("audit %+v, want one failed entry", a)
	}
}

// checkAudit checks the vault audit of id: the number of entries per
// outcome/region/cluster, each with a token id and a time.
func checkAudit(t *testing.T, st *store.Store, id string, want map[string]int) {
	t.Helper()
	audit, err := st.VaultAudit(context.Background(), id, 100)
	if err != nil {
		t.Fatal(err)
	}
	count := map[string]int{}
	for _, e := range audit {
		count[e.Outcome+"/"+e.Region+"/"+e.ClusterID]++
		if e.TokenID == "" || e.At.IsZero() {
			t.Errorf("audit entry without a token id or time: %+v", e)
		}
	}
	if !maps.Equal(count, want) {
		t.Fatalf("audit of %s: %v, want %v (%+v)", id, count, want, audit)
	}
}
