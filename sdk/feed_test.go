package sdk

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// world is what a plugin's caches would hold: per id, a value and the
// version it was applied at; absent ids are gone.
type world struct {
	mu      sync.Mutex
	objects map[string]obj
	observe int
}

type obj struct {
	value   string
	version uint64
}

func newWorld() *world { return &world{objects: map[string]obj{}} }

func (w *world) set(id, value string, version uint64) {
	w.mu.Lock()
	w.objects[id] = obj{value, version}
	w.mu.Unlock()
}

func (w *world) remove(id string) {
	w.mu.Lock()
	delete(w.objects, id)
	w.mu.Unlock()
}

func (w *world) observeFn(id string) Observation {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.observe++
	o, ok := w.objects[id]
	if !ok {
		return Observation{Status: statusOf("gone"), Gone: true}
	}
	return Observation{Status: statusOf(o.value), Version: o.version}
}

func (w *world) ids() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for id := range w.objects {
		out = append(out, id)
	}
	return out
}

func statusOf(v string) proto.Message {
	st, _ := structpb.NewStruct(map[string]any{"v": v})
	return st
}

func valueOf(r StatusReport) string {
	return r.Status.(*structpb.Struct).GetFields()["v"].GetStringValue()
}

// stream runs one WatchStatus and hands its reports over a channel.
type stream struct {
	reports chan StatusReport
	cancel  context.CancelFunc
	done    chan error
}

func open(f *StatusFeed) *stream {
	ctx, cancel := context.WithCancel(context.Background())
	s := &stream{reports: make(chan StatusReport, 10000), cancel: cancel, done: make(chan error, 1)}
	go func() {
		s.done <- f.WatchStatus(ctx, func(r StatusReport) error { s.reports <- r; return nil })
	}()
	return s
}

func (s *stream) close(t *testing.T) {
	t.Helper()
	s.cancel()
	if err := <-s.done; err != nil {
		t.Errorf("WatchStatus: %v", err)
	}
}

// next waits for the next report about id (others are dropped).
func (s *stream) next(t *testing.T, id string) StatusReport {
	t.Helper()
	timeout := time.After(time.Minute)
	for {
		select {
		case r := <-s.reports:
			if r.ID == id {
				return r
			}
		case <-timeout:
			t.Fatalf("no report about %s within a minute", id)
		}
	}
}

// none checks that no report about id arrives while the stream runs n more
// ticks: it waits for a marker object's report, which the feed sends after
// id's in the same pass (ids are sorted), so no fixed sleep decides.
func (s *stream) none(t *testing.T, f *StatusFeed, w *world, id string) {
	t.Helper()
	marker := "zz-marker-" + strconv.Itoa(rand.IntN(1<<30))
	w.set(marker, "m", 1)
	f.Changed(marker)
	f.Changed(id)
	for {
		r := <-s.reports
		if r.ID == id {
			t.Fatalf("unexpected report about %s: %s at %d", id, valueOf(r), r.ObservedVersion)
		}
		if r.ID == marker {
			w.remove(marker)
			return
		}
	}
}

// feedFor returns a feed over w; the test fails if a goroutine it started
// (a stream, the feed's) outlives it.
func feedFor(t *testing.T, w *world, o FeedOptions) *StatusFeed {
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
	o.Kind = "thing"
	o.Observe = w.observeFn
	o.IDs = w.ids
	if o.Tick == 0 {
		o.Tick = 5 * time.Millisecond
	}
	if o.Resend == 0 {
		o.Resend = time.Hour
	}
	return NewStatusFeed(o)
}

func TestFeedStartsWithTheFullPicture(t *testing.T) {
	w := newWorld()
	w.set("a", "1", 3)
	w.set("b", "2", 4)
	f := feedFor(t, w, FeedOptions{})
	s := open(f)
	defer s.close(t)
	if r := s.next(t, "a"); valueOf(r) != "1" || r.ObservedVersion != 3 || r.Kind != "thing" {
		t.Errorf("a: %s at %d (%s)", valueOf(r), r.ObservedVersion, r.Kind)
	}
	if r := s.next(t, "b"); valueOf(r) != "2" || r.ObservedVersion != 4 {
		t.Errorf("b: %s at %d", valueOf(r), r.ObservedVersion)
	}
}

