// Package supervisor runs controller plugins as go-plugin processes: it
// starts each one (sha256 pinned when configured, AutoMTLS, dying with the
// host), checks what it describes, validates and hands it its config,
// forwards its status stream, restarts it with exponential backoff (1 s to
// 2 min) when it crashes or hangs (a liveness check: go-plugin's health
// service, with a deadline), and stops it gracefully (Shutdown RPC with a
// deadline, then kill; a process that does not go is killed outright).
package supervisor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"github.com/prometheus/client_golang/prometheus"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"krane.dev/host/config"
	"krane.dev/sdk"
	"krane.dev/shared/version"
)

// Host is what every plugin is told about the cluster.
type Host struct {
	Region    string
	ClusterID string
	Kube      sdk.KubeSource
	LogLevel  string
	// Services are what the host does for the plugin with its ctrl
	// credentials, served through go-plugin's broker; nil serves none.
	Services sdk.Host
	// Environ is the plugin processes' environment (nil: the host's own):
	// the host's, minus what carries its credentials.
	Environ []string
	// Identity, when set, gives each starting instance the Kubernetes
	// credentials of the plugin's own ServiceAccount in place of Kube (with
	// Kube's rate limits); an error fails the start, which is retried
	// with backoff like any other.
	Identity func(ctx context.Context, qps float32, burst int) (sdk.KubeSource, error)
}

// Hooks connect a plugin to the rest of the host.
type Hooks struct {
	// Started is called after every successful start, before the plugin is
	// handed out; returning an error refuses this instance (e.g. a kind
	// already owned by another controller).
	Started func(info sdk.Info) error
	// Status receives the plugin's status reports.
	Status func(sdk.StatusReport)
	// Changed, when set, is called after an instance starts running or
	// stops (Running and Info then tell the new state), outside any lock.
	Changed func()
}

// Metrics are the supervisor's Prometheus metrics.
type Metrics struct {
	Restarts *prometheus.CounterVec
	Up       *prometheus.GaugeVec
}

// NewMetrics registers the supervisor metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Restarts: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "krane_host_plugin_restarts_total", Help: "Plugin (re)starts after the first, by controller."}, []string{"controller"}),
		Up:       prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "krane_host_plugin_up", Help: "1 while the controller's plugin runs and is configured."}, []string{"controller"}),
	}
	reg.MustRegister(m.Restarts, m.Up)
	return m
}

// Backoff bounds restart delays.
var (
	RestartMin = time.Second
	RestartMax = 2 * time.Minute
	// StableAfter: an instance that ran this long resets the backoff.
	StableAfter = time.Minute
	// ShutdownTimeout bounds the Shutdown RPC before the process is killed.
	ShutdownTimeout = 5 * time.Second
	// KillTimeout bounds go-plugin's own stop of the process (it asks the
	// plugin to exit and waits); then the process is sent SIGKILL.
	KillTimeout = 5 * time.Second
)

// Liveness: every LivenessInterval the supervisor asks the plugin's
// health service, giving it LivenessTimeout to answer. A plugin that fails
// LivenessFailures checks in a row is alive but not answering (stuck, or
// stopped): it is killed and restarted like a crashed one.
var (
	LivenessInterval = 5 * time.Second
	LivenessTimeout  = 5 * time.Second
	LivenessFailures = 3
)

// Plugin supervises one controller's plugin process.
type Plugin struct {
	ctl      config.Controller
	host     Host
	hooks    Hooks
	log      hclog.Logger
	metrics  *Metrics
	reattach *plugin.ReattachConfig

	mu      sync.Mutex
	current *instance
	changed chan struct{} // closed and replaced whenever current changes
	lastErr error
	info    sdk.Info
	digest  string // sha256 of the binary the last instance started from
	done    chan struct{}
	// onRestart, when set, is told each restart delay (tests).
	onRestart func(time.Duration)
}

type instance struct {
	client  *plugin.Client
	ctl     sdk.Plugin
	stopped chan struct{}
}

// New prepares a supervisor for one controller; Run starts it.
func New(ctl config.Controller, host Host, hooks Hooks, log hclog.Logger, m *Metrics) *Plugin {
	return &Plugin{ctl: ctl, host: host, hooks: hooks, log: log.Named(ctl.Name).With("controller", ctl.Name), metrics: m, changed: make(chan struct{}), done: make(chan struct{})}
}

