// Package otlptest is a small OTLP trace receiver for tests: an in-process
// gRPC server of the OTLP collector's TraceService that keeps every span
// it is sent, so a test can point the standard OTEL_* variables of real
// processes at it and check the spans they export.
package otlptest

import (
	"context"
	"encoding/hex"
	"fmt"
	"net"
	"sort"
	"sync"

	collectorv1 "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonv1 "go.opentelemetry.io/proto/otlp/common/v1"
	"google.golang.org/grpc"
)

// Span is one received span, with the service.name of its resource.
type Span struct {
	Service      string
	Name         string
	TraceID      string // hex
	SpanID       string // hex
	ParentSpanID string // hex, "" for a root
	StartNanos   uint64
	EndNanos     uint64
	Attributes   map[string]string
	Error        bool
}

// Receiver collects spans until Stop.
type Receiver struct {
	collectorv1.UnimplementedTraceServiceServer
	lis net.Listener
	srv *grpc.Server

	mu      sync.Mutex
	spans   []Span
	changed chan struct{}
}

// Start listens on a free loopback port.
func Start() (*Receiver, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("otlptest: listen: %w", err)
	}
	r := &Receiver{lis: lis, srv: grpc.NewServer(), changed: make(chan struct{})}
	collectorv1.RegisterTraceServiceServer(r.srv, r)
	go func() { _ = r.srv.Serve(lis) }()
	return r, nil
}

// Endpoint is the receiver's address as OTEL_EXPORTER_OTLP_ENDPOINT wants it.
func (r *Receiver) Endpoint() string { return "http://" + r.lis.Addr().String() }

// Env turns tracing on in a process, exporting to the receiver without
// TLS, in batches sent every 100 ms.
func (r *Receiver) Env() []string {
	return []string{
		"OTEL_EXPORTER_OTLP_ENDPOINT=" + r.Endpoint(),
		"OTEL_EXPORTER_OTLP_INSECURE=true",
		"OTEL_BSP_SCHEDULE_DELAY=100",
	}
}

// Stop ends the server.
func (r *Receiver) Stop() { r.srv.Stop() }

// Export implements the OTLP TraceService.
func (r *Receiver) Export(_ context.Context, req *collectorv1.ExportTraceServiceRequest) (*collectorv1.ExportTraceServiceResponse, error) {
	var got []Span
	for _, rs := range req.GetResourceSpans() {
		service := ""
		for _, a := range rs.GetResource().GetAttributes() {
			if a.GetKey() == "service.name" {
				service = a.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				sp := Span{
					Service: service, Name: s.GetName(), TraceID: hex.EncodeToString(s.GetTraceId()), SpanID: hex.EncodeToString(s.GetSpanId()),
					ParentSpanID: hex.EncodeToString(s.GetParentSpanId()), StartNanos: s.GetStartTimeUnixNano(), EndNanos: s.GetEndTimeUnixNano(),
					Attributes: map[string]string{}, Error: s.GetStatus().GetCode() == 2,
				}
				for _, a := range s.GetAttributes() {
					sp.Attributes[a.GetKey()] = valueString(a.GetValue())
				}
				got = append(got, sp)
			}
		}
	}
	r.mu.Lock()
	r.spans = append(r.spans, got...)
	close(r.changed)
	r.changed = make(chan struct{})
	r.mu.Unlock()
	return &collectorv1.ExportTraceServiceResponse{}, nil
}

func valueString(v *commonv1.AnyValue) string {
	switch x := v.GetValue().(type) {
	case *commonv1.AnyValue_StringValue:
		return x.StringValue
	case *commonv1.AnyValue_IntValue:
		return fmt.Sprint(x.IntValue)
	case *commonv1.AnyValue_BoolValue:
		return fmt.Sprint(x.BoolValue)
	case *commonv1.AnyValue_DoubleValue:
		return fmt.Sprint(x.DoubleValue)
	default:
		return v.String()
	}
}

// Trace returns the spans received so far of trace traceID (hex), ordered
// by start time, and a channel closed when more spans arrive.
func (r *Receiver) Trace(traceID string) ([]Span, <-chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []Span
	for _, s := range r.spans {
		if s.TraceID == traceID {
			out = append(out, s)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].StartNanos < out[j].StartNanos })
	return out, r.changed
}