func TestFeedDedupesUnchangedStatus(t *testing.T) {
	w := newWorld()
	w.set("a", "1", 1)
	f := feedFor(t, w, FeedOptions{})
	s := open(f)
	defer s.close(t)
	s.next(t, "a")
	// Events without a change of status: nothing is sent.
	s.none(t, f, w, "a")
	w.set("a", "2", 1)
	f.Changed("a")
	if r := s.next(t, "a"); valueOf(r) != "2" {
		t.Errorf("changed status: got %s", valueOf(r))
	}
	// A new version with the same status is news too.
	w.set("a", "2", 2)
	f.Changed("a")
	if r := s.next(t, "a"); r.ObservedVersion != 2 {
		t.Errorf("new version: got %d", r.ObservedVersion)
	}
}

func TestFeedCoalescesABurst(t *testing.T) {
	w := newWorld()
	f := feedFor(t, w, FeedOptions{Tick: 20 * time.Millisecond})
	s := open(f)
	defer s.close(t)
	w.set("a", "1", 1)
	for range 1000 {
		f.Changed("a")
	}
	if r := s.next(t, "a"); valueOf(r) != "1" {
		t.Errorf("got %s", valueOf(r))
	}
	// One report for the whole burst: nothing more about a.
	s.none(t, f, w, "a")
}

func TestFeedReportsADeleteOnceAtItsVersion(t *testing.T) {
	w := newWorld()
	w.set("a", "1", 5)
	f := feedFor(t, w, FeedOptions{})
	s := open(f)
	defer s.close(t)
	s.next(t, "a")
	f.Deleted("a", 9)
	w.remove("a")
	f.Changed("a")
	r := s.next(t, "a")
	if valueOf(r) != "gone" || r.ObservedVersion != 9 {
		t.Errorf("delete reported as %s at %d, want gone at 9", valueOf(r), r.ObservedVersion)
	}
	// More events about the gone object say nothing new.
	s.none(t, f, w, "a")
}

func TestFeedGoneWithoutDeleteKeepsTheLastVersion(t *testing.T) {
	w := newWorld()
	w.set("a", "1", 5)
	f := feedFor(t, w, FeedOptions{})
	s := open(f)
	defer s.close(t)
	s.next(t, "a")
	w.remove("a") // by hand: no Deleted
	f.Changed("a")
	if r := s.next(t, "a"); valueOf(r) != "gone" || r.ObservedVersion != 5 {
		t.Errorf("hand delete reported as %s at %d, want gone at 5 (never older than what ctrl has)", valueOf(r), r.ObservedVersion)
	}
}

func TestFeedSaysNothingOfUnknownObjects(t *testing.T) {
	w := newWorld()
	f := feedFor(t, w, FeedOptions{})
	s := open(f)
	defer s.close(t)
	s.none(t, f, w, "never-seen")
}

func TestFeedNewStreamReportsRecentDeletes(t *testing.T) {
	w := newWorld()
	f := feedFor(t, w, FeedOptions{})
	f.Deleted("a", 7) // before any stream: the host was reconnecting
	s := open(f)
	defer s.close(t)
	if r := s.next(t, "a"); valueOf(r) != "gone" || r.ObservedVersion != 7 {
		t.Errorf("got %s at %d, want gone at 7", valueOf(r), r.ObservedVersion)
	}
}

func TestFeedResendsEverythingPeriodically(t *testing.T) {
	w := newWorld()
	w.set("a", "1", 1)
	f := feedFor(t, w, FeedOptions{Resend: 20 * time.Millisecond})
	s := open(f)
	defer s.close(t)
	for range 3 { // unchanged, yet sent again each full pass
		if r := s.next(t, "a"); valueOf(r) != "1" {
			t.Fatalf("got %s", valueOf(r))
		}
	}
}

func TestFeedChangedAllIsAFullPass(t *testing.T) {
	w := newWorld()
	w.set("a", "1", 1)
	f := feedFor(t, w, FeedOptions{})
	s := open(f)
	defer s.close(t)
	s.next(t, "a")
	f.ChangedAll()
	if r := s.next(t, "a"); valueOf(r) != "1" {
		t.Errorf("got %s", valueOf(r))
	}
}

