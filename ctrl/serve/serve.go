// Package serve wires `ctrl serve`: configuration (koanf: flags, CTRL_*
// variables, an optional YAML file), the store and its migrations, the gRPC
// server (TLS or h2c, optional mTLS, authentication on every call, the
// ClusterService) and the HTTP server for /healthz, /readyz and /metrics.
//
// With restate.ingress_url set it also runs ctrl's Restate side
// (restate.go): the endpoint Restate calls (ctrl/workflows), its
// registration, the Notifier that turns status reports into workflow
// wake-ups, and the operators' deploy API (ctrl/deployapi). ctrl serves
// clusters whether or not Restate is reachable; registration retries in the
// background. It always serves the operators' fleet API (ctrl/fleetapi).
//
// With console.addr set it also serves the web console (ctrl/console) on a
// listener of its own (console.go).
package serve

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"

	"krane.dev/ctrl/api"
	"krane.dev/ctrl/auth"
	"krane.dev/ctrl/bounds"
	"krane.dev/ctrl/clusterapi"
	"krane.dev/ctrl/fleetapi"
	"krane.dev/ctrl/resourceapi"
	"krane.dev/ctrl/store"
	"krane.dev/ctrl/vault"
	"krane.dev/ctrl/workflows"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
	"krane.dev/shared/certreload"
	"krane.dev/shared/version"
)

// Deps are what other parts of ctrl plug into the server.
type Deps struct {
	// RegisterServices registers more gRPC services (the operator APIs) on
	// the server before it starts. They get the same authentication.
	RegisterServices func(gs *grpc.Server, st *store.Store) error
	// Listener is told about accepted status reports (besides the deploy
	// Notifier, when Restate is configured).
	Listener clusterapi.StatusListener
	// WorkflowHooks are passed to the Restate services (tests only).
	WorkflowHooks workflows.Hooks
	// Version is the release whose skew window the ClusterService holds
	// krane hosts to; empty: this build's (tests play other releases).
	Version string
}

type mysqlLogger struct{ log hclog.Logger }

func (l mysqlLogger) Print(v ...any) { l.log.Warn(strings.TrimSpace(fmt.Sprint(v...))) }

// Server is a running ctrl.
type Server struct {
	cfg      Config
	log      hclog.Logger
	store    *store.Store
	registry *prometheus.Registry
	authn    *auth.Authenticator
	grpc     *grpc.Server
	http     *http.Server
	grpcLis  net.Listener
	httpLis  net.Listener
	restate  *restateStack  // nil when Restate is not configured
	console  *consoleServer // nil when the console is off
	cancel   context.CancelFunc
	done     chan struct{}
	version  string // the release this ctrl serves as (Deps.Version)
	// schemaWhy is the last reason readiness gave for not serving the
	// schema ("" while it serves), so the reason is logged once per change.
	schemaMu  sync.Mutex
	schemaWhy string
	errOnce   sync.Once
	err       error
}

// NewLogger builds the process logger from the log settings.
func NewLogger(c LogConfig, out io.Writer) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{
		Name: "ctrl", Level: hclogLevel(c.Level), JSONFormat: c.Format != "text", Output: out, TimeFormat: time.RFC3339Nano,
	})
}

func hclogLevel(s string) hclog.Level {
	switch strings.ToLower(s) {
	case "trace":
		return hclog.Trace
	case "debug":
		return hclog.Debug
	case "info", "":
		return hclog.Info
	case "warn":
		return hclog.Warn
	case "error":
		return hclog.Error
	}
	return hclog.NoLevel
}

// Start opens the store (migrating it unless disabled), starts the gRPC and
// HTTP servers and returns at once. Stop (or cancelling ctx) shuts down.
func Start(ctx context.Context, cfg Config, log hclog.Logger, deps Deps) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	// The driver's own messages (bad idle connections after a database
	// restart, say) go to the structured log, not to bare stderr.
	_ = mysql.SetLogger(mysqlLogger{log.Named("mysql")})
	dbTLS, err := databaseTLS(cfg.DB, log)
	if err != nil {
		return nil, err
	}
	st, err := store.Open(ctx, cfg.DB.DSN, store.PoolOptions{
		TLS:          dbTLS,
		MaxOpenConns: cfg.DB.MaxOpenConns, MaxIdleConns: cfg.DB.MaxIdleConns, ConnMaxLifetime: cfg.DB.ConnMaxLifetime,
		MaxWriteBatch: cfg.DB.MaxWriteBatch, WriteCommitters: cfg.DB.WriteCommitters, BatchLockWait: cfg.DB.BatchLockWait,
	})
	if err != nil {
		return nil, err
	}
	s, err := start(ctx, cfg, log, deps, st)
	if err != nil {
		st.Close()
		return nil, err
	}
	return s, nil
}

