package sdk_test

import (
	"context"
	"sync"
	"testing"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"krane.dev/sdk"
	"krane.dev/sdk/plugintest"
)

// spanSeer is a plugin that remembers the span context and change its
// Apply ran with.
type spanSeer struct {
	mu   sync.Mutex
	seen []trace.SpanContext
	tps  []string
}

func (p *spanSeer) Describe(context.Context, *sdk.DescribeRequest) (*sdk.DescribeResponse, error) {
	return &sdk.DescribeResponse{Info: sdk.Info{Name: "spanseer", Version: "0.0.1", Kinds: []sdk.KindInfo{{Kind: "thing", SpecType: "google.protobuf.Struct"}}}}, nil
}
func (p *spanSeer) Configure(context.Context, *sdk.ConfigureRequest) (*sdk.ConfigureResponse, error) {
	return &sdk.ConfigureResponse{}, nil
}
func (p *spanSeer) Apply(ctx context.Context, req *sdk.ApplyRequest) (*sdk.ApplyResponse, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.seen = append(p.seen, trace.SpanContextFromContext(ctx))
	p.tps = append(p.tps, req.TraceParent)
	return &sdk.ApplyResponse{Result: sdk.Unchanged}, nil
}
func (p *spanSeer) Inventory(context.Context, *sdk.InventoryRequest) (*sdk.InventoryResponse, error) {
	return &sdk.InventoryResponse{}, nil
}
func (p *spanSeer) Shutdown(context.Context) error { return nil }

// TestApplyContinuesTheHostsTrace: over the real plugin protocol, the
// plugin's Apply runs in a plugin.apply span whose parent is the span the
// host called Apply in, and an untraced Apply gets no span.
func TestApplyContinuesTheHostsTrace(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	prev := otel.GetTracerProvider()
	otel.SetTracerProvider(tp)
	t.Cleanup(func() { otel.SetTracerProvider(prev) })

	impl := &spanSeer{}
	ctl := plugintest.New(t, impl)
	ctx := context.Background()

	// Untraced: no span on either side.
	if _, err := ctl.Apply(ctx, &sdk.ApplyRequest{Change: sdk.Change{Kind: "thing", ID: "a", Version: 1}}); err != nil {
		t.Fatal(err)
	}
	if n := len(rec.Ended()); n != 0 {
		t.Fatalf("an untraced Apply recorded %d spans, want none", n)
	}

	// Traced: the host's span is the plugin span's parent.
	hctx, host := tp.Tracer("host").Start(ctx, "thing.apply.eu")
	origin := "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	if _, err := ctl.Apply(hctx, &sdk.ApplyRequest{Change: sdk.Change{Kind: "thing", ID: "b", Version: 2, TraceParent: origin}}); err != nil {
		t.Fatal(err)
	}
	host.End()
	var plugin sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == sdk.PluginApplySpan {
			plugin = s
		}
	}
	if plugin == nil {
		t.Fatalf("no %s span among %d recorded", sdk.PluginApplySpan, len(rec.Ended()))
	}
	if plugin.Parent().SpanID() != host.SpanContext().SpanID() || plugin.SpanContext().TraceID() != host.SpanContext().TraceID() {
		t.Fatalf("plugin span parent %s/%s, want the host's span %s/%s", plugin.Parent().TraceID(), plugin.Parent().SpanID(),
			host.SpanContext().TraceID(), host.SpanContext().SpanID())
	}
	impl.mu.Lock()
	seen, tps := impl.seen[1], impl.tps
	impl.mu.Unlock()
	if seen.SpanID() != plugin.SpanContext().SpanID() {
		t.Fatalf("the controller's ctx carries span %s, want the plugin.apply span %s", seen.SpanID(), plugin.SpanContext().SpanID())
	}
	if tps[0] != "" || tps[1] == "" {
		t.Fatalf("traceparents the controller saw: %q, want none then the host span's", tps)
	}

	// A traced change applied outside any span: the change's own context
	// is the parent.
	if _, err := ctl.Apply(ctx, &sdk.ApplyRequest{Change: sdk.Change{Kind: "thing", ID: "c", Version: 3, TraceParent: origin}}); err != nil {
		t.Fatal(err)
	}
	last := rec.Ended()[len(rec.Ended())-1]
	if last.Name() != sdk.PluginApplySpan || last.Parent().SpanID().String() != "b7ad6b7169203331" || last.SpanContext().TraceID().String() != "0af7651916cd43dd8448eb211c80319c" {
		t.Fatalf("span %s with parent %s in trace %s, want plugin.apply under the change's traceparent", last.Name(), last.Parent().SpanID(), last.SpanContext().TraceID())
	}
}