// WithReattach makes the supervisor attach to a plugin already serving (a
// test process) instead of starting its binary.
func (p *Plugin) WithReattach(rc *plugin.ReattachConfig) *Plugin {
	p.reattach = rc
	return p
}

// Name is the controller's name.
func (p *Plugin) Name() string { return p.ctl.Name }

// Config is the controller block this supervisor runs.
func (p *Plugin) Config() config.Controller { return p.ctl }

// LastError is why the plugin last failed to start or stopped, if it did.
func (p *Plugin) LastError() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lastErr
}

// Running reports whether an instance runs and is configured.
func (p *Plugin) Running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.current != nil
}

// Pid is the running plugin process's id, 0 when none runs.
func (p *Plugin) Pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.current == nil {
		return 0
	}
	if rc := p.current.client.ReattachConfig(); rc != nil {
		return rc.Pid
	}
	return 0
}

// BinaryChanged reports whether the plugin binary on disk differs from the
// one the running (or last) instance started from, with both digests. A
// binary that cannot be read now (half way through an upgrade) counts as
// unchanged: restarting could only fail.
func (p *Plugin) BinaryChanged() (changed bool, was, now string) {
	p.mu.Lock()
	was = p.digest
	p.mu.Unlock()
	if p.reattach != nil || was == "" {
		return false, was, ""
	}
	now, err := config.FileSHA256(p.ctl.Path)
	if err != nil {
		p.log.Warn("cannot read the plugin binary to see whether it changed", "path", p.ctl.Path, "error", err)
		return false, was, ""
	}
	return now != was, was, now
}

// Info is what the running (or last) instance described.
func (p *Plugin) Info() sdk.Info {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.info
}

// Acquire blocks until an instance runs, then returns its controller and a
// channel closed when that instance stops (syncer.PluginSource).
func (p *Plugin) Acquire(ctx context.Context) (sdk.Controller, <-chan struct{}, error) {
	for {
		p.mu.Lock()
		cur, changed := p.current, p.changed
		p.mu.Unlock()
		if cur != nil {
			return cur.ctl, cur.stopped, nil
		}
		select {
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		case <-p.done:
			return nil, nil, errors.New("plugin supervisor stopped")
		case <-changed:
		}
	}
}

// Run keeps the plugin running until ctx ends, then stops it gracefully.
func (p *Plugin) Run(ctx context.Context) {
	defer close(p.done)
	p.metrics.Restarts.WithLabelValues(p.ctl.Name) // 0 from the start: alerts rate() it
	failures := 0
	for ctx.Err() == nil {
		begin := time.Now()
		err := p.runOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		if time.Since(begin) > StableAfter {
			failures = 0
		}
		failures++
		delay := min(RestartMax, RestartMin<<min(failures-1, 10))
		p.mu.Lock()
		p.lastErr = err
		hook := p.onRestart
		p.mu.Unlock()
		if hook != nil {
			hook(delay)
		}
		if p.hooks.Changed != nil {
			p.hooks.Changed() // LastError changed
		}
		p.metrics.Restarts.WithLabelValues(p.ctl.Name).Inc()
		p.log.Error("plugin is down; restarting it", "error", err, "in", delay, "path", p.ctl.Path)
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
	}
}

