package proxy

import (
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
)

// Ejection backoff after a failed connect: base, doubled per consecutive
// failure, capped. Short enough that an instance that only blipped is back
// within seconds, long enough that a dead one is not dialed per request.
const (
	ejectBase = time.Second
	ejectMax  = 30 * time.Second
)

// instance is one endpoint. Its state survives endpoint updates (the pool
// keeps instances by address), so an instance that stays listed keeps its
// in-flight count and ejection.
type instance struct {
	addr     string // host:port, as dialed
	inflight atomic.Int64
	// ejectedUntil is a unix-nano deadline; 0 when not ejected.
	ejectedUntil atomic.Int64
	failures     atomic.Int32
}

func (i *instance) ejected(now int64) bool { return i.ejectedUntil.Load() > now }

// eject takes the instance out of rotation for a backoff that grows with
// consecutive failures.
func (i *instance) eject(now time.Time) time.Duration {
	n := i.failures.Add(1)
	d := ejectBase << min(n-1, 5)
	d = min(d, ejectMax)
	i.ejectedUntil.Store(now.Add(d).UnixNano())
	return d
}

// succeeded resets the backoff after a connect worked.
func (i *instance) succeeded() {
	if i.failures.Load() != 0 {
		i.failures.Store(0)
		i.ejectedUntil.Store(0)
	}
}

// Pool is the set of ready instances of one backend (one deployment).
// SetInstances replaces the set; Pick chooses one.
type Pool struct {
	mu        sync.Mutex // serializes SetInstances
	instances atomic.Pointer[[]*instance]
	synced    atomic.Bool
	// active counts requests being served by this pool, so a retired pool
	// can tell when its last request finished.
	active atomic.Int64
}

// NewPool returns an empty pool that is not yet synced.
func NewPool() *Pool {
	p := &Pool{}
	empty := []*instance{}
	p.instances.Store(&empty)
	return p
}

// SetInstances replaces the ready instances (host:port each) and marks the
// pool synced. Instances listed before keep their state.
func (p *Pool) SetInstances(addrs []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	old := *p.instances.Load()
	byAddr := make(map[string]*instance, len(old))
	for _, in := range old {
		byAddr[in.addr] = in
	}
	next := make([]*instance, 0, len(addrs))
	seen := make(map[string]bool, len(addrs))
	for _, a := range addrs {
		if seen[a] {
			continue
		}
		seen[a] = true
		in := byAddr[a]
		if in == nil {
			in = &instance{addr: a}
		}
		next = append(next, in)
	}
	p.instances.Store(&next)
	p.synced.Store(true)
}

// Synced reports whether the pool has been given its instances once.
func (p *Pool) Synced() bool { return p.synced.Load() }

// Ready is the number of listed (ready) instances.
func (p *Pool) Ready() int { return len(*p.instances.Load()) }

// Active is the number of requests in flight on the pool.
func (p *Pool) Active() int64 { return p.active.Load() }

// Addrs lists the instances' addresses.
func (p *Pool) Addrs() []string {
	ins := *p.instances.Load()
	out := make([]string, len(ins))
	for i, in := range ins {
		out[i] = in.addr
	}
	return out
}

// pick chooses an instance by the power of two choices over in-flight
// counts, skipping ejected instances and those in tried. When every
// untried instance is ejected it ignores ejection (a stale ejection should
// cost a fast connect error, not a refused request). nil means none is left.
func (p *Pool) pick(tried []*instance) *instance {
	ins := *p.instances.Load()
	now := time.Now().UnixNano()
	// Fast path, the common case: two random distinct instances, neither
	// ejected.
	if n := len(ins); len(tried) == 0 && n > 0 {
		if n == 1 && !ins[0].ejected(now) {
			return ins[0]
		}
		if n > 1 {
			i, j := rand.IntN(n), rand.IntN(n-1)
			if j >= i {
				j++
			}
			a, b := ins[i], ins[j]
			if !a.ejected(now) && !b.ejected(now) {
				if b.inflight.Load() < a.inflight.Load() {
					return b
				}
				return a
			}
		}
	}
	var a, b *instance
	var candidates int
	// Two passes: first without ejected instances, then with them.
	for pass := 0; pass < 2 && a == nil; pass++ {
		candidates = 0
		for _, in := range ins {
			if contains(tried, in) || (pass == 0 && in.ejected(now)) {
				continue
			}
			candidates++
			// Reservoir sampling of two distinct candidates in one pass.
			switch {
			case candidates == 1:
				a = in
			case candidates == 2:
				b = in
			default:
				if j := rand.IntN(candidates); j == 0 {
					a = in
				} else if j == 1 {
					b = in
				}
			}
		}
	}
	if b != nil && b.inflight.Load() < a.inflight.Load() {
		return b
	}
	if b != nil && b.inflight.Load() == a.inflight.Load() && rand.IntN(2) == 0 {
		return b
	}
	return a
}

func contains(list []*instance, in *instance) bool {
	for _, x := range list {
		if x == in {
			return true
		}
	}
	return false
}
