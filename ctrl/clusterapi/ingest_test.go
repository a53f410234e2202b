package clusterapi

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"
)

// fairBatcher is a batcher whose writes record the batches (as the keys
// of their items) and wait for release: a database that is slow.
type fairBatcher struct {
	*batcher[string, string]
	mu      sync.Mutex
	batches [][]string
	release chan struct{}
	writing chan struct{} // closed when the first write starts
	once    sync.Once
}

func newFairBatcher(capacity, perKey int) *fairBatcher {
	f := &fairBatcher{release: make(chan struct{}), writing: make(chan struct{})}
	f.batcher = newBatcher(func(ctx context.Context, items []string) ([]string, error) {
		f.once.Do(func() { close(f.writing) })
		<-f.release
		f.mu.Lock()
		f.batches = append(f.batches, slices.Clone(items))
		f.mu.Unlock()
		return items, nil
	}, time.Millisecond, 1000, capacity, perKey, func(string) int { return 1 }, 1<<30, func(int, time.Duration, error) {}, func(int, int) {})
	return f
}

// waitQueued waits until n items are queued (not in flight).
func (f *fairBatcher) waitQueued(t *testing.T, n int) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for f.depth() != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d items queued, want %d", f.depth(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestOneClusterCannotFillTheSharedQueue: with the database slow, one
// cluster's many concurrent calls fill only its share of the queue (the
// rest are refused with errShareFull) and another cluster's call still
// gets in; a cluster with nothing queued always gets one call in, however
// large.
func TestOneClusterCannotFillTheSharedQueue(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f := newFairBatcher(1000, 100)
	go f.run(ctx)
	items := func(key string, n int) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = key
		}
		return out
	}
	var wg sync.WaitGroup
	// One call in flight (the write waits), then the greedy cluster's.
	wg.Go(func() { _, _ = f.add(ctx, "first", items("first", 1)) })
	<-f.writing
	var mu sync.Mutex
	var refused []error
	for range 20 {
		wg.Go(func() {
			if _, err := f.add(ctx, "greedy", items("greedy", 50)); err != nil {
				mu.Lock()
				refused = append(refused, err)
				mu.Unlock()
			}
		})
	}
	deadline := time.Now().Add(time.Minute)
	for {
		mu.Lock()
		n := len(refused)
		mu.Unlock()
		if n == 18 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of the greedy cluster's calls refused, %d items queued; want 18 refused and 100 (its share) queued", n, f.depth())
		}
		time.Sleep(time.Millisecond)
	}
	for _, err := range refused {
		if !errors.Is(err, errShareFull) {
			t.Fatalf("a greedy call refused with %v; want errShareFull", err)
		}
	}
	f.waitQueued(t, 100)
	wg.Go(func() {
		if _, err := f.add(ctx, "honest", items("honest", 10)); err != nil {
			t.Errorf("another cluster's call while the greedy one's share is full: %v", err)
		}
	})
	wg.Go(func() {
		if _, err := f.add(ctx, "large", items("large", 300)); err != nil {
			t.Errorf("a call larger than a share, from a cluster with nothing queued: %v", err)
		}
	})
	f.waitQueued(t, 410)
	close(f.release)
	wg.Wait()
}

// TestBatchesTakeClustersInTurn: a batch takes one call of each waiting
// cluster in turn, so a cluster with many calls queued does not delay the
// others' behind all of its own. The calls arrive in a seeded random
// order; each batch holds at most one call of a cluster while other
// clusters' calls wait.
func TestBatchesTakeClustersInTurn(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, seed))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f := newFairBatcher(100000, 100000)
	f.maxBatch = 4
	go f.run(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { _, _ = f.add(ctx, "first", []string{"first"}) })
	<-f.writing
	calls := map[string]int{"a": 6, "b": 1, "c": 3, "d": 1}
	var order []string
	for k, n := range calls {
		for range n {
			order = append(order, k)
		}
	}
	rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
	queued := 0
	for _, k := range order {
		wg.Go(func() { _, _ = f.add(ctx, k, []string{k}) })
		queued++
		f.waitQueued(t, queued)
	}
	close(f.release)
	wg.Wait()
	f.mu.Lock()
	defer f.mu.Unlock()
	left := maps(calls)
	for _, b := range f.batches[1:] {
		seen := map[string]int{}
		for _, k := range b {
			seen[k]++
		}
		for k, n := range seen {
			for other, waiting := range left {
				if n > 1 && waiting > 0 && seen[other] == 0 {
					t.Errorf("batch %v takes %d calls of %s while %s's wait (seed %d)", b, n, k, other, seed)
				}
			}
		}
		for k, n := range seen {
			left[k] -= n
		}
	}
	for k, n := range left {
		if n != 0 {
			t.Errorf("%d calls of %s never written", n, k)
		}
	}
}

func maps(m map[string]int) map[string]int {
	out := map[string]int{}
	for k, v := range m {
		out[k] = v
	}
	return out
}
