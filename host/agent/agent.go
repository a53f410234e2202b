// Package agent is the krane host: it reads krane.hcl, connects to ctrl,
// runs one supervised plugin per enabled controller and one sync loop per
// kind those plugins reconcile, forwards status reports, serves /healthz,
// /readyz and /metrics, and applies config reloads by restarting only what
// changed.
package agent

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"os"
	"reflect"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"

	"krane.dev/host/config"
	"krane.dev/host/ctrlclient"
	"krane.dev/host/identity"
	"krane.dev/host/status"
	"krane.dev/host/supervisor"
	"krane.dev/host/syncer"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
	"krane.dev/sdk"
	"krane.dev/shared/version"
)

// Options are for embedding the agent (tests, the demo).
type Options struct {
	// Reattach attaches controllers to plugins already serving (in a test
	// process) instead of starting their binaries.
	Reattach map[string]*plugin.ReattachConfig
	// Registry receives metrics; a fresh one when nil.
	Registry *prometheus.Registry
}

// Agent is a running krane host.
type Agent struct {
	log    hclog.Logger
	opts   Options
	reg    *prometheus.Registry
	supM   *supervisor.Metrics
	syncM  *syncer.Metrics
	hostM  *hostMetrics
	identM *identity.Metrics
	leader leaderState

	// life serialises Run's start/stop and Reload; mu guards the fields
	// below and is never held while waiting for a plugin or loop to stop
	// (a starting plugin's hook takes mu).
	life        sync.Mutex
	mu          sync.Mutex
	cfg         *config.Config
	client      clusterv1.ClusterServiceClient
	reporter    *status.Reporter
	controllers map[string]*controllerRun
	kindOwner   map[string]string
	runCtx      context.Context
	core        *core
	// hb is what heartbeats tell ctrl about the host (heartbeat.go).
	hb heartbeatState
}

// controllerRun is one enabled controller: its plugin and its kinds' loops.
type controllerRun struct {
	plugin *supervisor.Plugin
	cancel context.CancelFunc
	ctx    context.Context
	// identityDone is closed once the plugin's credentials are removed
	// (at once when plugins use the host's own).
	identityDone chan struct{}

	mu    sync.Mutex
	loops map[string]*loopRun
}

type loopRun struct {
	loop   *syncer.Loop
	cancel context.CancelFunc
	done   chan struct{}
}

// New prepares an agent for cfg.
func New(cfg *config.Config, log hclog.Logger, opts Options) *Agent {
	reg := opts.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	a := &Agent{
		log: log, opts: opts, reg: reg, cfg: cfg,
		supM:        supervisor.NewMetrics(reg),
		syncM:       syncer.NewMetrics(reg),
		hostM:       newHostMetrics(reg),
		identM:      identity.NewMetrics(reg),
		controllers: map[string]*controllerRun{},
		kindOwner:   map[string]string{},
		hb:          heartbeatState{kick: make(chan struct{}, 1)},
	}
	a.leader.gauge = prometheus.NewGauge(prometheus.GaugeOpts{Name: "krane_host_leader", Help: "1 while this replica holds the lease and runs the controllers (always 1 without leader election)."})
	if !cfg.Leader.Enabled {
		a.leader.gauge.Set(1)
	}
	reg.MustRegister(a.leader.gauge)
	return a
}

// Run connects to ctrl and runs every enabled controller until ctx ends,
// then stops them gracefully and sends the status reports still queued.
func (a *Agent) Run(ctx context.Context) error {
	a.life.Lock()
	a.mu.Lock()
	a.runCtx = ctx
	cfg := a.cfg
	a.mu.Unlock()
	c, err := dialCore(cfg, a.log)
	if err != nil {
		a.mu.Lock()
		a.runCtx = nil
		a.mu.Unlock()
		a.life.Unlock()
		return err
	}
	a.startCore(c)
	a.mu.Lock()
	for _, ctl := range a.cfg.Enabled() {
		a.startController(ctl)
	}
	a.mu.Unlock()
	a.life.Unlock()
	<-ctx.Done()
	a.life.Lock()
	defer a.life.Unlock()
	a.stopAllControllers()
	a.stopCore(true)
	a.mu.Lock()
	a.runCtx = nil
	a.mu.Unlock()
	return nil
}

