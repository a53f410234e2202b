package store_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"krane.dev/ctrl/store"
)

func TestTokenExpiryListAndRevocation(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	now := time.Now()
	hash := [32]byte{1, 2, 3}
	for _, c := range []struct {
		cluster, region, id string
		expires             time.Time
	}{
		{"eu-1", "eu", "aaaaaaaaaaa1", time.Time{}},
		{"us-1", "us", "aaaaaaaaaaa2", now.Add(-time.Second)}, // the only token of us-1, expired
		{"eu-1", "eu", "aaaaaaaaaaa3", now.Add(time.Hour)},
	} {
		if err := s.RegisterCluster(ctx, c.cluster, c.region, store.Token{ID: c.id, SecretHash: hash, CreatedAt: now, ExpiresAt: c.expires}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.CreateOperatorToken(ctx, store.Token{ID: "aaaaaaaaaaa4", Name: "ci", SecretHash: hash, CreatedAt: now.Add(time.Millisecond)}); err != nil {
		t.Fatal(err)
	}

	tok, err := s.LookupToken(ctx, "aaaaaaaaaaa2")
	if err != nil || tok.ExpiresAt.UnixMilli() != now.Add(-time.Second).UnixMilli() || !tok.Expired(time.Now()) || tok.Valid(time.Now()) || tok.SecretHash != hash {
		t.Fatalf("expired token read back as %+v, %v", tok, err)
	}
	if tok, _ := s.LookupToken(ctx, "aaaaaaaaaaa1"); !tok.ExpiresAt.IsZero() || !tok.Valid(time.Now()) {
		t.Fatalf("token without expiry read back as %+v", tok)
	}

	// Expired tokens do not count as a cluster's valid tokens.
	clusters, err := s.ListClusters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	active := map[string]int{}
	for _, c := range clusters {
		active[c.ID] = c.ActiveTokens
	}
	if active["eu-1"] != 2 || active["us-1"] != 0 {
		t.Fatalf("valid tokens per cluster %v, want eu-1: 2, us-1: 0 (its only token expired)", active)
	}
	if regions, err := s.ClusterRegions(ctx); err != nil || !slices.Equal(regions, []string{"eu"}) {
		t.Fatalf("regions with a cluster that has a valid token: %v, %v; want [eu]", regions, err)
	}

	// ListTokens: every token, oldest first, never a hash.
	list, err := s.ListTokens(ctx)
	if err != nil || len(list) != 4 || list[3].ID != "aaaaaaaaaaa4" || list[3].Kind != store.OperatorToken || list[3].Name != "ci" {
		t.Fatalf("ListTokens = %+v, %v", list, err)
	}
	for _, tk := range list {
		if tk.SecretHash != ([32]byte{}) {
			t.Errorf("ListTokens returned the hash of %s", tk.ID)
		}
	}

	// RevokeToken: once, then idempotently; unknown ids are ErrNotFound.
	before := time.Now().Add(-time.Millisecond)
	tok, revokedNow, err := s.RevokeToken(ctx, "aaaaaaaaaaa3")
	if err != nil || !revokedNow || !tok.Revoked() || tok.ClusterID != "eu-1" || tok.Region != "eu" {
		t.Fatalf("RevokeToken = %+v, %v, %v", tok, revokedNow, err)
	}
	again, revokedNow, err := s.RevokeToken(ctx, "aaaaaaaaaaa3")
	if err != nil || revokedNow || !again.RevokedAt.Equal(tok.RevokedAt) {
		t.Fatalf("second RevokeToken = %+v, %v, %v; want the first revocation, unchanged", again, revokedNow, err)
	}
	if _, _, err := s.RevokeToken(ctx, "nosuchtoken0"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("RevokeToken of an unknown id: %v, want ErrNotFound", err)
	}
	time.Sleep(5 * time.Millisecond) // distinct revoked_at, for the order below
	if n, err := s.RevokeClusterTokens(ctx, "eu-1"); err != nil || n != 1 {
		t.Fatalf("RevokeClusterTokens = %d, %v; want the one token still valid", n, err)
	}

	// RevokedTokensSince: the revocations at or after since, oldest first.
	revoked, err := s.RevokedTokensSince(ctx, before)
	if err != nil || len(revoked) != 2 || revoked[0].ID != "aaaaaaaaaaa3" || revoked[1].ID != "aaaaaaaaaaa1" {
		t.Fatalf("RevokedTokensSince(before) = %+v, %v; want aaaaaaaaaaa3 then aaaaaaaaaaa1", revoked, err)
	}
	if revoked, err := s.RevokedTokensSince(ctx, time.Now().Add(time.Second)); err != nil || len(revoked) != 0 {
		t.Fatalf("RevokedTokensSince(future) = %+v, %v; want none", revoked, err)
	}

	// LookupTokens: the ones that exist, in any order.
	found, err := s.LookupTokens(ctx, []string{"aaaaaaaaaaa1", "nosuchtoken0", "aaaaaaaaaaa4"})
	if err != nil || len(found) != 2 {
		t.Fatalf("LookupTokens = %+v, %v", found, err)
	}

	// The revocation poll's range scan has its index.
	var n int
	if err := s.DB().QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.statistics
WHERE table_schema = DATABASE() AND table_name = 'api_tokens' AND index_name = 'api_tokens_revoked' AND column_name = 'revoked_at'`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("index api_tokens_revoked(revoked_at): %d, %v", n, err)
	}
}
