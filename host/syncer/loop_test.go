package syncer

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"krane.dev/sdk"
)

// TestLoopBootstrap: a fresh loop applies the snapshot, collects what the
// plugin manages but desired state does not name (only after the
// explicit BootstrapComplete), reports ready, then applies live changes.
func TestLoopBootstrap(t *testing.T) {
	w := newWorld(t, testOptions())
	var ids []string
	for i := range 20 {
		ids = append(ids, fmt.Sprintf("o%d", i))
		w.put(ids[i], "1")
	}
	// Left over from an earlier life: managed, no longer desired.
	w.plugin.cluster.objects["orphan"] = sdk.Change{Kind: testKind, ID: "orphan", Version: 1}
	w.start()
	w.waitBootstrapped()
	waitFor(t, "the snapshot applied and the orphan collected", func() error {
		if d := diff(w.desired(append(ids, "orphan")), w.plugin.cluster.state()); len(d) > 0 {
			return fmt.Errorf("%v", d)
		}
		return nil
	})
	v := w.put("o3", "2")
	w.ctrl.Delete(testKind, "o4")
	w.waitApplied("o3", v)
	w.waitCursor(w.ctrl.Head())
	if d := diff(w.desired(ids), w.plugin.cluster.state()); len(d) > 0 {
		t.Fatalf("after live changes: %v", d)
	}
}

// TestLoopReconnectsFromCursor: when ctrl drops the stream, the loop
// resumes after its committed cursor (not from 0) and loses nothing
// committed meanwhile.
func TestLoopReconnectsFromCursor(t *testing.T) {
	w := newWorld(t, testOptions())
	cursor, before := w.startSettled()
	w.ctrl.DropStreams()
	v := w.put("b", "1")
	w.waitApplied("b", v)
	w.checkResumed(before, cursor)
}

// TestLoopParksPermanentFailures: a change that fails permanently is
// reported upstream and parked; the cursor moves past it.
func TestLoopParksPermanentFailures(t *testing.T) {
	w := newWorld(t, testOptions())
	w.plugin.script(func(ch sdk.Change) error {
		if ch.ID == "bad" {
			return sdk.Permanent(errors.New("bad object"))
		}
		return nil
	})
	bad := w.put("bad", "1")
	w.put("good", "1")
	w.start()
	w.waitBootstrapped()
	w.waitCursor(w.ctrl.Head())
	w.waitParked("bad", bad)
}

// TestLoopParkedObjectsDoNotStallTheStream: with max_pending = 2 and two
// objects parked, the loop still reads the stream: later changes, the
// BootstrapComplete marker, and the newer version that fixes a parked
// object all get through.
func TestLoopParkedObjectsDoNotStallTheStream(t *testing.T) {
	o := testOptions()
	o.MaxPending = 2
	w := newWorld(t, o)
	w.plugin.script(func(ch sdk.Change) error {
		if ch.ID == "bad-1" || ch.ID == "bad-2" {
			if string(ch.Spec.Value) == specValue(t, "fixed") {
				return nil
			}
			return sdk.Permanent(errors.New("refused"))
		}
		return nil
	})
	w.put("bad-1", "broken")
	w.put("bad-2", "broken")
	for i := range 5 {
		w.put(fmt.Sprintf("good-%d", i), "1")
	}
	w.start()
	w.waitBootstrapped()
	w.waitCursor(w.ctrl.Head())
	for i := range 5 {
		v := w.put(fmt.Sprintf("live-%d", i), "1")
		w.waitApplied(fmt.Sprintf("live-%d", i), v)
	}
	v := w.put("bad-1", "fixed")
	w.waitApplied("bad-1", v)
	w.waitCursor(w.ctrl.Head())
}

// TestLoopResyncReleasesItsStream: a hundred resyncs leave no stream open
// and no goroutine behind (each used to park one, forever).
func TestLoopResyncReleasesItsStream(t *testing.T) {
	w := newWorld(t, testOptions())
	for i := range 10 {
		w.put(fmt.Sprintf("o%d", i), "1")
	}
	w.start()
	w.waitBootstrapped()
	w.resync()
	baseline := runtime.NumGoroutine()
	for range 100 {
		w.resync()
	}
	// The server's side ends with each listing; the client's must too.
	waitFor(t, "goroutines back near the count after the first resync", func() error {
		if n := runtime.NumGoroutine(); n > baseline+10 {
			return fmt.Errorf("%d goroutines after 100 resyncs, %d after the first", n, baseline)
		}
		return nil
	})
	if n := w.ctrl.OpenStreams(); n != 1 {
		t.Errorf("%d streams open on ctrl, want 1 (the Watch)", n)
	}
}