// core is the host's connection to ctrl and what runs on it: the status
// reporter's senders and the heartbeat.
type core struct {
	conn   *grpc.ClientConn
	client clusterv1.ClusterServiceClient
	cancel context.CancelFunc
	done   chan struct{}
}

// dialCore builds the connection to ctrl that cfg describes. It starts
// nothing, so a reload can build it before it tears anything down: a CA
// file not there yet fails here, with the running core untouched.
func dialCore(cfg *config.Config, log hclog.Logger) (*core, error) {
	conn, err := ctrlclient.DialLogged(cfg, "krane/"+version.Version, log.Named("ctrl-tls"))
	if err != nil {
		return nil, err
	}
	return &core{conn: conn, client: ctrlclient.New(conn)}, nil
}

// startCore makes c the running core: the status reporter (one for the
// agent's life, so its queue survives reloads) sends on it, and
// heartbeats start.
func (a *Agent) startCore(c *core) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.reporter == nil {
		a.reporter = status.New(c.client, a.log.Named("status"), a.reg, 100000)
	}
	a.reporter.SetClient(c.client)
	ctx, cancel := context.WithCancel(a.runCtx)
	c.cancel, c.done = cancel, make(chan struct{})
	a.core, a.client = c, c.client
	a.hb.acked = "" // this connection (maybe another ctrl, or identity) has heard nothing yet
	reporter := a.reporter
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); reporter.Run(ctx, 4) }()
	go func() { defer wg.Done(); a.heartbeat(ctx, c.client) }()
	go func() { wg.Wait(); close(c.done) }()
	a.log.Info("connecting to ctrl", "url", a.cfg.ControlPlane.URL, "region", a.cfg.Region, "cluster", a.cfg.ClusterID)
}

// reportFlushTimeout bounds sending the queued status reports at shutdown.
const reportFlushTimeout = 5 * time.Second

// stopCore stops the reporter's senders and heartbeats and closes the
// connection. With flush (a shutdown), it first sends what the reporter
// still holds, for up to reportFlushTimeout; after a reload the next core
// sends it instead.
func (a *Agent) stopCore(flush bool) {
	a.mu.Lock()
	c, reporter := a.core, a.reporter
	a.core = nil
	a.mu.Unlock()
	if c == nil {
		return
	}
	c.cancel()
	<-c.done
	if flush && reporter.Depth() > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), reportFlushTimeout)
		n := reporter.Depth()
		left, err := reporter.Flush(ctx)
		cancel()
		if err != nil {
			a.log.Warn("could not send every queued status report before stopping; ctrl learns the rest from the next host's reports",
				"sent", n-left, "left", left, "error", err)
		} else {
			a.log.Info("sent the queued status reports before stopping", "reports", n)
		}
	}
	c.conn.Close()
}

func (a *Agent) supervisorHost() supervisor.Host {
	return supervisor.Host{
		Region: a.cfg.Region, ClusterID: a.cfg.ClusterID, LogLevel: a.cfg.Log.Level,
		Kube:    sdk.KubeSource{InCluster: a.cfg.Kubernetes.Kubeconfig == "", Path: a.cfg.Kubernetes.Kubeconfig, Context: a.cfg.Kubernetes.Context, QPS: a.cfg.Kubernetes.QPS, Burst: a.cfg.Kubernetes.Burst},
		Environ: pluginEnviron(os.Environ(), a.cfg.ControlPlane.TokenEnv),
	}
}

