package syncer

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"krane.dev/sdk"
)

func testQueue() *queue {
	return newQueue(Backoff{Min: time.Millisecond, Max: 2 * time.Millisecond}, Backoff{Min: time.Hour, Max: time.Hour}, 3)
}

func ch(id string, v uint64) sdk.Change { return sdk.Change{Kind: "k", ID: id, Version: v} }

func next(t *testing.T, q *queue) *task {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	tk, err := q.Next(ctx)
	if err != nil {
		t.Fatalf("no task ready: %v", err)
	}
	return tk
}

func noTask(t *testing.T, q *queue) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if tk, err := q.Next(ctx); err == nil {
		t.Fatalf("unexpected task %s@%d", tk.change.ID, tk.change.Version)
	}
}

func TestQueueOrdersPerObjectAndCoalesces(t *testing.T) {
	q := testQueue()
	q.Add(ch("a", 1))
	q.Add(ch("b", 2))
	a1 := next(t, q)
	b2 := next(t, q)
	if a1.change.Version != 1 || b2.change.Version != 2 {
		t.Fatalf("got %d, %d", a1.change.Version, b2.change.Version)
	}
	q.Add(ch("a", 3)) // a is running: queued behind it
	q.Add(ch("a", 4)) // coalesced with 3
	noTask(t, q)      // one apply in flight per object
	if got := q.Cursor(); got != 0 {
		t.Errorf("cursor = %d with 1 outstanding, want 0", got)
	}
	q.Done(b2, succeeded)
	if got := q.Cursor(); got != 0 {
		t.Errorf("cursor = %d, want 0 (a@1 still running)", got)
	}
	q.Done(a1, succeeded)
	if got := q.Cursor(); got != 2 {
		t.Errorf("cursor = %d, want 2 (a@3,4 pending)", got)
	}
	a4 := next(t, q)
	if a4.change.Version != 4 {
		t.Fatalf("next a = %d, want the newest (4)", a4.change.Version)
	}
	q.Done(a4, succeeded)
	if got := q.Cursor(); got != 4 {
		t.Errorf("cursor = %d, want 4", got)
	}
	q.Add(ch("a", 3)) // replay after reconnect
	noTask(t, q)
	if got := q.Cursor(); got != 4 {
		t.Errorf("cursor after replay = %d, want 4", got)
	}
}

func TestQueueParksPermanentFailures(t *testing.T) {
	q := testQueue()
	q.Add(ch("bad", 1))
	q.Add(ch("good", 2))
	bad := next(t, q)
	good := next(t, q)
	if parked := q.Done(bad, permanent); !parked {
		t.Fatal("permanent failure not parked")
	}
	q.Done(good, succeeded)
	if got := q.Cursor(); got != 2 {
		t.Errorf("cursor = %d, want 2: a parked change must not hold the cursor", got)
	}
	if q.Parked() != 1 {
		t.Errorf("parked = %d", q.Parked())
	}
	noTask(t, q) // the parked retry waits for its (long) backoff
	q.Add(ch("bad", 5))
	fixed := next(t, q)
	if fixed.change.Version != 5 {
		t.Fatalf("newer version did not replace the parked one: got %d", fixed.change.Version)
	}
	q.Done(fixed, succeeded)
	if q.Parked() != 0 || q.Cursor() != 5 {
		t.Errorf("parked = %d, cursor = %d", q.Parked(), q.Cursor())
	}
}

func TestQueueRetriesThenParks(t *testing.T) {
	q := testQueue()
	q.Add(ch("x", 7))
	for i := 1; i < q.maxAttempts; i++ {
		tk := next(t, q)
		if q.Done(tk, retryable) {
			t.Fatalf("parked after %d attempts", i)
		}
		if got := q.Cursor(); got != 6 {
			t.Errorf("cursor = %d while retrying, want 6", got)
		}
	}
	if !q.Done(next(t, q), retryable) {
		t.Fatal("not parked after max attempts")
	}
	if got := q.Cursor(); got != 7 {
		t.Errorf("cursor = %d after parking, want 7", got)
	}
}

func TestQueueRepairAndCollect(t *testing.T) {
	q := testQueue()
	q.Add(ch("a", 10))
	q.Done(next(t, q), succeeded)
	q.Repair(ch("a", 10)) // same version: drift repair runs
	if tk := next(t, q); tk.kind != repair {
		t.Fatalf("got %v", tk.kind)
	} else {
		q.Done(tk, succeeded)
	}
	q.Repair(ch("a", 9)) // older than applied: ignored
	noTask(t, q)
	q.Collect(sdk.Change{ID: "a", Version: 8, Deleted: true}) // snapshot older than the object
	noTask(t, q)
	q.Collect(sdk.Change{ID: "gone", Version: 12, Deleted: true})
	if tk := next(t, q); tk.kind != collect || !tk.change.Deleted {
		t.Fatalf("collect task = %+v", tk)
	}
	if got := q.Cursor(); got != 10 {
		t.Errorf("repairs and collections must not move the cursor: %d", got)
	}
}