// TestLoopResyncRetriesParkedObjects: a parked object whose cause went
// away (a namespace appeared, a quota grew) is retried at the next resync,
// not only after its long park backoff, and its failure is cleared.
func TestLoopResyncRetriesParkedObjects(t *testing.T) {
	w := newWorld(t, testOptions()) // park backoff: an hour
	var fixed atomic.Bool
	w.plugin.script(func(ch sdk.Change) error {
		if ch.ID == "bad" && !fixed.Load() {
			return sdk.Permanent(errors.New("namespace missing"))
		}
		return nil
	})
	v := w.put("bad", "1")
	w.start()
	w.waitBootstrapped()
	w.waitParked("bad", v)
	fixed.Store(true)
	w.resync()
	w.waitApplied("bad", v)
	w.waitNoneParked("the failure cleared upstream")
}

// TestLoopForgetsFinishedObjects: the queue keeps no entry for an object
// whose last change is applied and below the cursor, so its memory (and
// the walk of every resync) follows the objects in flight, not every id
// ever seen.
func TestLoopForgetsFinishedObjects(t *testing.T) {
	w := newWorld(t, testOptions())
	w.start()
	w.waitBootstrapped()
	for i := range 300 {
		w.put(fmt.Sprintf("o%d", i), "1")
	}
	for i := range 300 {
		w.ctrl.Delete(testKind, fmt.Sprintf("o%d", i))
	}
	w.put("kept", "1")
	w.waitCursor(w.ctrl.Head())
	w.resync()
	w.waitCursor(w.ctrl.Head())
	w.resync()
	if n := w.queueLen(); n > 1 {
		t.Errorf("the queue holds %d objects after 300 were created, deleted and applied; want at most 1", n)
	}
	if d := diff(w.desired([]string{"kept", "o1"}), w.plugin.cluster.state()); len(d) > 0 {
		t.Errorf("state: %v", d)
	}
}

// TestLoopTearsDownASilentStream: a ctrl that stops answering without
// closing anything (stopped, or behind a black-holed link) does not freeze
// the kind. A Watch stream silent past the stream timeout (no change, no
// keep-alive) is torn down and resumed from the cursor, and a resync's
// listing gives up instead of hanging.
func TestLoopTearsDownASilentStream(t *testing.T) {
	o := testOptions()
	o.StreamTimeout = 500 * time.Millisecond // ctrl's keep-alive here: 50ms
	w := newWorld(t, o)
	cursor, before := w.startSettled()
	w.ctrl.Stall()
	waitFor(t, "the silent stream replaced", func() error {
		if n := len(w.ctrl.Watches()); n <= before {
			return errors.New("no new Watch call")
		}
		return nil
	})
	w.checkResumed(before, cursor)
	w.loop.Resync()
	waitFor(t, "a listing during the stall", func() error {
		if w.ctrl.Lists() == 0 {
			return errors.New("no ListDesired call yet")
		}
		return nil
	})
	waitFor(t, "the silent listing abandoned", func() error {
		if n := w.ctrl.OpenLists(); n > 0 {
			return fmt.Errorf("%d listings still open", n)
		}
		return nil
	})
	w.ctrl.Resume()
	// Back to a timeout a loaded machine cannot trip by being slow.
	w.loop.SetOptions(testOptions())
	v := w.put("b", "1")
	w.waitApplied("b", v)
	w.resync()
}

// TestLoopCursorStaysHonestWhenASessionEnds: an apply cut short because
// the plugin is going away has no outcome. Counted as a failed attempt,
// its last attempt used to park the change without reporting it, and the
// cursor passed a change that was neither applied nor parked.
func TestLoopCursorStaysHonestWhenASessionEnds(t *testing.T) {
	o := testOptions()
	o.MaxAttempts = 1
	w := newWorld(t, o)
	w.start()
	w.waitBootstrapped()
	applying := make(chan struct{})
	w.plugin.setGate(func(ctx context.Context, ch sdk.Change) {
		if ch.ID == "slow" {
			close(applying)
			<-ctx.Done()
		}
	})
	before := w.loop.Cursor()
	v := w.put("slow", "1")
	<-applying
	release := w.plugin.hold() // the next instance is slow to come
	w.plugin.setGate(nil)
	w.plugin.Restart()
	waitFor(t, "the apply cut short", func() error {
		w.plugin.mu.Lock()
		defer w.plugin.mu.Unlock()
		if w.plugin.inFlight > 0 {
			return errors.New("still applying")
		}
		return nil
	})
	if c := w.loop.Cursor(); c >= v {
		t.Errorf("cursor %d passed slow@%d, which was neither applied nor parked (cursor before: %d)", c, v, before)
	}
	if p := w.reports.parked(); len(p) > 0 {
		t.Errorf("an interrupted apply was reported as a failure: %v", p)
	}
	release()
	w.waitApplied("slow", v)
}

// TestLoopClearsFailuresOfObjectsNoLongerDesired: a parked object deleted
// from desired state while the plugin restarts is in no snapshot and was
// never in the cluster: nothing applies it again, and its reported failure
// is cleared instead of standing forever.
func TestLoopClearsFailuresOfObjectsNoLongerDesired(t *testing.T) {
	w := newWorld(t, testOptions())
	w.plugin.script(func(ch sdk.Change) error {
		if ch.ID == "bad" {
			return sdk.Permanent(errors.New("refused"))
		}
		return nil
	})
	w.start()
	w.waitBootstrapped()
	w.waitParked("bad", w.put("bad", "1"))
	w.ctrl.Stall() // the running session does not see the delete
	w.ctrl.Delete(testKind, "bad")
	w.plugin.Restart()
	w.ctrl.Resume()
	w.waitNoneParked("the failure of an object no longer desired cleared")
}