// pluginEnviron is what of the host's environment a plugin process gets:
// only the variables of pluginEnvAllowed (an allowlist, so a secret the
// host's environment holds under any name, its ctrl token in
// control_plane.token_env among them, never reaches a plugin; plugins get
// their config through Configure and their Kubernetes identity as a
// kubeconfig), and never the token_env variable even were it named like
// one of them. Plugins never hold the cluster's credentials; what needs
// them, the host does for them (docs/operating.md, "What a plugin can
// reach").
//
// Plugins run with GOGC=50 unless the environment sets GOGC (see
// pluginGOGC).
func pluginEnviron(environ []string, tokenEnv string) []string {
	env := slices.DeleteFunc(slices.Clone(environ), func(kv string) bool {
		name, _, _ := strings.Cut(kv, "=")
		return name == tokenEnv || !pluginEnvAllowed(name)
	})
	if !slices.ContainsFunc(env, func(kv string) bool { return strings.HasPrefix(kv, "GOGC=") }) {
		env = append(env, "GOGC="+pluginGOGC)
	}
	return env
}

// pluginEnvAllowed reports whether the host passes variable name to its
// plugins: what a Go program and client-go need to run and reach the API
// server as the host does (the search path, home and temporary directory,
// time zone and locale, the Go runtime's settings, the in-cluster API
// server address, CA bundle locations, proxies), the heap profile
// directory meant for the plugins, and OpenTelemetry's OTEL_* settings, so
// a plugin's spans join krane's traces.
func pluginEnvAllowed(name string) bool {
	switch name {
	case "PATH", "HOME", "USER", "TMPDIR", "TZ", "LANG", "LANGUAGE",
		"GOGC", "GOMEMLIMIT", "GOMAXPROCS", "GODEBUG", "GOTRACEBACK", "GOCOVERDIR",
		"KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT",
		"SSL_CERT_FILE", "SSL_CERT_DIR",
		"HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy",
		sdk.EnvHeapProfileDir:
		return true
	}
	return strings.HasPrefix(name, "LC_") || strings.HasPrefix(name, "OTEL_")
}

// pluginGOGC is the plugins' collector setting when the operator sets none:
// a plugin's heap is mostly its informer caches, which live as long as the
// process, so the default (GOGC=100: the heap may grow to twice the live
// data before a collection) costs memory for nothing a plugin needs. 50
// trades a little CPU at cache fills and resyncs for a smaller peak
// (docs/operating.md, "Memory of krane and its plugins").
const pluginGOGC = "50"

// startController runs one controller's plugin; its loops start when the
// plugin describes its kinds. Caller holds a.mu.
func (a *Agent) startController(ctl config.Controller) {
	ctx, cancel := context.WithCancel(a.runCtx)
	run := &controllerRun{cancel: cancel, ctx: ctx, loops: map[string]*loopRun{}, identityDone: make(chan struct{})}
	hooks := supervisor.Hooks{
		Started: func(info sdk.Info) error { return a.claimKinds(ctl.Name, run, info) },
		Status:  a.reporter.Submit,
		Changed: a.kickHeartbeat,
	}
	host := a.supervisorHost()
	host.Services = a.HostFor(ctl.Name)
	if kc := a.cfg.Kubernetes; kc.PluginIdentities.Enabled {
		id := identity.ForPlugin(ctl.Name, ctl.ServiceAccount, func() (*identity.Minter, error) { return identity.NewMinter(kc) }, a.log.Named("identity"), a.identM)
		host.Identity = id.Source
		go func() {
			defer close(run.identityDone)
			id.Run(ctx)
		}()
	} else {
		close(run.identityDone)
	}
	p := supervisor.New(ctl, host, hooks, a.log, a.supM)
	if rc := a.opts.Reattach[ctl.Name]; rc != nil {
		p.WithReattach(rc)
	}
	run.plugin = p
	a.controllers[ctl.Name] = run
	go p.Run(ctx)
	a.log.Info("controller enabled", "controller", ctl.Name, "path", ctl.Path, "pinned", len(ctl.SHA256) > 0,
		"service_account", serviceAccount(a.cfg.Kubernetes, ctl))
}

