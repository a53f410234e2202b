// Package plugintest is the test kit for plugin authors:
//
//   - [Serve] runs a Controller inside the test process through go-plugin's
//     real server and returns a ReattachConfig, so a real krane host can be
//     attached to it (coverage, -race and a debugger all work);
//   - [New] does the same and returns the host-side Controller, so a test
//     drives the plugin over the real gRPC path, message limits included;
//   - [Conformance] is the suite every plugin must pass;
//   - [WithHost] gives the plugin a test [sdk.Host] (e.g. a fake
//     DecryptEnv), so a plugin that needs the host's services is tested
//     without a krane host or ctrl.
package plugintest

import (
	"context"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"

	"krane.dev/sdk"
)

// Option adjusts New or Serve.
type Option func(*options)

type options struct {
	host sdk.Host
}

// WithHost provides the plugin's [sdk.Host]. With New it is served to the
// plugin through go-plugin's real broker (every Configure that sets no
// Host gets it), exactly as a krane host serves its own. With Serve, the
// plugin sees it instead of the attached host's services (the real host's
// broker is then not used).
func WithHost(h sdk.Host) Option { return func(o *options) { o.host = h } }

func collect(opts []Option) options {
	var o options
	for _, f := range opts {
		f(&o)
	}
	return o
}

// Serve serves impl in this process until the test ends and returns the
// configuration a host uses to attach to it.
func Serve(tb testing.TB, impl sdk.Controller, opts ...Option) *plugin.ReattachConfig {
	tb.Helper()
	if o := collect(opts); o.host != nil {
		impl = overrideHost{Controller: impl, host: o.host}
	}
	ctx, cancel := context.WithCancel(context.Background())
	reattach := make(chan *plugin.ReattachConfig, 1)
	closed := make(chan struct{})
	cfg := sdk.ServeConfig(impl, hclog.New(&hclog.LoggerOptions{Name: "plugin", Output: hclog.DefaultOutput, Level: hclog.Info}))
	cfg.Test = &plugin.ServeTestConfig{Context: ctx, ReattachConfigCh: reattach, CloseCh: closed}
	go plugin.Serve(cfg)
	tb.Cleanup(func() {
		cancel()
		select {
		case <-closed:
		case <-time.After(5 * time.Second):
			tb.Errorf("plugintest: plugin server did not stop within 5s")
		}
	})
	select {
	case rc := <-reattach:
		return rc
	case <-time.After(10 * time.Second):
		tb.Fatal("plugintest: plugin server did not start within 10s")
		return nil
	}
}

// New serves impl in this process and returns a Controller that reaches it
// through the host-side client over gRPC.
func New(tb testing.TB, impl sdk.Controller, opts ...Option) sdk.Plugin {
	tb.Helper()
	o := collect(opts)
	rc := Serve(tb, impl)
	cfg, err := sdk.NewClientConfig(sdk.ClientOptions{Reattach: rc, Logger: hclog.NewNullLogger()})
	if err != nil {
		tb.Fatal(err)
	}
	client := plugin.NewClient(cfg)
	tb.Cleanup(client.Kill)
	ctl, err := sdk.Dispense(client)
	if err != nil {
		tb.Fatalf("plugintest: connect to the plugin: %v", err)
	}
	if o.host != nil {
		return defaultHost{Plugin: ctl, host: o.host}
	}
	return ctl
}

// defaultHost is the host side of WithHost: Configure sends the test Host
// through the broker unless the caller set one.
type defaultHost struct {
	sdk.Plugin
	host sdk.Host
}

func (d defaultHost) Configure(ctx context.Context, req *sdk.ConfigureRequest) (*sdk.ConfigureResponse, error) {
	if req.Host == nil {
		r := *req
		r.Host = d.host
		req = &r
	}
	return d.Plugin.Configure(ctx, req)
}

// overrideHost is the plugin side of WithHost for Serve. It forwards the
// optional capabilities of the controller it wraps.
type overrideHost struct {
	sdk.Controller
	host sdk.Host
}

func (o overrideHost) Configure(ctx context.Context, req *sdk.ConfigureRequest) (*sdk.ConfigureResponse, error) {
	r := *req
	r.Host = o.host
	return o.Controller.Configure(ctx, &r)
}

func (o overrideHost) WatchStatus(ctx context.Context, send func(sdk.StatusReport) error) error {
	if w, ok := o.Controller.(sdk.StatusWatcher); ok {
		return w.WatchStatus(ctx, send)
	}
	<-ctx.Done()
	return nil
}

func (o overrideHost) Shutdown(ctx context.Context) error {
	if sd, ok := o.Controller.(sdk.Shutdowner); ok {
		return sd.Shutdown(ctx)
	}
	return nil
}

// Apply applies one change through ctl and returns its result, the shape a
// test compares against.
func Apply(ctx context.Context, ctl sdk.Controller, ch sdk.Change) (sdk.Result, error) {
	resp, err := ctl.Apply(ctx, &sdk.ApplyRequest{Change: ch})
	return resp.GetResult(), err
}

// Inventory returns ctl's inventory of kind.
func Inventory(ctx context.Context, ctl sdk.Controller, kind string) ([]sdk.InventoryItem, error) {
	resp, err := ctl.Inventory(ctx, &sdk.InventoryRequest{Kind: kind})
	if err != nil || resp == nil {
		return nil, err
	}
	return resp.Items, nil
}
