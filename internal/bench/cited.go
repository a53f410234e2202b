package bench

// Citation is a figure measured elsewhere, set beside Krane's for
// comparison. It is never measured here: it is what its source states.
type Citation struct {
	Key  string
	What string
	// Value is as the source states it.
	Value string
	// Source is where a reader can check it.
	Source string
}

// Citations are the figures from elsewhere the documentation compares
// with; the docs' "cited" block lists them with their sources.
var Citations = []Citation{
	{
		Key:    "karmada-propagation",
		What:   "Karmada, pull mode: resource distribution latency p50 / p90 / p99 (v1.3, 100 member clusters, its own test report)",
		Value:  "612 / 881 / 989 ms",
		Source: "https://karmada.io/blog/2022/10/26/test-report",
	},
	{
		Key:    "reference-polling",
		What:   "the reference platform's krane: sleeps a jittered 1-5 s before each reconnect of its change stream (reconnectMin, reconnectMax), so a change can wait that long",
		Value:  "1-5 s",
		Source: "https://github.com/unkeyed/unkey/blob/fc99b6b925/svc/krane/internal/watcher/watcher.go",
	},
}