func start(ctx context.Context, cfg Config, log hclog.Logger, deps Deps, st *store.Store) (*Server, error) {
	if cfg.Migrate.OnStart {
		var lastReport time.Time
		applied, err := st.MigrateReporting(ctx, store.MigrateReport{
			Starting: func(m store.PlannedMigration) { log.Info("applying migration", "migration", m.Name, "phase", m.Phase) },
			Backfill: func(name string, p store.BackfillProgress) {
				if time.Since(lastReport) >= 10*time.Second || p.Done >= p.Total {
					lastReport = time.Now()
					log.Info("backfilling", "migration", name, "rows_done", p.Done, "rows_total", p.Total, "batches", p.Batches)
				}
			},
		})
		if err != nil {
			return nil, err
		}
		for _, m := range applied {
			log.Info("applied migration", "version", m.Version, "source", m.Source, "phase", m.Phase, "duration", m.Duration)
		}
	}
	if schema, err := st.SchemaStatus(ctx); err == nil && len(schema.Ahead) > 0 {
		log.Info("the database holds migrations of a newer release; serving, as its expand steps keep this release working (docs/compatibility.md)",
			"ahead", schema.Ahead, "schema_requires", schema.MinCtrl)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		collectors.NewDBStatsCollector(st.DB(), "ctrl"))
	registerWriteMetrics(reg, st)
	reg.MustRegister(bounds.Refused)
	reg.MustRegister(fleetapi.NewCollector(st, log, fleetapi.CollectorOptions{
		PerClusterMax: cfg.HTTP.MetricsPerClusterMax, SilentAfter: cfg.Deploy.LiveClusterWithin}))
	ctrlVersion := deps.Version
	if ctrlVersion == "" {
		ctrlVersion = version.Version
	}
	authn := auth.New(st, auth.Options{
		CacheTTL: cfg.Auth.CacheTTL, RevocationPollInterval: cfg.Auth.RevocationPollInterval, RecheckInterval: cfg.Auth.RecheckInterval,
		Logger: log, Registerer: reg, Replica: replicaID(), Version: ctrlVersion,
	})
	skew := clusterapi.NewSkew(ctrlVersion, st.RecordAgentVersion, log, reg)
	opts, err := GRPCServerOptions(cfg.GRPC, authn, skew, log, reg)
	if err != nil {
		return nil, err
	}
	var keys *vault.Source
	if cfg.Vault.KeyringFile != "" {
		if keys, err = vault.Load(cfg.Vault.KeyringFile, log); err != nil {
			return nil, err
		}
	} else {
		log.Info("vault.keyring_file is not set: deployments cannot have secret variables")
	}
	// Outside authentication, so refused decryption requests are audited.
	opts = append([]grpc.ServerOption{grpc.ChainUnaryInterceptor(clusterapi.DecryptAuditInterceptor(st, log, cfg.Vault.DecryptPerMinute, reg))}, opts...)
	gs := grpc.NewServer(opts...)
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))

	// The Restate side first: its Notifier listens to the cluster API's
	// reports, and it registers the deploy API on gs.
	var stack *restateStack
	listeners := listenerList{}
	if deps.Listener != nil {
		listeners = append(listeners, deps.Listener)
	}
	if cfg.Restate.Enabled() {
		if stack, err = startRestate(runCtx, cfg, log, st, gs, reg, deps.WorkflowHooks, keys, ctrlVersion); err != nil {
			cancel()
			return nil, err
		}
		listeners = append(listeners, stack.notifier)
	} else {
		log.Warn("restate.ingress_url is not set: the deploy workflows and the deploy API are off")
	}
	fail := func(err error) (*Server, error) {
		cancel()
		if stack != nil {
			stack.stop()
		}
		return nil, err
	}
	api, err := clusterapi.New(clusterapi.Options{
		Store: st, Logger: log, Registerer: reg, PageSize: cfg.Watch.PageSize, KeepAlive: cfg.Watch.KeepAlive,
		PollInterval: cfg.Watch.PollInterval, FeedWindow: cfg.Watch.FeedWindow, UnsharedReads: !cfg.Watch.SharedReads, Listener: listeners, Vault: keys,
		DecryptPerMinute: cfg.Vault.DecryptPerMinute, MaxBootstraps: min(cfg.Watch.MaxBootstraps, cfg.DB.MaxOpenConns), BootstrapRetry: cfg.Watch.BootstrapRetry,
		BootstrapQueue: bootstrapQueue(cfg.Watch.BootstrapQueue),
		ReportLinger:   cfg.Reports.Linger, ReportQueue: cfg.Reports.Queue, ReportQueueShare: cfg.Reports.QueueShare, HeartbeatLinger: cfg.Reports.HeartbeatLinger, UnbatchedReports: !cfg.Reports.Batched,
	})
	if err != nil {
		return fail(err)
	}
	clusterv1.RegisterClusterServiceServer(gs, api)
	fleetapi.New(st, log).Register(gs)
	// The operators' resource API needs only the database (ctrl/auth
	// requires an operator token for it, as for every operator service).
	resourceapi.New(st, log).Register(gs)
	if deps.RegisterServices != nil {
		if err := deps.RegisterServices(gs, st); err != nil {
			return fail(fmt.Errorf("register services: %w", err))
		}
	}

	grpcLis, err := net.Listen("tcp", cfg.GRPC.Addr)
	if err != nil {
		return fail(fmt.Errorf("listen for gRPC on %s: %w", cfg.GRPC.Addr, err))
	}
	httpLis, err := net.Listen("tcp", cfg.HTTP.Addr)
	if err != nil {
		grpcLis.Close()
		return fail(fmt.Errorf("listen for HTTP on %s: %w", cfg.HTTP.Addr, err))
	}
	var cons *consoleServer
	if cfg.Console.Enabled() {
		if cons, err = startConsole(cfg, gs, st, log, reg); err != nil {
			grpcLis.Close()
			httpLis.Close()
			return fail(err)
		}
	}
	s := &Server{
		cfg: cfg, log: log, store: st, registry: reg, authn: authn, grpc: gs, grpcLis: grpcLis, httpLis: httpLis,
		restate: stack, console: cons, cancel: cancel, done: make(chan struct{}), version: ctrlVersion,
	}
	s.http = &http.Server{Handler: s.httpHandler(), ReadHeaderTimeout: 5 * time.Second}

	var wg sync.WaitGroup
	apiDone := make(chan struct{})
	go func() { api.Run(runCtx); close(apiDone) }()
	// Revocations made elsewhere (the CLI, another ctrl) close this ctrl's
	// streams within auth.revocation_poll_interval.
	revDone := make(chan struct{})
	go func() { authn.WatchRevocations(runCtx); close(revDone) }()
	auditDone := make(chan struct{})
	go func() { expireVaultAudit(runCtx, st, cfg.Vault.AuditRetention, log); close(auditDone) }()
	wg.Add(2)
	go func() {
		defer wg.Done()
		if err := gs.Serve(grpcLis); err != nil {
			s.fail(fmt.Errorf("gRPC server: %w", err))
		}
	}()
	go func() {
		defer wg.Done()
		if err := s.http.Serve(httpLis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.fail(fmt.Errorf("HTTP server: %w", err))
		}
	}()
	if cons != nil {
		wg.Add(2)
		go func() {
			defer wg.Done()
			// Ends with gs's graceful stop, which closes the listener.
			_ = gs.Serve(cons.inproc)
		}()
		go func() {
			defer wg.Done()
			if err := cons.serve(); err != nil {
				s.fail(fmt.Errorf("console: %w", err))
			}
		}()
	}
	go func() {
		select {
		case <-ctx.Done():
		case <-runCtx.Done():
		}
		s.shutdown(apiDone)
		wg.Wait()
		<-revDone
		<-auditDone
		st.Close()
		log.Info("ctrl stopped")
		close(s.done)
	}()
	log.Info("ctrl serving", "version", version.Version, "grpc", grpcLis.Addr().String(), "tls", cfg.GRPC.TLSCert != "",
		"mtls", cfg.GRPC.ClientCA != "", "http", httpLis.Addr().String(), "console", s.ConsoleURL())
	return s, nil
}

