package deployapi_test

import (
	"bytes"
	"context"
	"maps"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"krane.dev/ctrl/internal/ctrltest"
	"krane.dev/ctrl/store"
	"krane.dev/internal/testenv"
	ctrlv1 "krane.dev/proto/krane/ctrl/v1"
)

// storedCredentials reads a sentinel's sealed credentials as stored.
func storedCredentials(t *testing.T, env *ctrltest.Env, id string) []byte {
	t.Helper()
	var blob []byte
	if err := env.Store.DB().QueryRow("SELECT encrypted_credentials FROM sentinels WHERE id = ?", id).Scan(&blob); err != nil {
		t.Fatal(err)
	}
	return blob
}

// deploySentinel deploys and waits for the (fake) cluster to run it.
func deploySentinel(t *testing.T, api ctrlv1.SentinelServiceClient, r *ctrlv1.DeploySentinelRequest) *ctrlv1.DeploySentinelResponse {
	t.Helper()
	r.Wait = true
	resp, err := api.DeploySentinel(context.Background(), r)
	if err != nil || resp.GetResult() != "ready" {
		t.Fatalf("deploy sentinel %s: %v, %v %s", r.GetSentinelId(), err, resp.GetResult(), resp.GetMessage())
	}
	return resp
}

// TestSentinelCredentials covers the ctrl side of sentinel credentials
// against real MySQL and Restate: sealed at deploy (the column holds
// ciphertext, the API and the database no value), streamed as ciphertext to
// the sentinel's cluster, opened only by a cluster of the sentinel's region
// while it runs, every request audited; the same credentials again change
// nothing, a deploy without credentials keeps them, new ones replace them.
func TestSentinelCredentials(t *testing.T) {
	env := ctrltest.Start(t, ctrltest.Options{Restate: testenv.SharedRestate(t), Configure: ctrltest.WithKeyring(ctrltest.Keyring(t))})
	eu := env.SentinelCluster(t, "eu", "eu-1")
	us := env.SentinelCluster(t, "us", "us-1")
	ids := env.CreateSentinels(t, "eu", "sen_cred", "registry.test/sentinel:1", 2)
	id, other := ids[0], ids[1]
	api := env.Sentinels(t)
	ctx := context.Background()

	creds := map[string]string{"DATABASE_PRIMARY": secret(t), "REDIS_URL": secret(t), "CLICKHOUSE_URL": secret(t)}
	first := deploySentinel(t, api, &ctrlv1.DeploySentinelRequest{SentinelId: id, Credentials: creds})
	info := first.GetSentinel()
	if !slices.Equal(info.GetCredentialNames(), []string{"CLICKHOUSE_URL", "DATABASE_PRIMARY", "REDIS_URL"}) {
		t.Fatalf("credential_names %v, want the names, sorted", info.GetCredentialNames())
	}
	raw, _ := proto.Marshal(first)
	for _, v := range creds {
		if bytes.Contains(raw, []byte(v)) {
			t.Fatal("DeploySentinel returned a credential's value")
		}
	}

	// Sealed at rest, and the cluster gets exactly the stored ciphertext.
	blob := storedCredentials(t, env, id)
	if len(blob) == 0 {
		t.Fatal("sentinels.encrypted_credentials is empty after a deploy with credentials")
	}
	for _, v := range creds {
		if bytes.Contains(blob, []byte(v)) {
			t.Fatal("sentinels.encrypted_credentials holds plaintext")
		}
	}
	_, spec, ok := eu.Latest(id)
	if !ok || !bytes.Equal(spec.GetEncryptedCredentials(), blob) {
		t.Fatalf("the cluster's Sentinel.encrypted_credentials (%d bytes) is not the stored blob (%d bytes)", len(spec.GetEncryptedCredentials()), len(blob))
	}

	// The sentinel's region opens it; another region, an altered blob, a
	// sentinel without credentials, an unknown id: refused.
	if got, err := decrypt(eu.Client, id, blob); err != nil || !maps.Equal(got, creds) {
		t.Fatalf("eu opens its sentinel's credentials: %v", err)
	}
	if _, err := decrypt(us.Client, id, blob); code(err) != codes.PermissionDenied {
		t.Fatalf("us opens an eu sentinel's credentials: %v, want PermissionDenied", err)
	}
	if _, err := decrypt(eu.Client, other, blob); code(err) != codes.PermissionDenied {
		t.Fatalf("a sentinel without credentials: %v, want PermissionDenied", err)
	}
	forged := bytes.Clone(blob)
	forged[len(forged)-1] ^= 1
	if _, err := decrypt(eu.Client, id, forged); code(err) != codes.PermissionDenied {
		t.Fatalf("an altered blob: %v, want PermissionDenied", err)
	}
	if _, err := decrypt(eu.Client, "sen_nonexistent", blob); code(err) != codes.PermissionDenied {
		t.Fatalf("an unknown sentinel: %v, want PermissionDenied", err)
	}
	// A sentinel's blob does not open as a deployment's either.
	if _, err := decrypt(eu.Client, "dep_"+strings.TrimPrefix(id, "sen_"), blob); code(err) != codes.PermissionDenied {
		t.Fatalf("a sentinel's blob presented for a deployment id: %v, want PermissionDenied", err)
	}

	// The same credentials again: nothing changes (no new version, the
	// same blob); a deploy without credentials keeps them.
	again := deploySentinel(t, api, &ctrlv1.DeploySentinelRequest{SentinelId: id, Credentials: maps.Clone(creds)})
	if v := again.GetSentinel().GetVersion(); v != info.GetVersion() || !bytes.Equal(storedCredentials(t, env, id), blob) {
		t.Fatalf("the same credentials again: version %d -> %d, blob changed %v", info.GetVersion(), v, !bytes.Equal(storedCredentials(t, env, id), blob))
	}
	image := deploySentinel(t, api, &ctrlv1.DeploySentinelRequest{SentinelId: id, Image: "registry.test/sentinel:2"})
	if image.GetSentinel().GetVersion() <= info.GetVersion() || !bytes.Equal(storedCredentials(t, env, id), blob) ||
		len(image.GetSentinel().GetCredentialNames()) != 3 {
		t.Fatalf("a deploy without credentials changed them (or no new version): %v", image.GetSentinel())
	}
	if _, spec, _ := eu.Latest(id); !bytes.Equal(spec.GetEncryptedCredentials(), blob) {
		t.Fatal("a deploy without credentials streamed other credentials")
	}

	// New credentials replace the old as a whole, with a new version.
	creds2 := map[string]string{"DATABASE_PRIMARY": secret(t)}
	second := deploySentinel(t, api, &ctrlv1.DeploySentinelRequest{SentinelId: id, Credentials: creds2})
	blob2 := storedCredentials(t, env, id)
	if second.GetSentinel().GetVersion() <= image.GetSentinel().GetVersion() || bytes.Equal(blob2, blob) ||
		!slices.Equal(second.GetSentinel().GetCredentialNames(), []string{"DATABASE_PRIMARY"}) {
		t.Fatalf("new credentials: %v", second.GetSentinel())
	}
	if _, spec, _ := eu.Latest(id); !bytes.Equal(spec.GetEncryptedCredentials(), blob2) {
		t.Fatal("the cluster did not get the new credentials")
	}
	if got, err := decrypt(eu.Client, id, blob2); err != nil || !maps.Equal(got, creds2) {
		t.Fatalf("open the new credentials: %v", err)
	}
	if _, err := decrypt(eu.Client, id, blob); code(err) != codes.PermissionDenied {
		t.Fatalf("the replaced blob: %v, want PermissionDenied", err)
	}

	// A stopped sentinel's credentials no longer open.
	if _, err := api.StopSentinel(ctx, &ctrlv1.StopSentinelRequest{SentinelId: id}); err != nil {
		t.Fatal(err)
	}
	if _, err := decrypt(eu.Client, id, blob2); code(err) != codes.PermissionDenied {
		t.Fatalf("a stopped sentinel: %v, want PermissionDenied", err)
	}

	// Every request for the sentinel is audited, allowed and denied.
	checkAudit(t, env.Store, id, map[string]int{store.VaultAllowed + "/eu/eu-1": 2, store.VaultDenied + "/us/us-1": 1, store.VaultDenied + "/eu/eu-1": 3})

	// Bad input is refused naming the field, never echoing a value.
	value := secret(t)
	for name, c := range map[string]map[string]string{
		"bad name":     {"1BAD": value},
		"NUL in value": {"A": value + "\x00"},
	} {
		_, err := api.DeploySentinel(ctx, &ctrlv1.DeploySentinelRequest{SentinelId: other, Credentials: c})
		if code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "credentials") || strings.Contains(err.Error(), value) {
			t.Errorf("%s: %v, want InvalidArgument naming credentials without the value", name, err)
		}
	}

	// The database holds ciphertext only; ctrl's log no value.
	values := slices.Concat(slices.Collect(maps.Values(creds)), slices.Collect(maps.Values(creds2)))
	found, cells, err := testenv.FindInDatabase(ctx, env.Store.DB(), values...)
	if err != nil {
		t.Fatal(err)
	}
	if len(found) > 0 {
		t.Fatalf("plaintext credentials in the database: %v", found)
	}
	t.Logf("searched %d cells of every table for %d credential values (plain, base64, hex): none found", cells, len(values))
	logs := env.Logs.String()
	for _, v := range values {
		for _, form := range testenv.LeakForms(v) {
			if strings.Contains(logs, form) {
				t.Fatal("ctrl's log contains a credential's value")
			}
		}
	}
}

// TestSentinelCredentialsNeedAKeyring: a ctrl without a vault keyring
// refuses credentials, naming the setting.
func TestSentinelCredentialsNeedAKeyring(t *testing.T) {
	env := ctrltest.Start(t, ctrltest.Options{Restate: testenv.SharedRestate(t)})
	id := env.CreateSentinels(t, "eu", "sen_nokey", "registry.test/sentinel:1", 1)[0]
	_, err := env.Sentinels(t).DeploySentinel(context.Background(), &ctrlv1.DeploySentinelRequest{SentinelId: id, Credentials: map[string]string{"A": "b"}})
	if code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "vault.keyring_file") {
		t.Fatalf("credentials without a keyring: %v, want FailedPrecondition naming vault.keyring_file", err)
	}
}
