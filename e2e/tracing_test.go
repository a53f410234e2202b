package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"krane.dev/ctrl/deploytrace"
	"krane.dev/internal/otlptest"
	"krane.dev/sdk"
)

// TestDeployIsOneTrace deploys to both regions of the shared stack, whose
// ctrl, kranes and plugins export spans to an in-process OTLP receiver,
// and checks the deploy's span tree across the three kinds of process:
// ctrl's deployment.workflow with its topology.create, events.emit and
// status.poll children, each (recorded once although Restate replays the
// workflow), under events.emit each region's krane's
// deployment.apply.<region>, and under those the deployment plugin's
// plugin.apply.
func TestDeployIsOneTrace(t *testing.T) {
	st := sharedStack(t)
	id := deployJSON(t, st, "e2e-trace", "registry.local/e2e/trace:1", 1)
	traceID := deploytrace.TraceID(id).String()

	var spans []otlptest.Span
	var problem error
	deadline := time.After(90 * time.Second)
	for {
		var more <-chan struct{}
		spans, more = traces.Trace(traceID)
		if problem = checkDeployTrace(spans, st.Clusters); problem == nil {
			break
		}
		select {
		case <-more:
		case <-deadline:
			var b strings.Builder
			for _, s := range spans {
				fmt.Fprintf(&b, "  %s %s span=%s parent=%s\n", s.Service, s.Name, s.SpanID, s.ParentSpanID)
			}
			t.Fatalf("deploy %s (trace %s): %v\nspans received:\n%s", id, traceID, problem, b.String())
		}
	}
	t.Logf("deploy %s is one trace of %d spans from ctrl, krane and the deployment plugin", id, len(spans))
}

// checkDeployTrace says what the deploy's trace still lacks, nil when it
// is complete.
func checkDeployTrace[C any](spans []otlptest.Span, regions map[string]C) error {
	named := map[string][]otlptest.Span{}
	for _, s := range spans {
		named[s.Name] = append(named[s.Name], s)
	}
	one := func(name, service string) (otlptest.Span, error) {
		got := named[name]
		if len(got) != 1 {
			return otlptest.Span{}, fmt.Errorf("%d %s spans, want exactly one", len(got), name)
		}
		if got[0].Service != service {
			return got[0], fmt.Errorf("%s from service %q, want %q", name, got[0].Service, service)
		}
		return got[0], nil
	}
	root, err := one(deploytrace.Workflow, "krane-ctrl")
	if err != nil {
		return err
	}
	if root.ParentSpanID != "" || root.Attributes["krane.outcome"] != "ready" {
		return fmt.Errorf("%s has parent %q and outcome %q, want a root that ended ready", root.Name, root.ParentSpanID, root.Attributes["krane.outcome"])
	}
	var emit otlptest.Span
	for _, name := range []string{deploytrace.TopologyCreate, deploytrace.EventsEmit, deploytrace.StatusPoll} {
		s, err := one(name, "krane-ctrl")
		if err != nil {
			return err
		}
		if s.ParentSpanID != root.SpanID {
			return fmt.Errorf("%s's parent is %s, want %s (%s)", name, s.ParentSpanID, root.SpanID, root.Name)
		}
		if name == deploytrace.EventsEmit {
			emit = s
		}
	}
	applies := map[string]bool{}
	for region := range regions {
		name := "deployment.apply." + region
		if len(named[name]) == 0 {
			return fmt.Errorf("no %s span yet", name)
		}
		for _, s := range named[name] {
			if s.Service != "krane" || s.ParentSpanID != emit.SpanID {
				return fmt.Errorf("%s from %q with parent %s, want krane's, under %s (%s)", name, s.Service, s.ParentSpanID, emit.SpanID, emit.Name)
			}
			applies[s.SpanID] = true
		}
	}
	plugin := named[sdk.PluginApplySpan]
	under := map[string]bool{}
	for _, s := range plugin {
		if s.Service != "krane-plugin-deployment" || !applies[s.ParentSpanID] {
			return fmt.Errorf("%s from %q with parent %s, want the deployment plugin's under a deployment.apply span", s.Name, s.Service, s.ParentSpanID)
		}
		under[s.ParentSpanID] = true
	}
	if len(under) < len(regions) {
		return fmt.Errorf("plugin.apply spans under %d apply spans, want one in each of %d regions", len(under), len(regions))
	}
	return nil
}