// shutdown ends streams (the ClusterService answers UNAVAILABLE with the
// cursor to resume from), then stops the servers.
func (s *Server) shutdown(apiDone <-chan struct{}) {
	s.log.Info("shutting down: ending streams (agents reconnect with their cursor), then stopping the servers")
	s.cancel()
	<-apiDone
	if s.console != nil {
		// First: its live pages hold calls on the gRPC server open.
		s.console.stop()
	}
	stopped := make(chan struct{})
	go func() { s.grpc.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		s.grpc.Stop()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = s.http.Shutdown(ctx)
	if s.restate != nil {
		s.restate.stop()
	}
}

func (s *Server) fail(err error) {
	s.errOnce.Do(func() { s.err = err })
	s.log.Error("server failed; shutting down", "error", err)
	s.cancel()
}

// Stop shuts the server down and waits for it.
func (s *Server) Stop() error {
	s.cancel()
	<-s.done
	return s.err
}

// Wait blocks until the server stopped and returns why, if it failed.
func (s *Server) Wait() error {
	<-s.done
	return s.err
}

// GRPCAddr and HTTPAddr are the listening addresses.
func (s *Server) GRPCAddr() string { return s.grpcLis.Addr().String() }
func (s *Server) HTTPAddr() string { return s.httpLis.Addr().String() }

// ConsoleURL is where the web console is served ("" when it is off).
func (s *Server) ConsoleURL() string {
	if s.console == nil {
		return ""
	}
	return s.console.URL()
}

// RestateEndpointURL is the URL Restate calls ctrl's services at ("" when
// Restate is not configured).
func (s *Server) RestateEndpointURL() string {
	if s.restate == nil {
		return ""
	}
	return s.restate.url
}

// WaitRestateRegistered waits until the endpoint is registered with Restate
// (at once when registration on start is off or Restate is not configured).
func (s *Server) WaitRestateRegistered(ctx context.Context) error {
	if s.restate == nil {
		return nil
	}
	select {
	case <-s.restate.registered:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("the Restate endpoint %s is not registered yet: %w", s.restate.url, ctx.Err())
	}
}

// listenerList tells every listener about a report.
type listenerList []clusterapi.StatusListener

func (l listenerList) DeploymentReported(ctx context.Context, deploymentID, region string) {
	for _, x := range l {
		x.DeploymentReported(ctx, deploymentID, region)
	}
}

func (l listenerList) SentinelReported(ctx context.Context, sentinelID string) {
	for _, x := range l {
		x.SentinelReported(ctx, sentinelID)
	}
}

// Store is the server's store.
func (s *Server) Store() *store.Store { return s.store }

// Authenticator checks the server's calls; its Revoke closes a token's
// streams here at once.
func (s *Server) Authenticator() *auth.Authenticator { return s.authn }

// Registry holds the server's metrics.
func (s *Server) Registry() *prometheus.Registry { return s.registry }

// GRPCServerOptions are the options of ctrl's gRPC server: transport
// credentials, authentication, bounds and error interceptors, message size
// limits and keepalive enforcement that tolerates agents' pings on idle
// streams.
func GRPCServerOptions(c GRPCConfig, authn *auth.Authenticator, skew *clusterapi.Skew, log hclog.Logger, reg prometheus.Registerer) ([]grpc.ServerOption, error) {
	creds, err := transportCredentials(c, log, reg)
	if err != nil {
		return nil, err
	}
	recv, send := c.MaxRecvBytes, c.MaxSendBytes
	if recv <= 0 {
		recv = 16 << 20
	}
	if send <= 0 {
		send = 16 << 20
	}
	return []grpc.ServerOption{
		grpc.Creds(creds),
		// Authentication first (an unknown caller learns nothing of the
		// bounds), then the version skew check (a krane host too old for
		// this ctrl is told so in words, not refused by a bound it never
		// knew), then the bounds every request declares on its proto,
		// before any handler; innermost, the one mapping of the errors
		// handlers return to statuses (api.Status).
		grpc.ChainUnaryInterceptor(authn.UnaryInterceptor(), skew.UnaryInterceptor(), bounds.UnaryInterceptor(), api.UnaryInterceptor(log)),
		grpc.ChainStreamInterceptor(authn.StreamInterceptor(), skew.StreamInterceptor(), bounds.StreamInterceptor(), api.StreamInterceptor(log)),
		grpc.MaxRecvMsgSize(recv),
		grpc.MaxSendMsgSize(send),
		// Agents ping idle streams (proxies drop silent connections); allow
		// it every 10s, even without active calls, instead of GOAWAY.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		// And ping them ourselves, so dead peers free their streams. An
		// aged connection is sent away (gRPC adds +/-10% jitter to the age)
		// so agents spread over the replicas again after a roll.
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second,
			// zero: never (gRPC's default)
			MaxConnectionAge: c.MaxConnectionAge, MaxConnectionAgeGrace: c.MaxConnectionAgeGrace}),
	}, nil
}

