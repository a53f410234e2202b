package workflows

import "krane.dev/ctrl/rules"

// The deploy's outcome is journaled by the handlers here and decided by
// ctrl/rules; these names keep the handlers' code and the journal's JSON
// as they were.
type Outcome = rules.Outcome

const (
	ResultReady   = rules.ResultReady
	ResultFailed  = rules.ResultFailed
	ResultStopped = rules.ResultStopped
	ResultGone    = rules.ResultGone
)
