package clusterapi

import (
	"context"
	"sync"
	"time"

	"krane.dev/ctrl/store"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
)

// A feed is the shared tail of one (region, kind): every stream of the pair
// at the same cursor needs the same rows after a commit, so one query per
// wake reads them for all, and each stream sends them from memory. Without
// it every stream ran its own "version > cursor" query on every wake: a
// commit in a region with 50 clusters was 50 identical queries.
//
// The feed keeps a window of the latest changes: every change of the pair
// with a version in (start, end], in version order, as its own queries
// returned them. Its queries are a stream's queries, so by the argument in
// ctrl/store the window is gap-free: a stream whose cursor is in [start,
// end] may take everything after its cursor from the window and set its
// cursor to end. A stream behind start (a slow one, or one just resumed
// from an old cursor) reads the database itself until it reaches the
// window. The window holds at most feedWindow changes; older ones fall off
// the front.
type feed struct {
	key    store.HeadKey
	window int // changes kept

	mu       sync.Mutex
	anchored bool // start and end mean something
	start    uint64
	end      uint64
	entries  []*feedEntry
	// fetching is closed when the read in flight ends (nil: none).
	fetching chan struct{}
	// completeAt is when the last read that returned everything there was
	// (a short page) began: the window holds every change of the pair
	// committed before then.
	completeAt time.Time
	streams    int
}

// feedEntry is one change and, built once for all streams, its generic
// wire form.
type feedEntry struct {
	c    store.Change
	once sync.Once
	wire *clusterv1.ResourceChange
	err  error
}

func (e *feedEntry) resourceChange() (*clusterv1.ResourceChange, error) {
	e.once.Do(func() { e.wire, e.err = resourceChange(e.c) })
	return e.wire, e.err
}

// feeds holds the feeds of the pairs that have streams.
type feeds struct {
	window int
	off    bool // Options.UnsharedReads
	mu     sync.Mutex
	m      map[store.HeadKey]*feed
}

// acquire returns the feed of k for a stream, or nil when streams do not
// share reads (each then reads the database itself).
func (fs *feeds) acquire(k store.HeadKey) *feed {
	if fs.off {
		return nil
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if fs.m == nil {
		fs.m = map[store.HeadKey]*feed{}
	}
	f := fs.m[k]
	if f == nil {
		f = &feed{key: k, window: fs.window}
		fs.m[k] = f
	}
	f.streams++
	return f
}

// release drops a stream's hold; the last one frees the feed's memory.
func (fs *feeds) release(f *feed) {
	if f == nil {
		return
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if f.streams--; f.streams == 0 {
		delete(fs.m, f.key)
	}
}

// after returns the window's changes after cursor, or ok = false when
// cursor is before the window (or there is none yet).
func (f *feed) after(cursor uint64) (entries []*feedEntry, ok bool) {
	if f == nil {
		return nil, false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.anchored || cursor < f.start {
		return nil, false
	}
	// Entries are in version order; skip those at or before the cursor.
	lo, hi := 0, len(f.entries)
	for lo < hi {
		mid := (lo + hi) / 2
		if f.entries[mid].c.Version <= cursor {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return f.entries[lo:len(f.entries):len(f.entries)], true
}

// done reports whether a stream that has taken the window up to cursor
// has what g asks for.
func (f *feed) done(cursor uint64, g fetchGoal) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return cursor >= f.end && f.reached(g)
}

// anchor starts an empty window at cursor, which a stream has just caught
// up to by its own reads (a window claims nothing until it has fetched).
func (f *feed) anchor(cursor uint64) {
	if f == nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.anchored {
		f.anchored, f.start, f.end = true, cursor, cursor
	}
}

// fetchGoal is what a stream needs of its feed: the window reaching
// target (the head the poller had seen), or, if the row at target is not
// there (superseded, or removed by hand), a complete read started at or
// after asOf (when target had been read). With recheck set, it also needs a
// complete read started at or after recheck, whatever the heads say.
type fetchGoal struct {
	target        uint64
	asOf, recheck time.Time
}

func (f *feed) reached(g fetchGoal) bool {
	return f.anchored && (f.end >= g.target || !f.completeAt.Before(g.asOf)) &&
		(g.recheck.IsZero() || !f.completeAt.Before(g.recheck))
}

// fetch reads the database until the window reaches g, one page per read.
// Concurrent callers share the reads. A feed without a window yet does not
// read (its first stream anchors it).
func (f *feed) fetch(ctx context.Context, s *Server, kind, region string, g fetchGoal) error {
	for {
		f.mu.Lock()
		for f.fetching != nil && f.anchored && !f.reached(g) {
			ch := f.fetching
			f.mu.Unlock()
			select {
			case <-ch:
			case <-ctx.Done():
				return ctx.Err()
			}
			f.mu.Lock()
		}
		if !f.anchored || f.reached(g) {
			f.mu.Unlock()
			return nil
		}
		ch := make(chan struct{})
		f.fetching = ch
		from := f.end
		f.mu.Unlock()

		began := time.Now()
		page, err := s.store.ChangesAfter(ctx, kind, region, from, s.pageSize)
		s.m.watchQuery.WithLabelValues(s.kindLabel(kind), "feed").Observe(time.Since(began).Seconds())

		f.mu.Lock()
		f.fetching = nil
		close(ch)
		if err != nil {
			f.mu.Unlock()
			return err
		}
		for _, c := range page {
			f.entries = append(f.entries, &feedEntry{c: c})
			f.end = c.Version
		}
		if len(page) < s.pageSize {
			// Everything committed before the read began is in the window.
			f.completeAt = began
		}
		if n := len(f.entries) - f.window; n > 0 {
			f.start = f.entries[n-1].c.Version
			// A fresh array: streams may still be reading the old one.
			f.entries = append([]*feedEntry(nil), f.entries[n:]...)
		}
		f.mu.Unlock()
	}
}