func TestFeedRechecksUnsettledStatuses(t *testing.T) {
	w := newWorld()
	w.set("a", "progressing", 1)
	f := feedFor(t, w, FeedOptions{
		Recheck:      func(st proto.Message) bool { return st.(*structpb.Struct).GetFields()["v"].GetStringValue() != "done" },
		RecheckEvery: 5 * time.Millisecond,
	})
	s := open(f)
	defer s.close(t)
	s.next(t, "a")
	w.set("a", "done", 1) // no event: time alone settled it
	if r := s.next(t, "a"); valueOf(r) != "done" {
		t.Errorf("got %s", valueOf(r))
	}
}

func TestFeedServesSeveralStreams(t *testing.T) {
	w := newWorld()
	w.set("a", "1", 1)
	f := feedFor(t, w, FeedOptions{})
	s1, s2 := open(f), open(f)
	defer s1.close(t)
	defer s2.close(t)
	s1.next(t, "a")
	s2.next(t, "a")
	w.set("a", "2", 2)
	f.Changed("a")
	for _, s := range []*stream{s1, s2} {
		if r := s.next(t, "a"); valueOf(r) != "2" {
			t.Errorf("got %s", valueOf(r))
		}
	}
}

func TestFeedStopsOnSendError(t *testing.T) {
	w := newWorld()
	w.set("a", "1", 1)
	f := feedFor(t, w, FeedOptions{})
	err := f.WatchStatus(context.Background(), func(StatusReport) error { return fmt.Errorf("host gone") })
	if err == nil || err.Error() != "host gone" {
		t.Errorf("WatchStatus = %v, want the send error", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.streams) != 0 {
		t.Errorf("%d streams still registered", len(f.streams))
	}
}

// TestFeedConvergesUnderConcurrentChanges: writers change, delete and
// re-create objects concurrently with the stream; once they stop, the last
// report of every object equals its final state, and no report is ever
// older (by version) than one sent before it for the same object.
// KRANE_FEED_SEED replays a run.
func TestFeedConvergesUnderConcurrentChanges(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("KRANE_FEED_SEED"); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	t.Logf("seed %d (replay with KRANE_FEED_SEED=%d)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, seed))
	w := newWorld()
	f := feedFor(t, w, FeedOptions{Tick: time.Millisecond})
	s := open(f)

	const writers, ops, objects = 4, 300, 12
	var version sync.Mutex
	next := uint64(0)
	nextVersion := func() uint64 { version.Lock(); defer version.Unlock(); next++; return next }
	seeds := make([]uint64, writers)
	for i := range seeds {
		seeds[i] = rng.Uint64()
	}
	var wg sync.WaitGroup
	for i := range writers {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(seeds[i], uint64(i)))
			// Each writer owns its objects, so versions per object only grow.
			for range ops {
				id := fmt.Sprintf("w%d-o%d", i, r.IntN(objects/writers))
				v := nextVersion()
				if r.IntN(4) == 0 {
					f.Deleted(id, v)
					w.remove(id)
				} else {
					w.set(id, strconv.Itoa(r.IntN(3)), v)
				}
				f.Changed(id)
			}
		})
	}
	last := map[string]StatusReport{}
	record := func(r StatusReport) {
		if prev, ok := last[r.ID]; ok && r.ObservedVersion < prev.ObservedVersion {
			t.Errorf("%s: report at version %d after one at %d", r.ID, r.ObservedVersion, prev.ObservedVersion)
		}
		last[r.ID] = r
	}
	writersDone := make(chan struct{})
	go func() { wg.Wait(); close(writersDone) }()
drain:
	for {
		select {
		case r := <-s.reports:
			record(r)
		case <-writersDone:
			break drain
		}
	}
	// Final state: every object the writers touched, present or gone.
	final := map[string]Observation{}
	for i := range writers {
		for o := range objects / writers {
			id := fmt.Sprintf("w%d-o%d", i, o)
			final[id] = w.observeFn(id)
			f.Changed(id)
		}
	}
	deadline := time.After(time.Minute)
	for {
		converged := true
		for id, want := range final {
			got, ok := last[id]
			switch {
			case !ok && want.Gone:
			case !ok:
				converged = false
			case want.Gone && valueOf(got) != "gone":
				converged = false
			case !want.Gone && (valueOf(got) != valueOf(StatusReport{Status: want.Status}) || got.ObservedVersion != want.Version):
				converged = false
			}
		}
		if converged {
			break
		}
		select {
		case r := <-s.reports:
			record(r)
		case <-deadline:
			t.Fatalf("reports did not converge to the final state within a minute (seed %d)", seed)
		}
	}
	s.close(t)
}