// serviceAccount is who the controller's plugin is to the API server.
func serviceAccount(k config.Kubernetes, ctl config.Controller) string {
	if !k.PluginIdentities.Enabled {
		return "krane's own (kubernetes.plugin_identities.enabled = false)"
	}
	return k.PluginIdentities.Namespace + "/" + ctl.ServiceAccount
}

// claimKinds makes sure no other controller reconciles the plugin's kinds
// and runs a sync loop per kind (kept across plugin restarts).
func (a *Agent) claimKinds(name string, run *controllerRun, info sdk.Info) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	// The hook runs in the supervisor's goroutine and may come after the
	// controller was stopped (or replaced by a reload): such an instance
	// claims nothing, or its kinds would stay owned by a controller that
	// no longer runs. stopController removes run under a.mu first.
	if a.controllers[name] != run || run.ctx.Err() != nil {
		return fmt.Errorf("controller %q was stopped while its plugin started", name)
	}
	want := map[string]bool{}
	for _, k := range info.Kinds {
		if owner, ok := a.kindOwner[k.Kind]; ok && owner != name {
			return fmt.Errorf("kind %q is already reconciled by controller %q; disable one of them in krane.hcl", k.Kind, owner)
		}
		want[k.Kind] = true
	}
	run.mu.Lock()
	defer run.mu.Unlock()
	for kind, lr := range run.loops {
		if !want[kind] {
			lr.cancel()
			delete(run.loops, kind)
			delete(a.kindOwner, kind)
			a.log.Warn("plugin no longer reconciles a kind; its loop stopped (objects untouched)", "controller", name, "kind", kind)
		}
	}
	for kind := range want {
		if _, ok := run.loops[kind]; ok {
			continue
		}
		a.kindOwner[kind] = name
		lctx, cancel := context.WithCancel(run.ctx)
		l := syncer.NewLoop(kind, a.cfg.Region, a.client, run.plugin, a.reporter, a.log.Named("sync"), a.syncM, a.syncOptions())
		lr := &loopRun{loop: l, cancel: cancel, done: make(chan struct{})}
		run.loops[kind] = lr
		go func() {
			defer close(lr.done)
			l.Run(lctx)
		}()
	}
	return nil
}

func (a *Agent) syncOptions() syncer.Options {
	o := syncer.DefaultOptions()
	s := a.cfg.Sync
	o.Workers, o.ResyncInterval, o.ReconnectMin, o.ReconnectMax = s.Workers, s.ResyncInterval, s.ReconnectMin, s.ReconnectMax
	o.ApplyTimeout, o.MaxPending, o.StreamTimeout = s.ApplyTimeout, s.MaxPending, s.StreamTimeout
	o.GC = syncer.GCOptions{MaxDeleteFraction: a.cfg.GC.MaxDeleteFraction, MinDeletes: a.cfg.GC.MinDeletes, AllowMassDelete: a.cfg.GC.AllowMassDelete}
	return o
}

// stopController stops a controller's loops and plugin; nothing in the
// cluster is deleted (a disabled controller's objects are left alone).
// Caller holds a.life but not a.mu.
func (a *Agent) stopController(name string) {
	a.mu.Lock()
	run, ok := a.controllers[name]
	if !ok {
		a.mu.Unlock()
		return
	}
	delete(a.controllers, name)
	run.mu.Lock()
	loops := slices.Collect(maps.Values(run.loops))
	for kind := range run.loops {
		delete(a.kindOwner, kind)
	}
	run.mu.Unlock()
	a.mu.Unlock()
	run.cancel()
	for _, lr := range loops {
		<-lr.done
	}
	<-run.plugin.Done()
	<-run.identityDone
	a.log.Info("controller stopped", "controller", name)
}

func (a *Agent) stopAllControllers() {
	a.mu.Lock()
	names := slices.Collect(maps.Keys(a.controllers))
	a.mu.Unlock()
	for _, name := range names {
		a.stopController(name)
	}
}

