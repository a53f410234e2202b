// Package background holds ctrl's loops that Restate does not run: they
// live in every ctrl process for as long as it serves, and act on ctrl's
// durable handlers from outside, through the signed ingress.
//
//   - Notifier wakes waiting deploys (DeployWorkflow) and sentinel deploys
//     (SentinelService) when clusters report, decides them with the rules
//     of ctrl/rules (Evaluate, EvaluateSentinel), and periodically
//     resyncs: it starts deploys whose workflow never started and counts
//     the overdue ones.
//   - SentinelSweeper stops the sentinels nothing uses any more
//     (sentinel.idle_stop_after).
package background
