package workflows_test

//lint:file-ignore SA1019 legacy-workload: removed no earlier than v0.3.0 (docs/compatibility.md); this file builds or reads the deprecated top-level workload fields

import (
	"context"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"krane.dev/ctrl/internal/ctrltest"
	"krane.dev/ctrl/vault"
	ctrlv1 "krane.dev/proto/krane/ctrl/v1"
)

// deployReady deploys the environment to regions and waits for ready.
func deployReady(t *testing.T, w *world, env string, regions ...string) string {
	t.Helper()
	id := w.create(t, &ctrlv1.CreateDeploymentRequest{EnvironmentId: env, Image: "registry.test/app:1", Replicas: 1, Regions: regions})
	ctrltest.WaitStatus(t, w.api, id, 30*time.Second, network)
	for _, r := range regions {
		w.clusters[r].ReportRunning(t, id, 1)
	}
	if d, _ := ctrltest.WaitStatus(t, w.api, id, 30*time.Second, ready, failed); d.GetStatus() != ready {
		t.Fatalf("deploy of %s to %v: %s (%s)", env, regions, d.GetStatus(), d.GetError())
	}
	return id
}

// sealedCredentials reads a sentinel's stored credentials.
func sealedCredentials(t *testing.T, w *world, id string) ([]byte, string) {
	t.Helper()
	var blob []byte
	var names *string
	if err := w.env.Store.DB().QueryRow("SELECT encrypted_credentials, credential_names FROM sentinels WHERE id = ?", id).Scan(&blob, &names); err != nil {
		t.Fatal(err)
	}
	if names == nil {
		return blob, ""
	}
	return blob, *names
}

// TestDeployCreatedSentinelInheritsCredentials: a sentinel a deploy
// creates in a new region carries the sealed credentials the
// environment's other sentinel has, re-sealed for its own id, from its
// first version; the deploy's history says so. Without a vault keyring
// ctrl cannot re-seal them: the history says the sentinel starts without
// them, and how to set them.
func TestDeployCreatedSentinelInheritsCredentials(t *testing.T) {
	keyring := ctrltest.Keyring(t)
	w := newWorld(t, ctrltest.Options{Configure: ctrltest.WithKeyring(keyring)}, "eu", "us")
	ctx := context.Background()
	deployReady(t, w, "env-cred", "eu")
	eu := sentinels(t, w.env.Store.DB(), "env-cred")["eu"]
	creds := map[string]string{"DATABASE_URL": "mysql://inherit-test", "REDIS_URL": "redis://inherit-test"}
	resp, err := w.env.Sentinels(t).DeploySentinel(ctx, &ctrlv1.DeploySentinelRequest{SentinelId: eu.ID, Credentials: creds, Wait: true, TimeoutSeconds: 30})
	if err != nil || resp.GetResult() != "ready" {
		t.Fatalf("setting the eu sentinel's credentials: %v, %v", resp, err)
	}

	second := deployReady(t, w, "env-cred", "us")
	us := sentinels(t, w.env.Store.DB(), "env-cred")["us"]
	blob, names := sealedCredentials(t, w, us.ID)
	if len(blob) == 0 {
		t.Fatalf("the sentinel the deploy created in us has no credentials; history: %q", notes(t, w.env.Store, second))
	}
	if names != `["DATABASE_URL", "REDIS_URL"]` && names != `["DATABASE_URL","REDIS_URL"]` {
		t.Errorf("credential_names %s, want DATABASE_URL and REDIS_URL", names)
	}
	keys, err := vault.Load(keyring, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	opened, _, err := keys.Open(us.ID, blob)
	if err != nil || !maps.Equal(opened, creds) {
		t.Fatalf("the inherited credentials, opened for %s: %v, %v; want the eu sentinel's", us.ID, slices.Sorted(maps.Keys(opened)), err)
	}
	if !slices.ContainsFunc(notes(t, w.env.Store, second), func(m string) bool {
		return strings.Contains(m, "inherits the sealed credentials of sentinel "+eu.ID)
	}) {
		t.Errorf("history %q does not say where the credentials came from", notes(t, w.env.Store, second))
	}

	// Without a keyring: said, not silently dropped.
	nv := newWorld(t, ctrltest.Options{}, "eu", "us")
	deployReady(t, nv, "env-nokey", "eu")
	neu := sentinels(t, nv.env.Store.DB(), "env-nokey")["eu"]
	if _, err := nv.env.Store.DB().Exec(`UPDATE sentinels SET encrypted_credentials = ?, credential_names = '["TOKEN"]' WHERE id = ?`, blob, neu.ID); err != nil {
		t.Fatal(err)
	}
	third := deployReady(t, nv, "env-nokey", "us")
	nus := sentinels(t, nv.env.Store.DB(), "env-nokey")["us"]
	if b, _ := sealedCredentials(t, nv, nus.ID); len(b) != 0 {
		t.Errorf("sentinel %s got credentials without a vault", nus.ID)
	}
	if !slices.ContainsFunc(notes(t, nv.env.Store, third), func(m string) bool {
		return strings.Contains(m, "starts without credentials") && strings.Contains(m, neu.ID) && strings.Contains(m, "vault.keyring_file")
	}) {
		t.Errorf("history %q does not say the new sentinel starts without the environment's credentials", notes(t, nv.env.Store, third))
	}
}