// Reload applies a new configuration: controllers whose block changed, or
// whose plugin binary changed on disk, are restarted, disabled ones
// stopped, new ones started; the others keep running untouched. A change
// of identity, ctrl connection or Kubernetes access restarts every
// controller (without restarting the process). The new connection to ctrl
// is built before anything is stopped: when it cannot be, nothing changes
// and the error says why. The host's log level is applied at once; what a
// reload cannot change (RestartOnly) is logged and kept as it runs.
func (a *Agent) Reload(next *config.Config) error {
	a.life.Lock()
	defer a.life.Unlock()
	a.mu.Lock()
	prev, running := a.cfg, a.runCtx != nil
	a.mu.Unlock()
	next = a.keepRestartOnly(prev, next)
	if !running {
		a.mu.Lock()
		a.cfg = next
		a.mu.Unlock()
		return nil
	}
	if prev.Log.Level != next.Log.Level {
		a.log.SetLevel(hclog.LevelFromString(next.Log.Level))
		a.log.Info("log level changed by reload", "level", next.Log.Level,
			"plugins", "each plugin keeps its level until it restarts (disable and enable it to restart it now)")
	}
	global := prev.Region != next.Region || prev.ClusterID != next.ClusterID ||
		prev.ControlPlane != next.ControlPlane || prev.Kubernetes != next.Kubernetes
	if global {
		c, err := dialCore(next, a.log)
		if err != nil {
			return fmt.Errorf("reload not applied, the running configuration is kept: %w", err)
		}
		a.log.Info("identity, ctrl or Kubernetes settings changed: restarting every controller")
		a.stopAllControllers()
		a.stopCore(false)
		a.mu.Lock()
		a.cfg = next
		a.mu.Unlock()
		a.startCore(c)
		a.mu.Lock()
		for _, ctl := range next.Enabled() {
			a.startController(ctl)
		}
		a.mu.Unlock()
		return nil
	}
	a.mu.Lock()
	a.cfg = next
	a.mu.Unlock()
	names := map[string]bool{}
	for n := range prev.Controllers {
		names[n] = true
	}
	for n := range next.Controllers {
		names[n] = true
	}
	for name := range names {
		old, had := prev.Controllers[name]
		nc, has := next.Controllers[name]
		wasOn, isOn := had && old.Enabled, has && nc.Enabled
		switch {
		case wasOn && !isOn:
			a.log.Info("controller disabled by reload; stopping it and leaving its objects alone", "controller", name)
			a.stopController(name)
		case !wasOn && isOn:
			a.mu.Lock()
			a.startController(nc)
			a.mu.Unlock()
		case wasOn && isOn && !reflect.DeepEqual(old, nc):
			a.log.Info("controller changed by reload; restarting it", "controller", name)
			a.restartController(nc)
		case wasOn && isOn:
			if p := a.Plugin(name); p != nil {
				if changed, was, now := p.BinaryChanged(); changed {
					a.log.Info("plugin binary changed on disk; restarting its controller", "controller", name, "path", nc.Path, "sha256_was", was, "sha256_now", now)
					a.restartController(nc)
				}
			}
		}
	}
	opts := a.syncOptions()
	a.eachLoop(func(_ string, l *syncer.Loop) { l.SetOptions(opts) })
	return nil
}

// restartController stops a controller and starts it with ctl.
func (a *Agent) restartController(ctl config.Controller) {
	a.stopController(ctl.Name)
	a.mu.Lock()
	a.startController(ctl)
	a.mu.Unlock()
}

// RestartOnly names the settings a reload cannot change: the process
// applies them at start only (krane validate says so too).
var RestartOnly = []string{"server.listen", "leader_election", "log.json"}

