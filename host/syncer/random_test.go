package syncer

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"krane.dev/sdk"
)

// TestLoopRandomized drives the whole loop through a seeded random
// schedule: changes and deletes, permanent and retryable failures, dropped
// and silent streams, resyncs, plugin restarts and option changes. While
// it runs, the committed cursor keeps invariant 4; at the end the plugin's
// state equals desired state except for objects reported parked, then,
// with the failures gone, exactly; no apply ever went backwards; and no
// goroutine outlives the loop.
//
// The seed is printed; KRANE_TEST_SEED=N replays one schedule.
func TestLoopRandomized(t *testing.T) {
	seeds := []uint64{uint64(time.Now().UnixNano())}
	for i := range 3 {
		seeds = append(seeds, seeds[0]+uint64(i)+1)
	}
	if s := os.Getenv("KRANE_TEST_SEED"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("KRANE_TEST_SEED=%q: %v", s, err)
		}
		seeds = []uint64{n}
	}
	for _, seed := range seeds {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			t.Cleanup(func() {
				if t.Failed() {
					t.Logf("replay this schedule with KRANE_TEST_SEED=%d", seed)
				}
			})
			randomRun(t, seed)
		})
	}
}

// change is one committed desired-state change, as the test wrote it.
type change struct {
	id      string
	version uint64
	deleted bool
	value   string
}

func randomRun(t *testing.T, seed uint64) {
	// Registered first, so it runs after every other cleanup (the loop,
	// the connection and the server stop first).
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { noLeaks(t, ignore) })
	rng := rand.New(rand.NewPCG(seed, 0x6c6f6f70))
	o := testOptions()
	o.StreamTimeout = 300 * time.Millisecond
	o.MaxPending = 1 + rng.IntN(8)
	w := newWorld(t, o)

	// Outcomes: a value containing "poison" fails for good; others fail
	// retryably at random while flaky is set.
	var fmu sync.Mutex
	frng := rand.New(rand.NewPCG(seed, 1))
	flaky := true
	w.plugin.script(func(ch sdk.Change) error {
		if strings.Contains(string(ch.Spec.Value), "poison") {
			return sdk.Permanent(errors.New("poisoned"))
		}
		fmu.Lock()
		defer fmu.Unlock()
		if flaky && frng.IntN(10) == 0 {
			return errors.New("transient")
		}
		return nil
	})

	var (
		log []change
		ids []string
	)
	for i := range 25 {
		ids = append(ids, fmt.Sprintf("o%d", i))
	}
	put := func() {
		id := ids[rng.IntN(len(ids))]
		value := fmt.Sprintf("v%d", rng.IntN(1000))
		if rng.IntN(15) == 0 {
			value = "poison-" + value
		}
		log = append(log, change{id: id, version: w.put(id, value), value: value})
	}
	for range 10 {
		put()
	}
	w.start()
	for step := range 600 {
		switch x := rng.IntN(100); {
		case x < 55:
			put()
		case x < 70:
			id := ids[rng.IntN(len(ids))]
			log = append(log, change{id: id, version: w.ctrl.Delete(testKind, id), deleted: true})
		case x < 75:
			w.ctrl.DropStreams()
		case x < 80:
			w.loop.Resync()
		case x < 82:
			w.plugin.Restart()
		case x < 84:
			no := w.loop.options()
			no.Workers = 1 + rng.IntN(6)
			no.MaxPending = 1 + rng.IntN(8)
			w.loop.SetOptions(no)
		case x < 85:
			// ctrl goes silent long enough for the loop to give up on
			// its stream, then comes back.
			before := len(w.ctrl.Watches())
			w.ctrl.Stall()
			waitFor(t, "a silent stream replaced", func() error {
				if len(w.ctrl.Watches()) <= before {
					return errors.New("not yet")
				}
				return nil
			})
			w.ctrl.Resume()
		case x < 95:
			checkCursor(t, w, log)
		default:
			// Let the loop catch up now and then.
			if head := w.ctrl.Head(); rng.IntN(2) == 0 {
				w.waitCursor(head)
			}
		}
		if step%100 == 99 {
			checkCursor(t, w, log)
		}
	}

	// The stream settles: everything is applied or parked. The timeouts go
	// back to ones a loaded machine cannot trip by being slow.
	fmu.Lock()
	flaky = false
	fmu.Unlock()
	w.loop.SetOptions(testOptions())
	w.waitCursor(w.ctrl.Head())
	checkCursor(t, w, log)
	latest := map[string]change{}
	for _, c := range log {
		latest[c.id] = c
	}
	waitFor(t, "state equals desired, except objects reported parked", func() error {
		state, parked := w.plugin.cluster.state(), w.reports.parked()
		var bad []string
		for _, id := range ids {
			c, ok := latest[id]
			if !ok {
				continue
			}
			if strings.HasPrefix(c.value, "poison") && parked[id] != c.version {
				bad = append(bad, fmt.Sprintf("%s@%d is poisoned but reported parked at %d", id, c.version, parked[id]))
			}
			if parked[id] == c.version {
				continue
			}
			want, have := specValue(t, c.value), state[id]
			if _, present := state[id]; c.deleted && present || !c.deleted && have != want {
				bad = append(bad, fmt.Sprintf("%s@%d (deleted=%v) not applied, not reported parked", id, c.version, c.deleted))
			}
		}
		if len(bad) > 0 {
			return errors.New(strings.Join(bad, "; "))
		}
		return nil
	})

	// The failures go away: a resync retries what is parked, and the
	// plugin's state is desired state exactly.
	w.plugin.script(nil)
	w.resync()
	waitFor(t, "state equals desired", func() error {
		if d := diff(w.desired(ids), w.plugin.cluster.state()); len(d) > 0 {
			return errors.New(strings.Join(d, "; "))
		}
		if p := w.reports.parked(); len(p) > 0 {
			return fmt.Errorf("still reported parked: %v", p)
		}
		return nil
	})
	w.plugin.cluster.mu.Lock()
	stale, applies := w.plugin.cluster.stale, w.plugin.cluster.applies
	w.plugin.cluster.mu.Unlock()
	if len(stale) > 0 {
		t.Errorf("applies went backwards (invariant 2): %v", stale)
	}
	t.Logf("seed %d: %d changes, %d applies, %d plugin instances, %d watches, %d listings",
		seed, len(log), applies, w.plugin.Instances(), len(w.ctrl.Watches()), w.ctrl.Lists())
}

