package sdk

import (
	"context"
	"maps"
	"slices"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"
)

// StatusFeed is a plugin's WatchStatus, written once: the plugin says what
// changed (Changed, usually from its informers' event handlers: see
// kube.OnChange) and how to observe one object's status (Observe); the
// feed does the rest, for every status stream the host opens:
//
//   - coalescing: a burst of events on one object within Tick is one report;
//   - dedupe: a report equal to the one this stream sent last is not sent;
//   - delete once: an object that is gone is reported gone once, at the
//     version of the delete that removed it (Deleted), then forgotten (full
//     passes repeat it while the feed remembers that delete);
//   - full passes: a new stream, a ChangedAll (after Configure) and every
//     Resend interval send every object's status again, changed or not, so
//     a report lost on the way heals without anyone asking;
//   - rechecks: statuses that depend on time rather than events (Recheck)
//     are observed again every RecheckEvery.
//
// A StatusFeed implements [StatusWatcher]: embed it in the controller, or
// return feed.WatchStatus(ctx, send) from the controller's own.
type StatusFeed struct {
	opts FeedOptions

	mu      sync.Mutex
	streams map[*feedStream]struct{}
	deletes map[string]deleteMark
	resend  time.Duration
}

// FeedOptions shape a StatusFeed.
type FeedOptions struct {
	// Kind of every report.
	Kind string
	// Observe returns one object's status as the plugin's caches see it
	// now. For an object that does not exist it returns Gone with the
	// kind's "deleted" status; the feed reports that only for objects this
	// stream reported present before, or that Deleted names.
	Observe func(id string) Observation
	// IDs lists every object the caches hold, for full passes. It may
	// return nil before Configure.
	IDs func() []string
	// Tick is how long changes are coalesced; default 200ms.
	Tick time.Duration
	// Resend is the interval of full passes; default 5 minutes. SetResend
	// changes it (a config reload).
	Resend time.Duration
	// Recheck, when set, marks a sent status as unsettled: the object is
	// observed again every RecheckEvery (default 1s) until it settles.
	Recheck      func(status proto.Message) bool
	RecheckEvery time.Duration
	// DeleteMemory is how long Deleted remembers a delete's version;
	// default 15 minutes.
	DeleteMemory time.Duration
}

// Observation is one object's status at one moment.
type Observation struct {
	Status proto.Message
	// Version is the desired version the status reflects (usually the
	// object's kube.VersionAnnotation).
	Version uint64
	// Gone means the object no longer exists in the cluster.
	Gone bool
}

type deleteMark struct {
	version uint64
	at      time.Time
}

// NewStatusFeed returns a feed; it does nothing until the host opens a
// status stream.
func NewStatusFeed(o FeedOptions) *StatusFeed {
	if o.Tick <= 0 {
		o.Tick = 200 * time.Millisecond
	}
	if o.Resend <= 0 {
		o.Resend = 5 * time.Minute
	}
	if o.RecheckEvery <= 0 {
		o.RecheckEvery = time.Second
	}
	if o.DeleteMemory <= 0 {
		o.DeleteMemory = 15 * time.Minute
	}
	if o.IDs == nil {
		o.IDs = func() []string { return nil }
	}
	return &StatusFeed{opts: o, streams: map[*feedStream]struct{}{}, deletes: map[string]deleteMark{}, resend: o.Resend}
}

// Changed says object id may have a new status.
func (f *StatusFeed) Changed(id string) {
	if id == "" {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for s := range f.streams {
		s.dirty[id] = struct{}{}
	}
}

// ChangedAll says every status may have changed (a new configuration): the
// next tick of every stream is a full pass.
func (f *StatusFeed) ChangedAll() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for s := range f.streams {
		s.all = true
	}
}

// Deleted records that Apply deleted object id at version: its gone report
// carries that version (a deleted object has no annotation left to carry
// it, and ctrl ignores reports older than what it has).
func (f *StatusFeed) Deleted(id string, version uint64) {
	f.mu.Lock()
	now := time.Now()
	maps.DeleteFunc(f.deletes, func(_ string, m deleteMark) bool { return now.Sub(m.at) > f.opts.DeleteMemory })
	if m, ok := f.deletes[id]; !ok || m.version < version {
		f.deletes[id] = deleteMark{version: version, at: now}
	}
	f.mu.Unlock()
	f.Changed(id)
}