// keepRestartOnly returns next with the settings a reload cannot change
// set back to their running values, and logs each one that differed.
func (a *Agent) keepRestartOnly(prev, next *config.Config) *config.Config {
	n := *next
	warn := func(key string, was, want any) {
		a.log.Warn("a reload cannot change this setting; restart krane to apply it", "key", key, "running", was, "configured", want)
	}
	if n.Server != prev.Server {
		warn("server.listen", prev.Server.Listen, n.Server.Listen)
		n.Server = prev.Server
	}
	if n.Leader != prev.Leader {
		warn("leader_election", fmt.Sprintf("%+v", prev.Leader), fmt.Sprintf("%+v", n.Leader))
		n.Leader = prev.Leader
	}
	if n.Log.JSON != prev.Log.JSON {
		warn("log.json", prev.Log.JSON, n.Log.JSON)
		n.Log.JSON = prev.Log.JSON
	}
	return &n
}

func (a *Agent) eachLoop(f func(kind string, l *syncer.Loop)) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.eachLoopLocked(f)
}

func (a *Agent) eachLoopLocked(f func(kind string, l *syncer.Loop)) {
	for _, run := range a.controllers {
		run.mu.Lock()
		for kind, lr := range run.loops {
			f(kind, lr.loop)
		}
		run.mu.Unlock()
	}
}

// Loop returns the sync loop of kind, if one runs.
func (a *Agent) Loop(kind string) *syncer.Loop {
	var found *syncer.Loop
	a.eachLoop(func(k string, l *syncer.Loop) {
		if k == kind {
			found = l
		}
	})
	return found
}

// Plugin returns the supervisor of a running controller, or nil.
func (a *Agent) Plugin(name string) *supervisor.Plugin {
	a.mu.Lock()
	defer a.mu.Unlock()
	if run, ok := a.controllers[name]; ok {
		return run.plugin
	}
	return nil
}

// Ready reports whether every enabled controller's plugin runs, every
// kind it reconciles has completed a bootstrap and ctrl has acknowledged a
// heartbeat naming these controllers (so a deploy right after readiness
// finds the cluster serving); otherwise why not. An
// enabled controller that is not running at all (the host not started
// yet, or stopped) makes it not ready.
func (a *Agent) Ready() (bool, []string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	var why []string
	if a.core == nil {
		why = append(why, "not connected to ctrl")
	}
	for _, ctl := range a.cfg.Enabled() {
		name := ctl.Name
		run, ok := a.controllers[name]
		if !ok {
			why = append(why, fmt.Sprintf("controller %s: enabled but not running", name))
			continue
		}
		if !run.plugin.Running() {
			msg := fmt.Sprintf("controller %s: plugin not running", name)
			if err := run.plugin.LastError(); err != nil {
				msg += ": " + err.Error()
			}
			why = append(why, msg)
			continue
		}
		run.mu.Lock()
		for kind, lr := range run.loops {
			if !lr.loop.Bootstrapped() {
				why = append(why, fmt.Sprintf("kind %s: bootstrap not complete", kind))
			}
		}
		run.mu.Unlock()
	}
	if len(why) == 0 && !a.controllersAckedLocked() {
		why = append(why, "ctrl has not yet acknowledged a heartbeat naming the controllers this host runs (deploys check it); heartbeats are retried")
	}
	sort.Strings(why)
	return len(why) == 0, why
}

// Handler serves /healthz, /readyz and /metrics.
func (a *Agent) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if standby, leader := a.standby(); standby {
			fmt.Fprintf(w, "standby (lease held by %q)\n", leader)
			return
		}
		ok, why := a.Ready()
		if !ok {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintln(w, strings.Join(why, "\n"))
			return
		}
		fmt.Fprintln(w, "ready")
	})
	mux.Handle("/metrics", promhttp.HandlerFor(a.reg, promhttp.HandlerOpts{Registry: a.reg}))
	return mux
}

// Serve serves Handler on the configured address until ctx ends.
func (a *Agent) Serve(ctx context.Context, l net.Listener) error {
	srv := &http.Server{Handler: a.Handler(), ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
