package rules_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"krane.dev/ctrl/rules"
)

func ids(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("s%04d", i)
	}
	return out
}

func sizes(waves []rules.PlannedWave) []int {
	out := make([]int, len(waves))
	for i, w := range waves {
		out[i] = len(w.IDs)
	}
	return out
}

func TestComputeWaves(t *testing.T) {
	def := rules.DefaultWavePercentages
	for _, c := range []struct {
		n     int
		pcts  []int32
		sizes []int
		pct   []int32
	}{
		{100, def, []int{1, 4, 20, 25, 50}, []int32{1, 5, 25, 50, 100}},
		{3, def, []int{1, 1, 1}, []int32{1, 50, 100}},
		{1, def, []int{1}, []int32{1}},
		{2, def, []int{1, 1}, []int32{1, 100}},
		{10, def, []int{1, 2, 2, 5}, []int32{1, 25, 50, 100}},
		{1000, def, []int{10, 40, 200, 250, 500}, []int32{1, 5, 25, 50, 100}},
		{7, []int32{100}, []int{7}, []int32{100}},
		{10, []int32{20, 60, 100}, []int{2, 4, 4}, []int32{20, 60, 100}},
		{0, def, []int{}, []int32{}},
	} {
		waves := rules.ComputeWaves(ids(c.n), c.pcts)
		var pct []int32
		for _, w := range waves {
			pct = append(pct, w.Percentage)
		}
		if !slices.Equal(sizes(waves), c.sizes) || !slices.Equal(pct, c.pct) {
			t.Errorf("%d sentinels, %v: sizes %v at %v; want %v at %v", c.n, c.pcts, sizes(waves), pct, c.sizes, c.pct)
		}
	}
}

// Every sentinel is in exactly one wave, in order, every wave has one, and
// the cumulative size never exceeds the percentage's share (rounded up),
// for every fleet size up to 1000 and several plans.
func TestComputeWavesProperties(t *testing.T) {
	plans := [][]int32{rules.DefaultWavePercentages, {100}, {50, 100}, {1, 2, 3, 100}, {10, 20, 30, 40, 50, 60, 70, 80, 90, 100}}
	for _, p := range plans {
		for n := 0; n <= 1000; n++ {
			in := ids(n)
			waves := rules.ComputeWaves(in, p)
			var all []string
			for i, w := range waves {
				if len(w.IDs) == 0 {
					t.Fatalf("%d sentinels, %v: wave %d is empty", n, p, i)
				}
				all = append(all, w.IDs...)
				if limit := (n*int(w.Percentage) + 99) / 100; len(all) > limit {
					t.Fatalf("%d sentinels, %v: %d sentinels by wave %d (%d%%), more than %d", n, p, len(all), i, w.Percentage, limit)
				}
			}
			if !slices.Equal(all, in) {
				t.Fatalf("%d sentinels, %v: waves do not hold every sentinel once, in order", n, p)
			}
			if len(waves) > len(p) {
				t.Fatalf("%d sentinels, %v: %d waves", n, p, len(waves))
			}
		}
	}
}

func TestValidWavePercentages(t *testing.T) {
	if err := rules.ValidWavePercentages("wave_percentages", rules.DefaultWavePercentages); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		p    []int32
		want string
	}{
		{nil, "give 1 to 20"},
		{[]int32{1, 5, 25}, "the last percentage is 25, not 100"},
		{[]int32{5, 5, 100}, "wave_percentages[1]: 5 does not exceed the previous percentage 5"},
		{[]int32{50, 10, 100}, "wave_percentages[1]: 10 does not exceed"},
		{[]int32{0, 100}, "wave_percentages[0]: 0 is out of range 1..100"},
		{[]int32{-1, 100}, "wave_percentages[0]: -1 is out of range"},
		{[]int32{50, 101}, "wave_percentages[1]: 101 is out of range"},
		{make([]int32, 21), "give 1 to 20"},
	} {
		err := rules.ValidWavePercentages("wave_percentages", c.p)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want an error containing %q", c.p, err, c.want)
		}
	}
}
