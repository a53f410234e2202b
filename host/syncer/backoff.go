package syncer

import (
	"math/rand/v2"
	"time"
)

// Backoff is exponential backoff with full jitter between Min and Max.
type Backoff struct {
	Min, Max time.Duration
}

// Delay is the wait before attempt n (1-based).
func (b Backoff) Delay(n int) time.Duration {
	if n < 1 {
		n = 1
	}
	d := b.Min
	for i := 1; i < n && d < b.Max; i++ {
		d *= 2
	}
	if d > b.Max {
		d = b.Max
	}
	// Jitter in [d/2, d] keeps many clients from retrying in lockstep.
	return d/2 + time.Duration(rand.Int64N(int64(d/2)+1))
}

// Jitter returns a uniformly random duration in [min, max].
func Jitter(min, max time.Duration) time.Duration {
	if max <= min {
		return min
	}
	return min + time.Duration(rand.Int64N(int64(max-min)+1))
}
