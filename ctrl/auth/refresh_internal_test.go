package auth

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"krane.dev/ctrl/store"
)

// countingTokens is a TokenStore over a map that counts its reads.
type countingTokens struct {
	mu           sync.Mutex
	toks         map[string]store.Token
	single, bulk int
}

func (c *countingTokens) LookupToken(_ context.Context, id string) (store.Token, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.single++
	t, ok := c.toks[id]
	if !ok {
		return store.Token{}, store.ErrNotFound
	}
	return t, nil
}

func (c *countingTokens) LookupTokens(_ context.Context, ids []string) ([]store.Token, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.bulk++
	var out []store.Token
	for _, id := range ids {
		if t, ok := c.toks[id]; ok {
			t.SecretHash = [32]byte{} // as the store: no hashes in a bulk read
			out = append(out, t)
		}
	}
	return out, nil
}

func (c *countingTokens) RevokedTokensRead(context.Context, time.Time) ([]store.Token, time.Time, error) {
	return nil, time.Now(), nil
}
func (c *countingTokens) RecordRevocationsRead(context.Context, string, string, time.Time, time.Time) error {
	return nil
}
func (c *countingTokens) RevokeToken(context.Context, string) (store.Token, bool, error) {
	return store.Token{}, false, nil
}

// TestRefreshKeepsAFleetsTokensCachedInOneRead: the tokens of a thousand
// clusters calling every few hundred milliseconds are read once each and
// then re-read together in the background, not once per call and cache
// time; a token revoked in the database leaves the cache at the next
// refresh, and one no longer used is dropped.
func TestRefreshKeepsAFleetsTokensCachedInOneRead(t *testing.T) {
	st := &countingTokens{toks: map[string]store.Token{}}
	for i := range 1000 {
		id := fmt.Sprintf("tok%04d", i)
		st.toks[id] = store.Token{ID: id, Kind: store.ClusterToken, SecretHash: [32]byte{byte(i), 1}}
	}
	a := New(st, Options{CacheTTL: time.Second})
	ctx := context.Background()
	call := func() {
		for id := range st.toks {
			if _, err := a.lookup(ctx, id); err != nil {
				t.Fatal(err)
			}
		}
	}
	call()
	now := time.Now()
	// Ten refresh rounds of half a cache time each, the fleet calling
	// between them: every call is served from the cache.
	for i := 1; i <= 10; i++ {
		if err := a.refresh(ctx, now.Add(time.Duration(i)*a.ttl/2)); err != nil {
			t.Fatal(err)
		}
		for id := range st.toks {
			a.mu.Lock()
			c := a.cache[id]
			c.used = now.Add(time.Duration(i) * a.ttl / 2)
			a.cache[id] = c
			a.mu.Unlock()
		}
	}
	if st.single != 1000 || st.bulk != 10 {
		t.Fatalf("%d single reads and %d bulk reads, want 1,000 (the first calls) and 10 (one per refresh)", st.single, st.bulk)
	}
	for id, want := range st.toks {
		a.mu.Lock()
		got := a.cache[id].tok.SecretHash
		a.mu.Unlock()
		if got != want.SecretHash {
			t.Fatalf("token %s cached with hash %x after refreshes, want %x (a refresh must keep the hash)", id, got[:2], want.SecretHash[:2])
		}
	}
	st.mu.Lock()
	revoked := st.toks["tok0001"]
	revoked.RevokedAt = now
	st.toks["tok0001"] = revoked
	delete(st.toks, "tok0002")
	st.mu.Unlock()
	later := now.Add(6 * a.ttl)
	if err := a.refresh(ctx, later); err != nil {
		t.Fatal(err)
	}
	a.mu.Lock()
	_, stillRevoked := a.cache["tok0001"]
	_, stillGone := a.cache["tok0002"]
	a.mu.Unlock()
	if stillRevoked || stillGone {
		t.Fatalf("after a refresh: revoked token cached %v, deleted token cached %v; want neither", stillRevoked, stillGone)
	}
	if err := a.refresh(ctx, later.Add(refreshIdle+time.Second)); err != nil {
		t.Fatal(err)
	}
	a.mu.Lock()
	left := len(a.cache)
	a.mu.Unlock()
	if left != 0 {
		t.Fatalf("%d tokens cached after a minute without a call, want none", left)
	}
}
