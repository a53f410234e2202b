package background

import (
	"context"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"

	"krane.dev/ctrl/store"
)

// SentinelSweeperOptions configure a SentinelSweeper.
type SentinelSweeperOptions struct {
	Store *store.Store
	Log   hclog.Logger
	// Registerer receives the metrics; nil registers none.
	Registerer prometheus.Registerer
	// IdleAfter is sentinel.idle_stop_after: how long a sentinel must have
	// been unused before it is stopped. 0 turns the sweeper off.
	IdleAfter time.Duration
	// Interval between passes; default IdleAfter/4, between 1s and 1m.
	Interval time.Duration
	// DBTimeout bounds each database call. Default 10s.
	DBTimeout time.Duration
}

// SentinelSweeper stops the sentinels nothing uses any more: a sentinel
// whose environment has no deployment in progress (in any region) and no
// live deployment running in the sentinel's region, with nothing changed
// about either for IdleAfter (store.UnusedSentinels has the exact
// condition). Stopping is store.StopSentinel's soft delete: a new version,
// the cluster deletes the sentinel's objects, the row stays, and the next
// deploy of the environment starts it again.
//
// Every ctrl replica runs a sweeper; they need no coordination. Each stop
// is one transaction that checks the condition again under the sentinel's
// row lock, the lock a deploy takes when it ensures the sentinel
// (store.EnsureSentinels), so a stop and a deploy are ordered: a deploy
// first makes the sentinel used (the stop sees it), a stop first is
// undone by the deploy. Two sweepers stopping one sentinel stop it once.
// A periodic sweep, rather than a delayed call from a deploy's stop path,
// also catches environments whose last deployment ended any other way
// (failed, replaced, rows written before this existed) and survives a
// restart without any state of its own.
type SentinelSweeper struct {
	o       SentinelSweeperOptions
	log     hclog.Logger
	stopped prometheus.Counter
	errors  prometheus.Counter
}

// NewSentinelSweeper returns a sweeper; Run runs it.
func NewSentinelSweeper(o SentinelSweeperOptions) *SentinelSweeper {
	if o.Log == nil {
		o.Log = hclog.NewNullLogger()
	}
	if o.Interval <= 0 {
		o.Interval = min(max(o.IdleAfter/4, time.Second), time.Minute)
	}
	if o.DBTimeout <= 0 {
		o.DBTimeout = 10 * time.Second
	}
	s := &SentinelSweeper{o: o, log: o.Log.Named("sentinel-sweeper"),
		stopped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "krane_ctrl_sentinels_idle_stopped_total",
			Help: "Sentinels stopped because their environment had no live or in-progress deployment in their region for sentinel.idle_stop_after.",
		}),
		errors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "krane_ctrl_sentinel_sweep_errors_total",
			Help: "Sweeps for unused sentinels that failed on the database (the next pass retries).",
		}),
	}
	if o.Registerer != nil {
		o.Registerer.MustRegister(s.stopped, s.errors)
	}
	return s
}

// Run sweeps every Interval until ctx ends. With IdleAfter 0 it returns at
// once.
func (s *SentinelSweeper) Run(ctx context.Context) {
	if s.o.IdleAfter <= 0 {
		return
	}
	t := time.NewTicker(s.o.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if _, err := s.Sweep(ctx, time.Now()); err != nil && ctx.Err() == nil {
			s.errors.Inc()
			s.log.Warn("cannot sweep unused sentinels; the next pass retries", "error", err)
		}
	}
}

// Sweep stops every sentinel unused since now - IdleAfter and returns the
// ids it stopped.
func (s *SentinelSweeper) Sweep(ctx context.Context, now time.Time) ([]string, error) {
	since := now.Add(-s.o.IdleAfter)
	var stopped []string
	after := ""
	for {
		qctx, cancel := context.WithTimeout(ctx, s.o.DBTimeout)
		ids, err := s.o.Store.UnusedSentinels(qctx, since, after, 500)
		cancel()
		if err != nil {
			return stopped, err
		}
		for _, id := range ids {
			qctx, cancel := context.WithTimeout(ctx, s.o.DBTimeout)
			ok, err := s.o.Store.StopUnusedSentinel(qctx, id, since)
			cancel()
			if err != nil {
				return stopped, err
			}
			if ok {
				s.stopped.Inc()
				stopped = append(stopped, id)
				s.log.Info("stopped a sentinel nothing uses (its environment has no live or in-progress deployment in its region)",
					"sentinel", id, "idle_for_at_least", s.o.IdleAfter)
			}
		}
		if len(ids) < 500 {
			return stopped, nil
		}
		after = ids[len(ids)-1]
	}
}