// TestQueueRandomized applies a random stream with random outcomes through
// concurrent workers and checks invariants 2-4 at the end.
func TestQueueRandomized(t *testing.T) {
	for seed := uint64(1); seed <= 20; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 0))
			q := newQueue(Backoff{Min: time.Microsecond, Max: 10 * time.Microsecond}, Backoff{Min: time.Microsecond, Max: 10 * time.Microsecond}, 3)
			ctx, cancel := context.WithCancel(context.Background())
			var mu sync.Mutex
			applied := map[string][]uint64{}
			var wg sync.WaitGroup
			for w := 0; w < 8; w++ {
				wg.Add(1)
				go func(w int) {
					defer wg.Done()
					r := rand.New(rand.NewPCG(seed, uint64(w)))
					for {
						tk, err := q.Next(ctx)
						if err != nil {
							return
						}
						out := succeeded
						if x := r.IntN(10); x == 0 {
							out = retryable
						} else if x == 1 && tk.change.ID == "poison" {
							out = permanent
						}
						if out == succeeded {
							mu.Lock()
							applied[tk.change.ID] = append(applied[tk.change.ID], tk.change.Version)
							mu.Unlock()
						}
						q.Done(tk, out)
					}
				}(w)
			}
			latest := map[string]uint64{}
			var v uint64
			for range 2000 {
				v++
				id := fmt.Sprintf("o%d", rng.IntN(50))
				if rng.IntN(40) == 0 {
					id = "poison"
				}
				q.Add(ch(id, v))
				latest[id] = v
			}
			deadline := time.Now().Add(10 * time.Second)
			for q.Cursor() < v && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
			}
			cancel()
			wg.Wait()
			if got := q.Cursor(); got != v {
				t.Fatalf("cursor = %d, want %d", got, v)
			}
			for id, vs := range applied {
				for i := 1; i < len(vs); i++ {
					if vs[i] <= vs[i-1] {
						t.Fatalf("%s applied out of order: %v", id, vs)
					}
				}
				if id != "poison" && vs[len(vs)-1] != latest[id] {
					t.Fatalf("%s: last applied %d, latest %d", id, vs[len(vs)-1], latest[id])
				}
			}
		})
	}
}

func BenchmarkQueue(b *testing.B) {
	q := testQueue()
	ctx := context.Background()
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		q.Add(ch(fmt.Sprintf("o%d", i%1000), uint64(i+1)))
		tk, _ := q.Next(ctx)
		q.Done(tk, succeeded)
	}
	if q.Cursor() != uint64(b.N) {
		b.Fatalf("cursor %d != %d", q.Cursor(), b.N)
	}
}

// TestQueueCursorWaitsForAPendingRepair: a resync may list an object's
// state before the stream delivers it. The stream's change is then already
// covered by the repair, queued or running, but the cursor must not pass
// it until that repair is applied or parked (invariant 4).
func TestQueueCursorWaitsForAPendingRepair(t *testing.T) {
	for _, running := range []bool{false, true} {
		for _, out := range []outcome{succeeded, permanent} {
			t.Run(fmt.Sprintf("running=%v,outcome=%d", running, out), func(t *testing.T) {
				q := testQueue()
				q.Add(ch("a", 1))
				q.Done(next(t, q), succeeded)
				q.Repair(ch("a", 3)) // listed by a resync
				var repair *task
				if running {
					repair = next(t, q)
				}
				q.Add(ch("b", 2))
				q.Add(ch("a", 3)) // the stream catches up
				if !running {
					repair = next(t, q)
				}
				if repair.change.ID != "a" || repair.change.Version != 3 {
					t.Fatalf("task %s@%d, want the repair a@3", repair.change.ID, repair.change.Version)
				}
				q.Done(next(t, q), succeeded) // b@2
				if got := q.Cursor(); got != 2 {
					t.Fatalf("cursor = %d with a@3 not applied, want 2", got)
				}
				q.Done(repair, out)
				if got := q.Cursor(); got != 3 {
					t.Errorf("cursor = %d after a@3 was applied or parked, want 3", got)
				}
				noTask(t, q)
			})
		}
	}
}

// TestQueueForgetsNothingAStreamMayReplay: a stream resumed from an older
// cursor replays changes the queue has since finished. An object must not
// be forgotten while such a replay may still come, or the replay would be
// applied over the newer version (invariant 2).
func TestQueueForgetsNothingAStreamMayReplay(t *testing.T) {
	q := testQueue()
	q.Add(ch("a", 5))
	q.Add(ch("b", 6))
	q.Done(next(t, q), succeeded)
	q.Resume(q.Cursor()) // a reconnect resumes after 5, b@6 still running
	q.Done(next(t, q), succeeded)
	q.Forget(q.Cursor()) // a resync: the cursor is 6 now
	q.Add(ch("b", 6))    // the resumed stream replays b@6
	noTask(t, q)
	if got := q.Cursor(); got != 6 {
		t.Errorf("cursor = %d after the replay, want 6", got)
	}
	q.Add(ch("a", 7)) // then goes on
	q.Done(next(t, q), succeeded)
	q.Forget(q.Cursor()) // past the replays: everything finished goes
	if n := len(q.objects); n != 0 {
		t.Errorf("%d objects kept once the stream delivered past what it replays", n)
	}
}