// runOnce starts one instance and returns when it exits (error) or ctx ends.
func (p *Plugin) runOnce(ctx context.Context) error {
	client, ctl, info, err := p.start(ctx)
	if err != nil {
		return err
	}
	inst := &instance{client: client, ctl: ctl, stopped: make(chan struct{})}
	p.publish(inst, info)
	p.metrics.Up.WithLabelValues(p.ctl.Name).Set(1)
	p.log.Info("plugin running", "plugin", info.Name, "version", info.Version, "kinds", kindNames(info.Kinds))

	sctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	if p.hooks.Status != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.forwardStatus(sctx, ctl)
		}()
	}
	exited := make(chan struct{})
	go func() {
		for !client.Exited() {
			select {
			case <-sctx.Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
		close(exited)
	}()
	hung := make(chan error, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := p.watchLiveness(sctx, client); err != nil {
			hung <- err
		}
	}()

	var result error
	stop := func() {
		p.publish(nil, info)
		close(inst.stopped)
		cancel()
		wg.Wait()
	}
	select {
	case <-ctx.Done():
		stop()
		p.shutdown(client, ctl)
	case <-exited:
		result = fmt.Errorf("plugin process exited unexpectedly")
		stop()
		p.kill(client, false)
	case err := <-hung:
		result = err
		stop()
		p.kill(client, true)
	}
	p.metrics.Up.WithLabelValues(p.ctl.Name).Set(0)
	return result
}

// watchLiveness checks the plugin every LivenessInterval until ctx ends,
// and returns an error once LivenessFailures checks in a row failed.
func (p *Plugin) watchLiveness(ctx context.Context, client *plugin.Client) error {
	failed := 0
	var last error
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(LivenessInterval):
		}
		err := ping(ctx, client)
		if ctx.Err() != nil {
			return nil
		}
		if err == nil {
			failed = 0
			continue
		}
		failed++
		last = err
		p.log.Warn("plugin did not answer its liveness check", "error", err, "failed_in_a_row", failed, "of", LivenessFailures)
		if failed >= LivenessFailures {
			return fmt.Errorf("plugin is alive but did not answer %d liveness checks in a row (%s each): killed it; last: %w", failed, LivenessTimeout, last)
		}
	}
}

// ping asks go-plugin's health service of the plugin, within
// LivenessTimeout (go-plugin's own Ping has no deadline: against a stopped
// process it would wait forever).
func ping(ctx context.Context, client *plugin.Client) error {
	proto, err := client.Client()
	if err != nil {
		return err
	}
	gc, ok := proto.(*plugin.GRPCClient)
	if !ok {
		return fmt.Errorf("plugin client is %T, not gRPC", proto)
	}
	ctx, cancel := context.WithTimeout(ctx, LivenessTimeout)
	defer cancel()
	_, err = healthpb.NewHealthClient(gc.Conn).Check(ctx, &healthpb.HealthCheckRequest{Service: plugin.GRPCServiceName})
	return err
}

