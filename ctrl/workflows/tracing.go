package workflows

import (
	"context"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"krane.dev/ctrl/deploytrace"
	"krane.dev/ctrl/store"
	"krane.dev/sdk/telemetry"
)

// Tracing a deploy that Restate replays
//
// A deploy is one trace (see ctrl/deploytrace for the tree). Restate runs a
// workflow's handler code again on every replay, possibly in another ctrl
// process, and may run a Run body twice; a span started in handler code
// would be recorded once per replay, with a wrong duration. So:
//
//   - the trace id and every ctrl span id are derived from the deployment
//     id (deploytrace), the same in every run and every process, and the
//     spans are created with those ids (telemetry.WithIDs) and explicit
//     start and end times;
//   - a span is recorded only inside the Run body of the step it describes,
//     and only by the run of the body that did the work: the topology span
//     by the topology step, events.emit by the VersioningService's stamp
//     step unless it found its grant already recorded (a second run of the
//     body), workflow and status.poll by the status step that moved the
//     deployment to ready or failed, when its compare-and-set changed the
//     row. A body run twice thus records at most one more copy of the
//     topology span, with the same ids;
//   - the watch streams attach the events.emit span's context to the
//     deployment's changes while the deploy is in progress, so each
//     cluster's apply is that span's child without anything stored.
//
// With tracing off (no OTEL_* configuration) the global tracer provider is
// a no-op and all of this costs a few hashes per deploy.

func tracer() trace.Tracer { return otel.Tracer("krane.dev/ctrl/workflows") }

// recordSpan records span name of deployment id's trace, from start to
// end, as a child of parent ("" for the root, deployment.workflow).
func recordSpan(ctx context.Context, id, name, parent string, start, end time.Time, err error, attrs ...attribute.KeyValue) {
	if parent != "" {
		ctx = trace.ContextWithRemoteSpanContext(ctx, deploytrace.SpanContext(id, parent))
	} else {
		ctx = trace.ContextWithSpanContext(ctx, trace.SpanContext{}) // a root, whatever ctx carried
	}
	ctx = telemetry.WithIDs(ctx, deploytrace.TraceID(id), deploytrace.SpanID(id, name))
	attrs = append(attrs, attribute.String("krane.deployment_id", id))
	_, span := tracer().Start(ctx, name, trace.WithTimestamp(start), trace.WithAttributes(attrs...))
	if err != nil {
		span.RecordError(err, trace.WithTimestamp(end))
		span.SetStatus(codes.Error, err.Error())
	}
	span.End(trace.WithTimestamp(end))
}

// traceTopology records deployment.topology.create (call it in the
// topology step's body, after the write).
func traceTopology(ctx context.Context, id string, regions []string, start time.Time, err error) {
	recordSpan(ctx, id, deploytrace.TopologyCreate, deploytrace.Workflow, start, time.Now(), err, attribute.StringSlice("krane.regions", regions))
}

// traceEmit records deployment.events.emit: the stamping of the deploy's
// rows (call it in the stamp step's body, unless the grant was reused).
func traceEmit(ctx context.Context, id string, g store.Grant, refs int, start time.Time) {
	recordSpan(ctx, id, deploytrace.EventsEmit, deploytrace.Workflow, start, time.Now(), nil,
		attribute.Int64("krane.first_version", int64(g.First)), attribute.Int64("krane.last_version", int64(g.Last)), attribute.Int("krane.rows", refs))
}

// traceDecided records the deploy's root span, from the deployment's
// creation, and its wait (deployment.status.poll, from the moment it
// entered network) when it reached network; call it from the step that
// moved the deployment to ready or failed.
func traceDecided(ctx context.Context, st *store.Store, d store.Deployment, status, msg string) error {
	events, err := st.DeploymentEvents(ctx, d.ID)
	if err != nil {
		return err
	}
	now := time.Now()
	var failure error
	if status == store.StatusFailed {
		failure = deployFailure(msg)
	}
	for _, e := range events {
		if e.Status == store.StatusNetwork {
			recordSpan(ctx, d.ID, deploytrace.StatusPoll, deploytrace.Workflow, e.At, now, failure)
			break
		}
	}
	recordSpan(ctx, d.ID, deploytrace.Workflow, "", d.CreatedAt, now, failure,
		attribute.String("krane.outcome", status), attribute.String("krane.environment_id", d.EnvironmentID), attribute.String("krane.image", d.Workload.GetImage()))
	return nil
}

type deployFailure string

func (e deployFailure) Error() string { return string(e) }
