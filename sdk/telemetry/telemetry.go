// Package telemetry turns OpenTelemetry tracing on from the standard OTEL_*
// environment variables, the same way in ctrl, the krane host and every
// plugin built with the sdk (sdk.Serve calls Setup).
//
// Tracing is off unless the environment asks for it: OTEL_TRACES_EXPORTER
// set to "otlp", or an OTLP endpoint (OTEL_EXPORTER_OTLP_ENDPOINT or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT). Off, the global tracer provider stays
// OpenTelemetry's no-op one, which still passes a trace context through, so
// a plugin continues a trace its host does not record. On, spans go in
// batches to an OTLP/gRPC exporter that reads the rest of the OTLP
// variables itself (headers, TLS, timeout), and the sampler comes from
// OTEL_TRACES_SAMPLER (default: parent-based, always on). Only the gRPC
// protocol is built in; another OTEL_EXPORTER_OTLP_PROTOCOL is an error at
// start rather than silence.
//
// The W3C trace-context propagator is installed in either case. The tracer
// provider's ID generator honours WithIDs, so a caller that must give a
// span the same ids every time it is recorded (ctrl's deploy workflow, whose
// code Restate replays) can; any other span gets random ids.
package telemetry

import (
	"context"
	crand "crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// Enabled reports whether the environment turns tracing on (see the
// package documentation), or why its settings are unusable.
func Enabled() (bool, error) {
	if strings.EqualFold(os.Getenv("OTEL_SDK_DISABLED"), "true") {
		return false, nil
	}
	switch exp := strings.TrimSpace(os.Getenv("OTEL_TRACES_EXPORTER")); exp {
	case "none":
		return false, nil
	case "":
		if os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") == "" && os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") == "" {
			return false, nil
		}
	case "otlp":
	default:
		return false, fmt.Errorf("OTEL_TRACES_EXPORTER=%q: krane exports traces with otlp only (or none to turn them off)", exp)
	}
	proto := os.Getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
	if proto == "" {
		proto = os.Getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	if proto != "" && proto != "grpc" {
		return false, fmt.Errorf("OTLP protocol %q: krane exports traces over grpc only; set OTEL_EXPORTER_OTLP_PROTOCOL=grpc and a gRPC endpoint (port 4317 by convention)", proto)
	}
	return true, nil
}

// Options adjust Setup.
type Options struct {
	// IgnoreServiceNameEnv keeps Service even when OTEL_SERVICE_NAME is
	// set: a plugin inherits its host's environment and must not report
	// under the host's name.
	IgnoreServiceNameEnv bool
}

// Setup installs the W3C propagator and, when the environment turns
// tracing on, an OTLP tracer provider whose service.name is service (or
// OTEL_SERVICE_NAME). The returned shutdown flushes buffered spans; call it
// before the process exits. With tracing off it installs nothing else and
// shutdown does nothing.
func Setup(ctx context.Context, service string, o Options) (shutdown func(context.Context) error, err error) {
	otel.SetTextMapPropagator(propagation.TraceContext{})
	noop := func(context.Context) error { return nil }
	on, err := Enabled()
	if err != nil || !on {
		return noop, err
	}
	exp, err := otlptracegrpc.New(ctx)
	if err != nil {
		return noop, fmt.Errorf("tracing: create the OTLP exporter (check OTEL_EXPORTER_OTLP_*): %w", err)
	}
	// Later detectors win: OTEL_SERVICE_NAME (read by WithFromEnv) over
	// service, or service over it for a plugin.
	name := resource.WithAttributes(attribute.String("service.name", service))
	detectors := []resource.Option{resource.WithTelemetrySDK(), name, resource.WithFromEnv()}
	if o.IgnoreServiceNameEnv {
		detectors = []resource.Option{resource.WithTelemetrySDK(), resource.WithFromEnv(), name}
	}
	res, err := resource.New(ctx, detectors...)
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return noop, fmt.Errorf("tracing: build the resource (check OTEL_RESOURCE_ATTRIBUTES): %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res), sdktrace.WithIDGenerator(&idGenerator{}))
	otel.SetTracerProvider(tp)
	return tp.Shutdown, nil
}

type idsKey struct{}

type ids struct {
	trace trace.TraceID
	span  trace.SpanID
}

// WithIDs returns a context in which the next span started (by a tracer
// provider of Setup) gets span id span and, when it has no parent, trace
// id traceID. Other providers ignore it.
func WithIDs(ctx context.Context, traceID trace.TraceID, span trace.SpanID) context.Context {
	return context.WithValue(ctx, idsKey{}, ids{trace: traceID, span: span})
}

// idGenerator gives the ids WithIDs asks for, random ones otherwise.
type idGenerator struct {
	once sync.Once
	mu   sync.Mutex
	rnd  *rand.Rand
}

func (g *idGenerator) random(b []byte) {
	g.once.Do(func() {
		var seed [32]byte
		_, _ = crand.Read(seed[:])
		g.rnd = rand.New(rand.NewChaCha8(seed))
	})
	g.mu.Lock()
	defer g.mu.Unlock()
	for i := 0; i < len(b); i += 8 {
		var w [8]byte
		binary.LittleEndian.PutUint64(w[:], g.rnd.Uint64())
		copy(b[i:], w[:])
	}
}

func (g *idGenerator) NewIDs(ctx context.Context) (trace.TraceID, trace.SpanID) {
	if o, ok := ctx.Value(idsKey{}).(ids); ok && o.trace.IsValid() && o.span.IsValid() {
		return o.trace, o.span
	}
	var t trace.TraceID
	for !t.IsValid() {
		g.random(t[:])
	}
	return t, g.NewSpanID(context.Background(), t)
}

func (g *idGenerator) NewSpanID(ctx context.Context, _ trace.TraceID) trace.SpanID {
	if o, ok := ctx.Value(idsKey{}).(ids); ok && o.span.IsValid() {
		return o.span
	}
	var s trace.SpanID
	for !s.IsValid() {
		g.random(s[:])
	}
	return s
}
