package bench

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"

	"krane.dev/internal/testenv"
	"krane.dev/internal/testplugins/noop"
	"krane.dev/sdk"
)

// PluginHop measures host -> plugin Apply with a no-op controller in a real
// plugin process (go-plugin, gRPC, AutoMTLS), against the same controller
// called in-process: the ratio is what the process boundary costs.
func PluginHop(ctx context.Context, e *Env) ([]Figure, error) {
	bin, err := testenv.BuildBinary("krane.dev/internal/testplugins/noop/plugin", "krane-plugin-noop-bench")
	if err != nil {
		return nil, err
	}
	cfg, err := sdk.NewClientConfig(sdk.ClientOptions{Path: bin, Logger: hclog.NewNullLogger()})
	if err != nil {
		return nil, err
	}
	client := plugin.NewClient(cfg)
	defer client.Kill()
	remote, err := sdk.Dispense(client)
	if err != nil {
		return nil, err
	}
	if _, err := remote.Configure(ctx, &sdk.ConfigureRequest{Config: []byte("{}")}); err != nil {
		return nil, err
	}
	local := noop.New("noop-bench")
	spec, _ := sdk.JSONSpec(map[string]any{"image": "registry.local/app:1", "replicas": 2, "env": map[string]any{"A": "1", "B": "2"}})
	kind := "noop-bench.test.krane.dev"

	// Throughput: 16 workers, 20,000 applies over 500 objects (each object
	// re-applied with increasing versions: Applied, like a real stream).
	throughput := func(c sdk.Controller) (float64, error) {
		total, workers := e.size(20000, 320), 16
		var wg sync.WaitGroup
		errs := make(chan error, workers)
		begin := time.Now()
		for w := range workers {
			wg.Go(func() {
				for i := w; i < total; i += workers {
					ch := sdk.Change{Kind: kind, ID: fmt.Sprintf("o%d", i%500), Version: uint64(i + 1), Spec: spec}
					if _, err := c.Apply(ctx, &sdk.ApplyRequest{Change: ch}); err != nil {
						errs <- err
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		if err := <-errs; err != nil {
			return 0, err
		}
		return float64(total) / time.Since(begin).Seconds(), nil
	}
	// Latency: one caller, 2,000 applies.
	latency := func(c sdk.Controller) (float64, error) {
		n := e.size(2000, 50)
		lat := make([]time.Duration, 0, n)
		for i := range n {
			begin := time.Now()
			if _, err := c.Apply(ctx, &sdk.ApplyRequest{Change: sdk.Change{Kind: kind, ID: "lat", Version: uint64(100000 + i), Spec: spec}}); err != nil {
				return 0, err
			}
			lat = append(lat, time.Since(begin))
		}
		slices.Sort(lat)
		return float64(lat[len(lat)/2].Nanoseconds()) / 1000, nil
	}
	var rr, lr, rl, ll []float64
	for rep := range e.reps() {
		for _, m := range []struct {
			c   sdk.Controller
			tp  *[]float64
			lat *[]float64
		}{{remote, &rr, &rl}, {local, &lr, &ll}} {
			t, err := throughput(m.c)
			if err != nil {
				return nil, err
			}
			l, err := latency(m.c)
			if err != nil {
				return nil, err
			}
			*m.tp, *m.lat = append(*m.tp, t), append(*m.lat, l)
		}
		e.logf("plugin hop: run %d: plugin %.0f/s p50 %.0fµs; in-process %.0f/s p50 %.1fµs", rep+1, rr[rep], rl[rep], lr[rep], ll[rep])
	}
	return []Figure{
		{Key: "plugin", Name: "Apply through the plugin process (no-op controller, 16 callers)", Value: median(rr), Unit: "calls/s"},
		{Key: "in-process", Name: "Apply in-process (same controller)", Value: median(lr), Unit: "calls/s"},
		{Key: "ratio", Name: "plugin / in-process throughput", Value: median(rr) / median(lr), Unit: "ratio", Note: "what the process boundary costs"},
		{Key: "plugin-p50", Name: "Apply latency through the plugin, p50 (1 caller)", Value: median(rl), Unit: "µs"},
		{Key: "in-process-p50", Name: "Apply latency in-process, p50", Value: median(ll), Unit: "µs"},
	}, nil
}
