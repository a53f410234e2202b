package syncer

import (
	"context"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"krane.dev/sdk"
)

// A change that carries a trace context (ResourceChange.traceparent, e.g.
// from a deploy in progress) is applied inside a span named
// "<kind>.apply.<region>", a child of the change's origin: for a deployment
// the design notes' deployment.apply.<region>. The sdk's client sends this
// span's context to the plugin, whose Apply becomes its child. Untraced
// changes (most of them: resyncs, GC, changes made outside a deploy) get no
// span. Every attempt of a retried change is a span of its own.

// ApplySpanName is the host's span name for applying a change of kind in
// region.
func ApplySpanName(kind, region string) string { return kind + ".apply." + region }

func (l *Loop) startApplySpan(ctx context.Context, t *task) (context.Context, trace.Span) {
	c := t.change
	if c.TraceParent == "" {
		return ctx, trace.SpanFromContext(ctx)
	}
	ctx = propagation.TraceContext{}.Extract(ctx, propagation.MapCarrier{"traceparent": c.TraceParent})
	source := [...]string{fromStream: "stream", repair: "resync", collect: "gc"}[t.kind]
	return otel.Tracer("krane.dev/host/syncer").Start(ctx, ApplySpanName(l.Kind, l.Region), trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.String("krane.kind", l.Kind), attribute.String("krane.region", l.Region), attribute.String("krane.id", c.ID),
			attribute.Int64("krane.version", int64(c.Version)), attribute.Bool("krane.deleted", c.Deleted), attribute.String("krane.source", source)))
}

func endApplySpan(span trace.Span, res sdk.Result, err error, parked bool) {
	if !span.IsRecording() {
		return
	}
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		span.SetAttributes(attribute.Bool("krane.parked", parked))
	} else {
		span.SetAttributes(attribute.String("krane.result", res.String()))
	}
	span.End()
}