// transportCredentials are the gRPC server's credentials. The certificate,
// key and client CA are read again when they change on disk
// (shared/certreload), so a renewed certificate needs no restart; a new
// version that does not load is refused, counted in
// krane_ctrl_tls_reload_errors_total and logged, and the previous one stays.
func transportCredentials(c GRPCConfig, log hclog.Logger, reg prometheus.Registerer) (credentials.TransportCredentials, error) {
	if c.TLSCert == "" {
		return inprocCreds{insecure.NewCredentials()}, nil // plaintext HTTP/2 (h2c)
	}
	reloads := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "krane", Subsystem: "ctrl", Name: "tls_reloads_total",
		Help: "New versions of TLS files (certificate and key, CA bundle) adopted from disk without a restart, by setting."}, []string{"setting"})
	reloadErrors := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "krane", Subsystem: "ctrl", Name: "tls_reload_errors_total",
		Help: "New versions of TLS files refused (unparsable, key mismatch, expired, unreadable), by setting; the previous version stays in use."}, []string{"setting"})
	opts := func(name string) certreload.Options {
		return certreload.Options{Log: log, Name: name,
			OnReload: func(n string) { reloads.WithLabelValues(n).Inc() },
			OnError:  func(n string, _ error) { reloadErrors.WithLabelValues(n).Inc() }}
	}
	kp, err := certreload.LoadKeyPair(c.TLSCert, c.TLSKey, opts("grpc.tls_cert"))
	if err != nil {
		return nil, err
	}
	var clientCAs *certreload.CAPool
	if c.ClientCA != "" {
		if clientCAs, err = certreload.LoadCAPool(c.ClientCA, opts("grpc.client_ca")); err != nil {
			return nil, err
		}
	}
	if reg != nil {
		expiry := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "krane", Subsystem: "ctrl", Name: "tls_certificate_expiry_timestamp_seconds",
			Help: "When the certificate ctrl's gRPC server presents now (grpc.tls_cert) expires, as a Unix time: alert well before it."},
			func() float64 { return float64(kp.Current().Leaf.NotAfter.Unix()) })
		reg.MustRegister(reloads, reloadErrors, expiry)
	}
	return inprocCreds{credentials.NewTLS(certreload.ServerConfig(kp, clientCAs, "h2"))}, nil
}

