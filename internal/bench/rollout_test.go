package bench

import (
	"testing"
	"time"
)

// TestUnionLengthCountsOverlapsOnce: overlapping waves' Kubernetes time
// counts once, so the rollout's overhead (total minus it) cannot go
// negative as the old sum of waves' times did.
func TestUnionLengthCountsOverlapsOnce(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	for _, c := range []struct {
		name  string
		spans []span
		want  time.Duration
	}{
		{"none", nil, 0},
		{"apart", []span{{at(0), at(10)}, {at(20), at(25)}}, 15 * time.Second},
		{"overlapping waves", []span{{at(0), at(10)}, {at(5), at(15)}, {at(14), at(16)}}, 16 * time.Second},
		{"nested, out of order", []span{{at(2), at(3)}, {at(0), at(10)}}, 10 * time.Second},
		{"touching", []span{{at(0), at(5)}, {at(5), at(7)}}, 7 * time.Second},
	} {
		if got := unionLength(c.spans); got != c.want {
			t.Errorf("%s: unionLength = %s, want %s", c.name, got, c.want)
		}
	}
}