func (p *Plugin) start(ctx context.Context) (*plugin.Client, sdk.Plugin, sdk.Info, error) {
	var sum []byte
	if p.reattach == nil {
		digest, err := config.FileSHA256(p.ctl.Path)
		if err != nil {
			return nil, nil, sdk.Info{}, fmt.Errorf("controller %q: plugin binary %s: %w (set controller %q { path = ... } or plugin_dir in krane.hcl)", p.ctl.Name, p.ctl.Path, err, p.ctl.Name)
		}
		if err := p.ctl.PinError(digest, version.Version); err != nil {
			return nil, nil, sdk.Info{}, err
		}
		if len(p.ctl.SHA256) > 0 {
			// go-plugin checks it again as it starts the file: a binary
			// swapped in between is refused too.
			sum = mustHex(digest)
		}
		p.mu.Lock()
		p.digest = digest
		p.mu.Unlock()
	}
	kubeSrc := p.host.Kube
	if p.host.Identity != nil {
		ictx, cancel := context.WithTimeout(ctx, 30*time.Second)
		src, err := p.host.Identity(ictx, kubeSrc.QPS, kubeSrc.Burst)
		cancel()
		if err != nil {
			return nil, nil, sdk.Info{}, fmt.Errorf("controller %q: Kubernetes identity of its plugin (ServiceAccount %s): %w", p.ctl.Name, p.ctl.ServiceAccount, err)
		}
		kubeSrc = src
	}
	cfg, err := sdk.NewClientConfig(sdk.ClientOptions{Path: p.ctl.Path, SHA256: sum, Logger: p.log, LogLevel: p.host.LogLevel, Reattach: p.reattach, Environ: p.host.Environ})
	if err != nil {
		return nil, nil, sdk.Info{}, fmt.Errorf("controller %q: %w", p.ctl.Name, err)
	}
	client := plugin.NewClient(cfg)
	fail := func(err error) (*plugin.Client, sdk.Plugin, sdk.Info, error) {
		p.kill(client, false)
		return nil, nil, sdk.Info{}, err
	}
	ctl, err := sdk.Dispense(client)
	if err != nil {
		if errors.Is(err, plugin.ErrChecksumsDoNotMatch) {
			return fail(fmt.Errorf("controller %q: plugin binary %s changed while it was starting and no longer matches its pinned sha256: refusing to run it; it is tried again", p.ctl.Name, p.ctl.Path))
		}
		return fail(fmt.Errorf("controller %q: start plugin %s: %w", p.ctl.Name, p.ctl.Path, err))
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	desc, err := ctl.Describe(cctx, &sdk.DescribeRequest{})
	if err != nil {
		return fail(fmt.Errorf("controller %q: describe: %w", p.ctl.Name, err))
	}
	info := desc.Info
	if len(info.Kinds) == 0 {
		return fail(fmt.Errorf("controller %q: plugin %s reconciles no kinds", p.ctl.Name, info.Name))
	}
	cfgJSON, err := p.ctl.ConfigJSON(info.ConfigSchema)
	if err != nil {
		return fail(fmt.Errorf("controller %q: config: %w", p.ctl.Name, err))
	}
	if err := sdk.ValidateConfig(info.ConfigSchema, cfgJSON); err != nil {
		return fail(fmt.Errorf("controller %q: config block in %s: %w", p.ctl.Name, "krane.hcl", err))
	}
	if p.hooks.Started != nil {
		if err := p.hooks.Started(info); err != nil {
			return fail(fmt.Errorf("controller %q: %w", p.ctl.Name, err))
		}
	}
	_, err = ctl.Configure(cctx, &sdk.ConfigureRequest{Region: p.host.Region, ClusterID: p.host.ClusterID, Kube: kubeSrc, Config: cfgJSON, Host: p.host.Services})
	if err != nil {
		return fail(fmt.Errorf("controller %q: configure: %w", p.ctl.Name, err))
	}
	return client, ctl, info, nil
}

// forwardStatus relays the plugin's status stream, reopening it if it ends
// while the plugin lives.
func (p *Plugin) forwardStatus(ctx context.Context, ctl sdk.Plugin) {
	for ctx.Err() == nil {
		err := ctl.WatchStatus(ctx, func(r sdk.StatusReport) error {
			p.hooks.Status(r)
			return nil
		})
		if ctx.Err() != nil {
			return
		}
		p.log.Warn("status stream ended; reopening", "error", err)
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

func (p *Plugin) shutdown(client *plugin.Client, ctl sdk.Plugin) {
	ctx, cancel := context.WithTimeout(context.Background(), ShutdownTimeout)
	defer cancel()
	answered := true
	if err := ctl.Shutdown(ctx); err != nil {
		p.log.Warn("plugin shutdown failed; killing it", "error", err)
		answered = false
	}
	p.kill(client, !answered)
	p.log.Info("plugin stopped")
}

// kill stops the plugin process. go-plugin's Kill first asks the plugin
// to exit and waits for it, which never ends for a process that does not
// answer: a hung one (hard) is sent SIGKILL first, any other after
// KillTimeout. A plugin attached in a test process is never signalled.
func (p *Plugin) kill(client *plugin.Client, hard bool) {
	if hard {
		p.signalKill(client)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		client.Kill()
	}()
	select {
	case <-done:
		return
	case <-time.After(KillTimeout):
	}
	p.log.Warn("plugin did not exit when asked; killing it", "timeout", KillTimeout)
	p.signalKill(client)
	<-done
}

// signalKill sends SIGKILL to the plugin process the supervisor started.
func (p *Plugin) signalKill(client *plugin.Client) {
	if p.reattach != nil {
		return
	}
	rc := client.ReattachConfig()
	if rc == nil || rc.Pid == 0 {
		return
	}
	if proc, err := os.FindProcess(rc.Pid); err == nil {
		_ = proc.Kill()
	}
}

func (p *Plugin) publish(inst *instance, info sdk.Info) {
	p.mu.Lock()
	p.current = inst
	if inst != nil {
		p.info = info
		p.lastErr = nil
	}
	close(p.changed)
	p.changed = make(chan struct{})
	p.mu.Unlock()
	if p.hooks.Changed != nil {
		p.hooks.Changed()
	}
}

// Done is closed when Run has returned (the plugin is stopped).
func (p *Plugin) Done() <-chan struct{} { return p.done }

func kindNames(ks []sdk.KindInfo) []string {
	out := make([]string, len(ks))
	for i, k := range ks {
		out[i] = k.Kind
	}
	return out
}