// databaseTLS is the TLS configuration of ctrl's database connections
// (db.tls_ca, db.tls_cert/db.tls_key), nil when none is set. The files are
// read again when they change (shared/certreload): each new connection
// (db.conn_max_lifetime recycles them) uses the current ones.
func databaseTLS(c DBConfig, log hclog.Logger) (*tls.Config, error) {
	if c.TLSCA == "" && c.TLSCert == "" {
		return nil, nil
	}
	dsn, err := mysql.ParseDSN(c.DSN)
	if err != nil {
		return nil, fmt.Errorf("db.dsn is malformed: %w", err)
	}
	host, _, err := net.SplitHostPort(dsn.Addr)
	if err != nil {
		host = dsn.Addr
	}
	var roots *certreload.CAPool
	var kp *certreload.KeyPair
	if c.TLSCA != "" {
		if roots, err = certreload.LoadCAPool(c.TLSCA, certreload.Options{Log: log, Name: "db.tls_ca"}); err != nil {
			return nil, err
		}
	}
	if c.TLSCert != "" {
		if kp, err = certreload.LoadKeyPair(c.TLSCert, c.TLSKey, certreload.Options{Log: log, Name: "db.tls_cert"}); err != nil {
			return nil, err
		}
	}
	return certreload.ClientConfig(host, roots, kp), nil
}

