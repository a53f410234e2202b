// Package deploytrace names the spans of one deploy's trace. A deploy's
// trace and span ids are derived from its deployment id, not drawn at
// random, so that every party computes the same ones without storing them:
// the deploy workflow, whose code Restate replays and whose steps may run
// in any ctrl replica, and the watch streams, which attach the trace
// context to the deployment's changes (ResourceChange.traceparent) while
// its deploy is in progress.
//
// The tree (the design notes' deployment tracing):
//
//	deployment.workflow                      creation -> ready or failed
//	├── deployment.topology.create           the topology rows written
//	├── deployment.events.emit               the rows stamped with versions
//	│   └── deployment.apply.<region>        krane applies the change (host)
//	│       └── plugin.apply                 the plugin's Apply (sdk)
//	└── deployment.status.poll               network -> ready or failed
package deploytrace

import (
	"crypto/sha256"

	"go.opentelemetry.io/otel/trace"
)

// Span names of the ctrl side.
const (
	Workflow       = "deployment.workflow"
	TopologyCreate = "deployment.topology.create"
	EventsEmit     = "deployment.events.emit"
	StatusPoll     = "deployment.status.poll"
)

// TraceID is the trace id of deployment id's deploy.
func TraceID(id string) trace.TraceID {
	sum := sha256.Sum256([]byte("krane/deploy/" + id))
	var t trace.TraceID
	copy(t[:], sum[:16])
	return t
}

// SpanID is the id of the span named name in deployment id's trace.
func SpanID(id, name string) trace.SpanID {
	sum := sha256.Sum256([]byte("krane/deploy/" + id + "/" + name))
	var s trace.SpanID
	copy(s[:], sum[:8])
	return s
}

// SpanContext is the (remote, sampled) context of span name in deployment
// id's trace: the parent to give that span's children.
func SpanContext(id, name string) trace.SpanContext {
	return trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: TraceID(id), SpanID: SpanID(id, name), TraceFlags: trace.FlagsSampled, Remote: true,
	})
}

// TraceParent is the W3C traceparent of the deploy's events.emit span, the
// parent of every cluster's apply of the deployment's change.
func TraceParent(id string) string {
	sc := SpanContext(id, EventsEmit)
	return "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-01"
}
