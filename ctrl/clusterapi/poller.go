package clusterapi

import (
	"context"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"krane.dev/ctrl/store"
)

// headPoller is the one cheap "did anything change" check per ctrl
// process: it reads change_heads (one row per region and kind) every
// interval and wakes only the streams of the pairs whose head advanced.
// Streams never poll the big tables while idle.
type headPoller struct {
	store    *store.Store
	interval time.Duration
	log      hclog.Logger
	m        *metrics

	mu      sync.Mutex
	heads   map[store.HeadKey]uint64
	waits   map[store.HeadKey]chan struct{}
	failing bool
	polled  bool // a read succeeded
}

func newHeadPoller(s *store.Store, interval time.Duration, log hclog.Logger, m *metrics) *headPoller {
	return &headPoller{
		store: s, interval: interval, log: log, m: m,
		heads: map[store.HeadKey]uint64{},
		waits: map[store.HeadKey]chan struct{}{},
	}
}

// wait returns a channel that is closed when the head of k advances beyond
// what the poller has seen so far (or when polling starts failing, so the
// stream finds out by querying). Take it BEFORE querying the database: a
// commit that lands after the query then still closes it.
func (p *headPoller) wait(k store.HeadKey) <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	ch := p.waits[k]
	if ch == nil {
		ch = make(chan struct{})
		p.waits[k] = ch
	}
	return ch
}

// head is the newest version of k the poller has seen.
func (p *headPoller) head(k store.HeadKey) uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.heads[k]
}

// regionHead is the newest version of any kind in region the poller has
// seen; ok is false before its first successful read or while reads fail
// (the caller asks the database then).
func (p *headPoller) regionHead(region string) (head uint64, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.polled || p.failing {
		return 0, false
	}
	for k, h := range p.heads {
		if k.Region == region {
			head = max(head, h)
		}
	}
	return head, true
}

// isFailing reports whether the last read of the heads failed (streams
// then re-read the database instead of trusting them).
func (p *headPoller) isFailing() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.failing
}

func (p *headPoller) run(ctx context.Context) {
	t := time.NewTicker(p.interval)
	defer t.Stop()
	for {
		p.poll(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (p *headPoller) poll(ctx context.Context) {
	qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	p.m.headPolls.Inc()
	heads, err := p.store.ChangeHeads(qctx)
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return
		}
		p.m.headPollErrors.Inc()
		p.mu.Lock()
		defer p.mu.Unlock()
		if !p.failing {
			p.failing = true
			p.log.Error("cannot read change heads; waking every stream so it re-checks the database (retrying)", "error", err)
			for k, ch := range p.waits {
				close(ch)
				delete(p.waits, k)
			}
		}
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.polled = true
	if p.failing {
		p.failing = false
		p.log.Info("change heads readable again")
	}
	for k, h := range heads {
		if h <= p.heads[k] {
			continue
		}
		p.heads[k] = h
		p.m.headVersion.WithLabelValues(k.Region, k.Kind).Set(float64(h))
		if ch := p.waits[k]; ch != nil {
			close(ch)
			delete(p.waits, k)
		}
	}
}