// TestLoopReloadWhileApplying: the plugin restarts (a reload changed its
// block, or it crashed) and the options change while applies are in
// flight. The old session's applies are abandoned, the new instance
// re-bootstraps, and the cluster ends up at desired state, no apply going
// backwards.
func TestLoopReloadWhileApplying(t *testing.T) {
	w := newWorld(t, testOptions())
	w.start()
	w.waitBootstrapped()
	release := make(chan struct{})
	w.plugin.setGate(func(ctx context.Context, ch sdk.Change) {
		select {
		case <-release:
		case <-ctx.Done():
		}
	})
	var ids []string
	for i := range 30 {
		ids = append(ids, fmt.Sprintf("o%d", i))
		w.put(ids[i], "1")
	}
	waitFor(t, "applies in flight", func() error {
		w.plugin.mu.Lock()
		defer w.plugin.mu.Unlock()
		if w.plugin.inFlight < testOptions().Workers {
			return fmt.Errorf("%d in flight", w.plugin.inFlight)
		}
		return nil
	})
	o := w.loop.options()
	o.Workers, o.MaxPending = 2, 3
	w.loop.SetOptions(o)
	w.plugin.Restart()
	for i := range 10 {
		w.put(ids[i], "2")
	}
	close(release)
	waitFor(t, "state equals desired", func() error {
		if d := diff(w.desired(ids), w.plugin.cluster.state()); len(d) > 0 {
			return fmt.Errorf("%v", d)
		}
		return nil
	})
	w.waitCursor(w.ctrl.Head())
	if w.plugin.Instances() != 2 {
		t.Errorf("%d plugin instances, want 2", w.plugin.Instances())
	}
	w.plugin.cluster.mu.Lock()
	defer w.plugin.cluster.mu.Unlock()
	if len(w.plugin.cluster.stale) > 0 {
		t.Errorf("applies went backwards: %v", w.plugin.cluster.stale)
	}
}

// TestLoopBootstrapsAgainAfterCtrlsDatabaseWentBack: ctrl's database is
// restored from a backup (or fails over to a replica that lagged): the
// changes after the backup are lost and their versions are issued again.
// ctrl refuses the host's cursor, and the loop bootstraps again: what the
// restored database holds is applied, a new change at a reissued version
// included, and what it does not hold is collected, though the cluster
// holds it at versions above the restored head.
func TestLoopBootstrapsAgainAfterCtrlsDatabaseWentBack(t *testing.T) {
	w := newWorld(t, testOptions())
	w.put("a", "1")
	backup := w.ctrl.Head()
	w.put("lost-1", "1")
	w.put("lost-2", "1")
	w.put("lost-3", "1")
	w.start()
	w.waitBootstrapped()
	w.waitCursor(w.ctrl.Head())
	w.waitApplied("lost-3", w.ctrl.Head())

	w.ctrl.Restore(backup)
	reissued := w.put("b", "1") // at a version the host has seen already
	want := w.desired([]string{"a", "b", "lost-1", "lost-2", "lost-3"})
	waitFor(t, "the cluster converged to the restored database", func() error {
		if d := diff(want, w.plugin.cluster.state()); len(d) > 0 {
			return fmt.Errorf("%v", d)
		}
		return nil
	})
	w.waitApplied("b", reissued)
	if n := testutilCount(t, w.metrics.Rebootstraps.WithLabelValues(testKind)); n < 1 {
		t.Errorf("rebootstraps counted: %v, want at least 1", n)
	}
	// And it streams from the new head: a change after the restore.
	v := w.put("c", "1")
	w.waitApplied("c", v)
}

// TestLoopWaitsForCtrlsRetryHint: a bootstrap ctrl refuses with
// RESOURCE_EXHAUSTED and a RetryInfo (its bootstrap limit, in a reconnect
// storm) is tried again no sooner than the hint, although the loop's own
// reconnect delay is milliseconds, and then completes.
func TestLoopWaitsForCtrlsRetryHint(t *testing.T) {
	const hint = 400 * time.Millisecond
	w := newWorld(t, testOptions())
	v := w.put("a", "1")
	w.ctrl.RefuseBootstraps(2, hint)
	w.start()
	w.waitBootstrapped()
	w.waitApplied("a", v)
	times := w.ctrl.WatchTimes()
	if len(times) < 3 {
		t.Fatalf("%d Watch calls, want 2 refused and the bootstrap", len(times))
	}
	for i := 1; i < 3; i++ {
		if gap := times[i].Sub(times[i-1]); gap < hint {
			t.Fatalf("Watch call %d came %s after the refused one, want at least the hint (%s)", i+1, gap, hint)
		}
	}
}
