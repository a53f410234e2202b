package sdk

import (
	"context"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// Trace context across the plugin hop. The host sends the W3C traceparent
// of its apply span in ApplyRequest.traceparent (a field, not gRPC
// metadata, so it is part of the protocol and visible in the request);
// the sdk's server side continues the trace with a span around the
// controller's Apply. Both sides use the W3C format directly, whatever
// global propagator a process installed.
var traceContext propagation.TraceContext

// PluginApplySpan is the name of the span the sdk's server side records
// around a controller's Apply.
const PluginApplySpan = "plugin.apply"

// traceParentOf is the traceparent of ctx's span, "" without a valid one.
func traceParentOf(ctx context.Context) string {
	c := propagation.MapCarrier{}
	traceContext.Inject(ctx, c)
	return c["traceparent"]
}

// withTraceParent is ctx with the remote span of traceparent as its
// parent; ctx itself when traceparent is empty or malformed.
func withTraceParent(ctx context.Context, traceparent string) context.Context {
	if traceparent == "" {
		return ctx
	}
	return traceContext.Extract(ctx, propagation.MapCarrier{"traceparent": traceparent})
}

// startApplySpan starts the plugin side's span of an Apply whose request
// carries a trace context; untraced requests get no span.
func startApplySpan(ctx context.Context, req *ApplyRequest) (context.Context, trace.Span) {
	if req.TraceParent == "" {
		return ctx, trace.SpanFromContext(ctx)
	}
	ctx = withTraceParent(ctx, req.TraceParent)
	return otel.Tracer("krane.dev/sdk").Start(ctx, PluginApplySpan, trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(attribute.String("krane.kind", req.Kind), attribute.String("krane.id", req.ID),
			attribute.Int64("krane.version", int64(req.Version)), attribute.Bool("krane.deleted", req.Deleted)))
}

// endApplySpan records the Apply's outcome on its span and ends it.
func endApplySpan(span trace.Span, resp *ApplyResponse, err error) {
	if !span.IsRecording() {
		return
	}
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		span.SetAttributes(attribute.Bool("krane.permanent", IsPermanent(err)))
	} else if resp != nil {
		span.SetAttributes(attribute.String("krane.result", resp.Result.String()))
	}
	span.End()
}
