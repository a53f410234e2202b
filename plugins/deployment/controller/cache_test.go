package controller

import (
	"bytes"
	"testing"
	"time"
)

func key(b byte) [32]byte { return [32]byte{b} }

// TestEnvCache: hits until the TTL, copies out (the cache zeroes its own
// buffers), bounded by bytes (the first to expire goes first), and expired
// values leave memory without anyone asking.
func TestEnvCache(t *testing.T) {
	now := time.Unix(1000, 0)
	c := &envCache{ttl: time.Minute, maxBytes: 100, now: func() time.Time { return now }}
	value := []byte("secret-value")
	c.put(key(1), map[string][]byte{"A": value})
	got, ok := c.get(key(1))
	if !ok || !bytes.Equal(got["A"], value) {
		t.Fatalf("get after put: %q %v", got, ok)
	}
	clear(got["A"]) // the caller's copy
	if again, _ := c.get(key(1)); !bytes.Equal(again["A"], value) {
		t.Fatal("zeroing a returned map changed the cache")
	}
	held := c.entries[key(1)].data["A"]

	now = now.Add(time.Minute)
	if _, ok := c.get(key(1)); ok {
		t.Fatal("hit after the TTL")
	}
	if !bytes.Equal(held, make([]byte, len(held))) {
		t.Fatal("an expired value was not zeroed")
	}
	if c.hits.Load() != 2 || c.misses.Load() != 1 {
		t.Errorf("hits %d misses %d, want 2 and 1", c.hits.Load(), c.misses.Load())
	}

	// Bounded: 3 entries of 40 bytes do not fit in 100.
	big := func() map[string][]byte { return map[string][]byte{"K": bytes.Repeat([]byte{'x'}, 39)} }
	for i := byte(1); i <= 3; i++ {
		c.put(key(10+i), big())
		now = now.Add(time.Second)
	}
	if _, ok := c.get(key(11)); ok || c.bytes > 100 || len(c.entries) != 2 {
		t.Fatalf("over the byte bound: %d entries, %d bytes, oldest kept %v", len(c.entries), c.bytes, ok)
	}
	// Larger than the whole cache: not kept at all.
	c.put(key(20), map[string][]byte{"K": bytes.Repeat([]byte{'x'}, 200)})
	if _, ok := c.get(key(20)); ok {
		t.Fatal("an environment larger than the cache was kept")
	}

	// The timer empties the cache on its own.
	real := &envCache{ttl: 50 * time.Millisecond}
	real.put(key(1), map[string][]byte{"A": []byte("x")})
	deadline := time.Now().Add(2 * time.Second)
	for real.len() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("expired entries stay in memory when nobody asks")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