// SetResend changes the interval of full passes.
func (f *StatusFeed) SetResend(d time.Duration) {
	if d <= 0 {
		return
	}
	f.mu.Lock()
	f.resend = d
	f.mu.Unlock()
}

// DeletedVersion is the version of the delete Deleted recorded for id
// within DeleteMemory: a plugin whose objects take a while to go (pods
// terminating) reports that version while they do.
func (f *StatusFeed) DeletedVersion(id string) (uint64, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	m, ok := f.deletes[id]
	if !ok || time.Since(m.at) > f.opts.DeleteMemory {
		return 0, false
	}
	return m.version, true
}

func (f *StatusFeed) markedIDs() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Collect(maps.Keys(f.deletes))
}

// feedStream is one WatchStatus call's state.
type feedStream struct {
	dirty map[string]struct{}
	all   bool
	// last is what this stream sent for each present object.
	last map[string]sent
	// goneSent holds objects this stream reported gone.
	goneSent map[string]struct{}
}

type sent struct {
	status  proto.Message
	version uint64
}

// WatchStatus runs one status stream until ctx ends: a full pass at once,
// then one pass per Tick.
func (f *StatusFeed) WatchStatus(ctx context.Context, send func(StatusReport) error) error {
	s := &feedStream{dirty: map[string]struct{}{}, all: true, last: map[string]sent{}, goneSent: map[string]struct{}{}}
	f.mu.Lock()
	f.streams[s] = struct{}{}
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		delete(f.streams, s)
		f.mu.Unlock()
	}()
	tick := time.NewTicker(f.opts.Tick)
	defer tick.Stop()
	var nextFull, nextRecheck time.Time
	for {
		now := time.Now()
		f.mu.Lock()
		ids := slices.Collect(maps.Keys(s.dirty))
		clear(s.dirty)
		full := s.all || !now.Before(nextFull)
		s.all = false
		resend := f.resend
		f.mu.Unlock()
		switch {
		case full:
			nextFull = now.Add(resend)
			ids = append(ids, f.opts.IDs()...)
			ids = append(ids, slices.Collect(maps.Keys(s.last))...)
			ids = append(ids, f.markedIDs()...)
			// Objects reported gone without a delete mark have nothing more
			// to say; forgetting them keeps the stream's memory bounded.
			maps.DeleteFunc(s.goneSent, func(id string, _ struct{}) bool { _, marked := f.DeletedVersion(id); return !marked })
		case f.opts.Recheck != nil && !now.Before(nextRecheck):
			nextRecheck = now.Add(f.opts.RecheckEvery)
			for id, l := range s.last {
				if f.opts.Recheck(l.status) {
					ids = append(ids, id)
				}
			}
		}
		slices.Sort(ids)
		for _, id := range slices.Compact(ids) {
			if id == "" {
				continue
			}
			if err := f.report(s, id, full, send); err != nil {
				return err
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// report observes one object and sends its status when this stream has
// something new to say about it.
func (f *StatusFeed) report(s *feedStream, id string, full bool, send func(StatusReport) error) error {
	obs := f.opts.Observe(id)
	prev, seen := s.last[id]
	if obs.Gone {
		mark, marked := f.DeletedVersion(id)
		_, done := s.goneSent[id]
		switch {
		case done && !(full && marked):
			return nil // reported; full passes repeat it while the delete is remembered
		case !done && !seen && !marked:
			return nil // never reported present and not deleted through Apply: nothing to say
		}
		obs.Version = max(obs.Version, mark, prev.version) // never older than what ctrl has
	} else {
		delete(s.goneSent, id)
		if !full && seen && prev.version == obs.Version && proto.Equal(prev.status, obs.Status) {
			return nil
		}
	}
	if err := send(StatusReport{Kind: f.opts.Kind, ID: id, ObservedVersion: obs.Version, ObservedAt: time.Now(), Status: obs.Status}); err != nil {
		return err
	}
	if obs.Gone {
		delete(s.last, id)
		s.goneSent[id] = struct{}{}
	} else {
		s.last[id] = sent{status: obs.Status, version: obs.Version}
	}
	return nil
}