// servesSchema says whether this ctrl can serve the schema st describes
// (store.SchemaStatus.Serves), logging each change of the answer: a
// replica of an older release that a contract step left behind says so,
// naming both versions, instead of failing queries.
func (s *Server) servesSchema(st store.SchemaStatus) (bool, string) {
	ok, why := st.Serves(s.version)
	s.schemaMu.Lock()
	changed := why != s.schemaWhy
	s.schemaWhy = why
	s.schemaMu.Unlock()
	if changed {
		if ok {
			s.log.Info("this ctrl serves the database schema again", "ctrl_version", s.version, "schema_ahead", st.Ahead)
		} else {
			s.log.Error("not ready: "+why, "ctrl_version", s.version, "schema_requires", st.MinCtrl, "required_by", st.MinCtrlBy, "schema_ahead", st.Ahead)
		}
	}
	return ok, why
}

func (s *Server) httpHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		if err := s.store.Ping(ctx); err != nil {
			http.Error(w, "not ready: database unreachable: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		schema, err := s.store.SchemaStatus(ctx)
		if err != nil {
			http.Error(w, "not ready: cannot read the schema version: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		if ok, why := s.servesSchema(schema); !ok {
			http.Error(w, "not ready: "+why, http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "ok\n")
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.registry, promhttp.HandlerOpts{Registry: s.registry}))
	if s.cfg.HTTP.Pprof {
		servePprof(mux)
	}
	return mux
}

// registerWriteMetrics exports the store's group-commit counters.
func registerWriteMetrics(reg prometheus.Registerer, st *store.Store) {
	counter := func(name, help string, v func(store.WriteStats) int64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "krane", Subsystem: "ctrl", Name: name, Help: help},
			func() float64 { return float64(v(st.WriteStats())) })
	}
	reg.MustRegister(
		counter("write_batches_total", "Transactions that group-committed two or more desired-state writes.",
			func(w store.WriteStats) int64 { return w.Batches }),
		counter("write_batched_total", "Writes committed in group-commit transactions (divide by write_batches_total for the mean batch).",
			func(w store.WriteStats) int64 { return w.Batched }),
		counter("write_solo_total", "Writes committed in a transaction of their own.",
			func(w store.WriteStats) int64 { return w.Solo }),
		counter("write_batch_retries_total", "Group-commit transactions run again after a deadlock.",
			func(w store.WriteStats) int64 { return w.Retries }),
		counter("write_batch_fallbacks_total", "Group-commit transactions that failed as a whole, whose writes then each ran alone.",
			func(w store.WriteStats) int64 { return w.Fallbacks }),
		counter("write_alone_total", "Writes a group commit sent to run in a transaction of their own: after their own lock wait or deadlock, a fallback, or a COMMIT of unknown outcome.",
			func(w store.WriteStats) int64 { return w.Alone }),
	)
}

// auditExpiryInterval is how often vault_audit rows past their retention
// are deleted (every replica does it; deleting what another deleted is
// nothing).
const auditExpiryInterval = time.Hour

// expireVaultAudit deletes vault_audit rows older than retention, at once
// and then every auditExpiryInterval, until ctx ends.
func expireVaultAudit(ctx context.Context, st *store.Store, retention time.Duration, log hclog.Logger) {
	t := time.NewTicker(auditExpiryInterval)
	defer t.Stop()
	for {
		n, err := st.ExpireVaultAudit(ctx, time.Now().Add(-retention))
		switch {
		case err != nil && ctx.Err() == nil:
			log.Warn("deleting expired vault audit rows failed; retrying in an hour", "retention", retention, "error", err)
		case n > 0:
			log.Info("deleted expired vault audit rows", "rows", n, "retention", retention)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// replicaID names this ctrl process among the replicas sharing the
// database (ctrl_replicas).
func replicaID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// bootstrapQueue maps watch.bootstrap_queue (0: none wait) onto
// clusterapi.Options.BootstrapQueue (0: the default; negative: none).
func bootstrapQueue(n int) int {
	if n == 0 {
		return -1
	}
	return n
}