// checkCursor checks invariant 4 at one moment: every change at or below
// the committed cursor is applied (or superseded) or reported parked.
// Applies and reports only move forward, so reading them after the cursor
// is safe; reports trail the queue by a moment, hence the wait.
func checkCursor(t *testing.T, w *world, log []change) {
	t.Helper()
	cursor := w.loop.Cursor()
	latest := map[string]change{}
	for _, c := range log {
		if c.version <= cursor {
			latest[c.id] = c
		}
	}
	waitFor(t, fmt.Sprintf("every change <= cursor %d applied or parked", cursor), func() error {
		w.plugin.cluster.mu.Lock()
		objects := map[string]sdk.Change{}
		for id, ch := range w.plugin.cluster.objects {
			objects[id] = ch
		}
		w.plugin.cluster.mu.Unlock()
		parked := w.reports.parked()
		for id, c := range latest {
			if parked[id] >= c.version {
				continue
			}
			have, present := objects[id]
			switch {
			case present && have.Version >= c.version:
			case !present && c.deleted:
			case !present && later(log, id, c.version):
				// deleted again by a change above the cursor
			default:
				return fmt.Errorf("%s@%d (deleted=%v) is at or below the cursor but neither applied nor parked (plugin has %d, present=%v)",
					id, c.version, c.deleted, have.Version, present)
			}
		}
		return nil
	})
}

// later reports whether id has a change above version in log.
func later(log []change, id string, version uint64) bool {
	for _, c := range log {
		if c.id == id && c.version > version {
			return true
		}
	}
	return false
}

// noLeaks waits until no goroutine but those of ignore runs (goleak's own
// retries give up within half a second, too soon on a loaded machine).
func noLeaks(t testing.TB, ignore goleak.Option) {
	t.Helper()
	waitFor(t, "no leaked goroutines", func() error { return goleak.Find(ignore) })
}
