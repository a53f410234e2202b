package syncer

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"
)

// watchdog cancels a stream from ctrl that stays silent too long. ctrl
// sends a keep-alive on idle streams, so silence means ctrl is stopped or
// the link black-holes packets, and no error would ever arrive: gRPC's own
// keep-alive pings only notice a dead connection, not a stuck server.
//
// It only counts the time spent waiting for the next message: call wait
// before each Recv and got after it, so time spent applying back-pressure
// (WaitCapacity) is not mistaken for silence.
type watchdog struct {
	limit time.Duration
	t     *time.Timer
	fired atomic.Bool
}

func newWatchdog(limit time.Duration, cancel context.CancelFunc) *watchdog {
	w := &watchdog{limit: limit}
	w.t = time.AfterFunc(limit, func() {
		w.fired.Store(true)
		cancel()
	})
	w.t.Stop()
	return w
}

// wait arms the watchdog before a Recv.
func (w *watchdog) wait() { w.t.Reset(w.limit) }

// got disarms it after a Recv returned.
func (w *watchdog) got() { w.t.Stop() }

// explain names silence as the cause of err when the watchdog fired.
func (w *watchdog) explain(what string, err error) error {
	if !w.fired.Load() {
		return err
	}
	return fmt.Errorf("%s: nothing from ctrl for %s, not even a keep-alive (sync.stream_timeout): gave up on the stream: %w", what, w.limit, err)
}
