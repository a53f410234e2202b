// Package rules holds the domain rules ctrl's durable handlers apply,
// apart from the handlers so that a reader finds them by name and tests
// them without Restate:
//
//   - when a deploy is decided (Evaluate: ready, failed with which
//     instances and why, or what each region still lacks), from the
//     actual state ctrl/actual aggregates;
//   - when a sentinel's deploy is decided (EvaluateSentinel,
//     SentinelConverged), by the same aggregation;
//   - how a fleet rollout cuts its sentinels into waves (ComputeWaves,
//     ValidWavePercentages).
//
// It reads nothing itself: the handlers load its inputs from the store.
package rules
