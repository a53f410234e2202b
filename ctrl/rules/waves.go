package rules

import (
	"fmt"

	"krane.dev/ctrl/deployspec"
)

// DefaultWavePercentages are the cumulative percentages of a fleet rollout
// when the request gives none: 100 sentinels go in waves of 1, 4, 20, 25
// and 50.
var DefaultWavePercentages = []int32{1, 5, 25, 50, 100}

// MaxWaves bounds the percentages of one rollout.
const MaxWaves = 20

// ValidWavePercentages checks cumulative wave percentages: 1 to MaxWaves
// values, each in 1..100, strictly increasing, the last one 100 (so every
// sentinel is in some wave).
func ValidWavePercentages(field string, p []int32) error {
	if len(p) == 0 || len(p) > MaxWaves {
		return deployspec.Errorf(field, "give 1 to %d cumulative percentages, e.g. [1, 5, 25, 50, 100]; got %d", MaxWaves, len(p))
	}
	for i, v := range p {
		if v <= 0 || v > 100 {
			return deployspec.Errorf(fmt.Sprintf("%s[%d]", field, i), "%d is out of range 1..100", v)
		}
		if i > 0 && v <= p[i-1] {
			return deployspec.Errorf(fmt.Sprintf("%s[%d]", field, i), "%d does not exceed the previous percentage %d: the percentages are cumulative and strictly increasing", v, p[i-1])
		}
	}
	if last := p[len(p)-1]; last != 100 {
		return deployspec.Errorf(field, "the last percentage is %d, not 100: the sentinels past %d%% would never be rolled", last, last)
	}
	return nil
}

// PlannedWave is one wave of a rollout: the cumulative percentage it
// completes and its sentinels.
type PlannedWave struct {
	Percentage int32
	IDs        []string
}

// ComputeWaves splits ids, in their order, into waves by cumulative
// percentage: wave i ends at ceil(n * p[i] / 100) sentinels. A percentage
// that adds no sentinel beyond the previous one makes no wave, so every
// wave has at least one sentinel and small fleets get fewer waves: with the
// defaults, 3 sentinels go in three waves of one (at 1%, 50% and 100%), 1
// sentinel in a single wave. p must pass ValidWavePercentages.
func ComputeWaves(ids []string, p []int32) []PlannedWave {
	n := len(ids)
	var waves []PlannedWave
	done := 0
	for _, pct := range p {
		target := (n*int(pct) + 99) / 100 // ceil without floating point
		target = min(target, n)
		if target <= done {
			continue
		}
		waves = append(waves, PlannedWave{Percentage: pct, IDs: ids[done:target:target]})
		done = target
	}
	return waves
}
