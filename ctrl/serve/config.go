package serve

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/knadh/koanf/parsers/yaml"
	"github.com/knadh/koanf/providers/confmap"
	"github.com/knadh/koanf/providers/env/v2"
	"github.com/knadh/koanf/providers/file"
	"github.com/knadh/koanf/providers/posflag"
	"github.com/knadh/koanf/v2"
	"github.com/spf13/pflag"

	"krane.dev/ctrl/restateendpoint"
	"krane.dev/shared/version"
)

// Config is ctrl's configuration. Every key can be set in the YAML file
// (--config), in the environment (CTRL_ + the key in upper case with '.'
// as '_': db.dsn is CTRL_DB_DSN) and by a flag (the key with '.' and '_' as
// '-': db.dsn is --db-dsn). Flags beat the environment, which beats the file,
// which beats the defaults.
type Config struct {
	DB      DBConfig      `koanf:"db"`
	Migrate MigrateConfig `koanf:"migrate"`
	GRPC    GRPCConfig    `koanf:"grpc"`
	HTTP    HTTPConfig    `koanf:"http"`
	Watch   WatchConfig   `koanf:"watch"`
	Reports ReportsConfig `koanf:"reports"`
	Auth    AuthConfig    `koanf:"auth"`
	Log     LogConfig     `koanf:"log"`
	// Restate, Deploy and Sentinel configure the deploy workflows and the
	// operators' deploy API; they are off while restate.ingress_url is
	// empty.
	Restate  RestateConfig  `koanf:"restate"`
	Deploy   DeployConfig   `koanf:"deploy"`
	Sentinel SentinelConfig `koanf:"sentinel"`
	Vault    VaultConfig    `koanf:"vault"`
	// Console is the web console; off while console.addr is empty.
	Console ConsoleConfig `koanf:"console"`
}

// ConsoleConfig is the web console's listener and sessions.
type ConsoleConfig struct {
	Addr         string        `koanf:"addr"`
	TLSCert      string        `koanf:"tls_cert"`
	TLSKey       string        `koanf:"tls_key"`
	SecureCookie bool          `koanf:"secure_cookie"`
	SessionTTL   time.Duration `koanf:"session_ttl"`
	// LivePerToken bounds the live pages open with one operator token on
	// one ctrl (across its browsers and sessions).
	LivePerToken int `koanf:"live_per_token"`
}

// Enabled reports whether ctrl serves the web console.
func (c ConsoleConfig) Enabled() bool { return c.Addr != "" }

// VaultConfig is the keyring that seals deployments' secret variables.
type VaultConfig struct {
	KeyringFile string `koanf:"keyring_file"`
	// AuditRetention is how long vault_audit rows are kept.
	AuditRetention time.Duration `koanf:"audit_retention"`
	// DecryptPerMinute bounds each cluster's DecryptEnv calls on one ctrl.
	DecryptPerMinute int `koanf:"decrypt_per_minute"`
}

type RestateConfig struct {
	IngressURL      string                `koanf:"ingress_url"`
	CAFile          string                `koanf:"ca_file"`
	AdminURL        string                `koanf:"admin_url"`
	Endpoint        RestateEndpointConfig `koanf:"endpoint"`
	RegisterOnStart bool                  `koanf:"register_on_start"`
	// IdentityKeys are the public keys (publickeyv1_..., comma separated)
	// whose signature every request to the endpoint must carry: Restate's
	// request identity. AllowUnsigned turns the check off.
	IdentityKeys  string `koanf:"identity_keys"`
	AllowUnsigned bool   `koanf:"allow_unsigned"`
}

// IdentityKeyList is IdentityKeys as a list.
func (c RestateConfig) IdentityKeyList() []string {
	var out []string
	for _, k := range strings.Split(c.IdentityKeys, ",") {
		if k = strings.TrimSpace(k); k != "" {
			out = append(out, k)
		}
	}
	return out
}

type RestateEndpointConfig struct {
	Listen string `koanf:"listen"`
	URL    string `koanf:"url"`
	// TLSCert and TLSKey serve the endpoint over TLS (read again when the
	// files change); Restate must trust their CA.
	TLSCert string `koanf:"tls_cert"`
	TLSKey  string `koanf:"tls_key"`
}

// Enabled reports whether ctrl runs its Restate services and deploy API.
func (c RestateConfig) Enabled() bool { return c.IngressURL != "" }

type DeployConfig struct {
	Timeout        time.Duration `koanf:"timeout"`
	ResyncInterval time.Duration `koanf:"resync_interval"`
	// LiveClusterWithin is how recent a cluster's heartbeat must be for a
	// deploy to count on it; 0 turns the check off.
	LiveClusterWithin time.Duration `koanf:"live_cluster_within"`
}

type SentinelConfig struct {
	DefaultImage         string `koanf:"default_image"`
	DefaultReplicas      int    `koanf:"default_replicas"`
	DefaultCPUMillicores int    `koanf:"default_cpu_millicores"`
	DefaultMemoryMiB     int    `koanf:"default_memory_mib"`
	// DeployTimeout bounds a SentinelService.Deploy's wait.
	DeployTimeout time.Duration `koanf:"deploy_timeout"`
	// IdleStopAfter: a sentinel unused this long is stopped (0: never).
	IdleStopAfter time.Duration `koanf:"idle_stop_after"`
}

type DBConfig struct {
	DSN             string        `koanf:"dsn"`
	TLSCA           string        `koanf:"tls_ca"`
	TLSCert         string        `koanf:"tls_cert"`
	TLSKey          string        `koanf:"tls_key"`
	MaxOpenConns    int           `koanf:"max_open_conns"`
	MaxIdleConns    int           `koanf:"max_idle_conns"`
	ConnMaxLifetime time.Duration `koanf:"conn_max_lifetime"`
	MaxWriteBatch   int           `koanf:"max_write_batch"`
	WriteCommitters int           `koanf:"write_committers"`
	BatchLockWait   time.Duration `koanf:"batch_lock_wait"`
}

type MigrateConfig struct {
	OnStart bool `koanf:"on_start"`
}

type GRPCConfig struct {
	Addr         string `koanf:"addr"`
	TLSCert      string `koanf:"tls_cert"`
	TLSKey       string `koanf:"tls_key"`
	ClientCA     string `koanf:"client_ca"`
	MaxRecvBytes int    `koanf:"max_recv_bytes"`
	MaxSendBytes int    `koanf:"max_send_bytes"`
	// MaxConnectionAge and MaxConnectionAgeGrace: see the settings below.
	MaxConnectionAge      time.Duration `koanf:"max_connection_age"`
	MaxConnectionAgeGrace time.Duration `koanf:"max_connection_age_grace"`
}

type HTTPConfig struct {
	Addr string `koanf:"addr"`
	// MetricsPerClusterMax bounds the fleet size up to which /metrics
	// carries per-cluster series (fleetapi.CollectorOptions).
	MetricsPerClusterMax int `koanf:"metrics_per_cluster_max"`
	// Pprof serves Go's profiles under /debug/pprof/ (off by default).
	Pprof bool `koanf:"pprof"`
}

type WatchConfig struct {
	PageSize     int           `koanf:"page_size"`
	KeepAlive    time.Duration `koanf:"keepalive"`
	PollInterval time.Duration `koanf:"poll_interval"`
	FeedWindow   int           `koanf:"feed_window"`
	SharedReads  bool          `koanf:"shared_reads"`
	// MaxBootstraps and BootstrapRetry: clusterapi.Options.
	MaxBootstraps  int           `koanf:"max_bootstraps"`
	BootstrapRetry time.Duration `koanf:"bootstrap_retry"`
	BootstrapQueue int           `koanf:"bootstrap_queue"`
}

// ReportsConfig shapes how what clusters send (status reports,
// heartbeats) is written: in shared batches (ctrl/clusterapi).
type ReportsConfig struct {
	Linger          time.Duration `koanf:"linger"`
	Queue           int           `koanf:"queue"`
	QueueShare      int           `koanf:"queue_share"`
	HeartbeatLinger time.Duration `koanf:"heartbeat_linger"`
	Batched         bool          `koanf:"batched"`
}

type AuthConfig struct {
	CacheTTL               time.Duration `koanf:"cache_ttl"`
	RevocationPollInterval time.Duration `koanf:"revocation_poll_interval"`
	RecheckInterval        time.Duration `koanf:"recheck_interval"`
}

type LogConfig struct {
	Level  string `koanf:"level"`
	Format string `koanf:"format"`
}

type setting struct {
	key   string
	def   any
	usage string
}

// settings is every configuration key, its default and its help text.
var settings = []setting{
	{"db.dsn", "", "MySQL/MariaDB DSN, e.g. ctrl:secret@tcp(db:3306)/ctrl (required)"},
	{"db.tls_ca", "", "CA bundle (PEM) that signed the database server's certificate; set, every database connection is TLS, verified against it for the DSN's host (re-read when it changes); empty (and no db.tls_cert): the DSN's own tls= parameter decides, plaintext by default"},
	{"db.tls_cert", "", "client certificate (PEM) for the database, when the server requires one (X509 users); turns TLS on, verified against the system roots without db.tls_ca"},
	{"db.tls_key", "", "private key (PEM) of db.tls_cert"},
	{"db.max_open_conns", 50, "maximum open database connections (each bootstrapping stream holds one)"},
	{"db.max_idle_conns", 0, "idle database connections kept open; 0 keeps as many as db.max_open_conns (a commit waking many streams then reuses connections instead of reopening them)"},
	{"db.conn_max_lifetime", 5 * time.Minute, "recycle database connections after this long"},
	{"db.max_write_batch", 64, "most concurrent desired-state writes committed in one transaction (group commit); 1 turns group commit off"},
	{"db.write_committers", 2, "group-commit transactions in flight at once (one runs its writes while the other commits)"},
	{"db.batch_lock_wait", time.Second, "longest row-lock wait of a statement in a group commit (whole seconds); a write that waits longer leaves the batch and waits alone, so the others commit"},
	{"migrate.on_start", true, "apply pending schema migrations when ctrl serve starts"},
	{"grpc.addr", ":7443", "gRPC listen address (ClusterService and operator APIs)"},
	{"grpc.tls_cert", "", "TLS certificate file (PEM); without it gRPC is plaintext h2c"},
	{"grpc.tls_key", "", "TLS private key file (PEM)"},
	{"grpc.client_ca", "", "CA bundle (PEM); when set, clients must present a certificate it signed (mTLS)"},
	{"grpc.max_recv_bytes", 16 << 20, "largest gRPC message ctrl accepts"},
	{"grpc.max_send_bytes", 16 << 20, "largest gRPC message ctrl sends"},
	{"grpc.max_connection_age", 30 * time.Minute, "a client connection is asked to go away (GOAWAY) after this long, plus or minus 10% at random, so the agents' streams spread over the replicas again after a ctrl roll; each agent resumes from its cursor, without a bootstrap (0: never)"},
	{"grpc.max_connection_age_grace", 30 * time.Second, "how long the streams of a connection past grpc.max_connection_age may go on before it is closed (0: until they end)"},
	{"http.addr", ":9090", "HTTP listen address for /healthz, /readyz and /metrics"},
	{"http.pprof", false, "serve Go's profiles (CPU, heap, goroutines, mutex and block contention) under /debug/pprof/ on http.addr, and sample mutex and block contention while on (1 in 100 events; a cost, so off by default): for finding where ctrl spends its time under load"},
	{"http.metrics_per_cluster_max", 1000, "/metrics carries series per cluster (lag, parked objects, heartbeat age, agent version) while the fleet has at most this many clusters; beyond it, only the per-region series the shipped alerts read (every replica exports them: clusters x kinds x replicas series); 0: never (0..100000)"},
	{"watch.page_size", 500, "rows per query when streaming desired state"},
	{"watch.keepalive", 15 * time.Second, "idle streams re-check the database and send a KeepAlive this often"},
	{"watch.poll_interval", 50 * time.Millisecond, "how often the head poller reads change_heads"},
	{"watch.shared_reads", true, "the streams of a region and kind share one database read per commit; false: each stream reads for itself (to compare with)"},
	{"watch.max_bootstraps", 16, "streams sending a full snapshot at once (each holds a database connection, so db.max_open_conns caps it); beyond it a host is told to reconnect later (RESOURCE_EXHAUSTED with a retry hint)"},
	{"watch.bootstrap_queue", 50000, "bootstraps that may wait for a place (in arrival order, holding no database connection) before the rest are refused with the retry hint; 0: none wait (0..1000000)"},
	{"watch.bootstrap_retry", 2 * time.Second, "least retry hint of a refused bootstrap; each refusal adds up to as much again at random, spreading a reconnect storm (100ms..1m)"},
	{"watch.feed_window", 1024, "latest changes kept per region and kind, read once and sent to all its streams (a stream further behind reads the database itself)"},
	{"reports.linger", 100 * time.Millisecond, "status reports of every cluster gather this long before one transaction stores them all (a report after a quiet spell goes at once; 1ms..1s)"},
	{"reports.queue", 20000, "status reports waiting for their transaction at most; beyond it clusters are told to retry later (RESOURCE_EXHAUSTED with a hint; 100..1000000)"},
	{"reports.queue_share", 0, "status reports one cluster may hold of that queue, so one cluster cannot refuse the others' (0: a tenth of reports.queue, at least 500; at most reports.queue)"},
	{"reports.heartbeat_linger", time.Second, "heartbeats of every cluster gather this long before one statement records them all (1ms..30s)"},
	{"reports.batched", true, "store reports in shared batches; false: every report call in a transaction of its own (the reference platform's path, to compare with)"},
	{"auth.cache_ttl", 2 * time.Second, "how long a looked-up token is trusted (max 2s; a revocation this ctrl sees drops it at once)"},
	{"auth.revocation_poll_interval", 250 * time.Millisecond, "how often ctrl reads newly revoked tokens from the database and closes their open streams (10ms..1m)"},
	{"auth.recheck_interval", time.Minute, "how often the tokens of all open streams are read again in one query, a safety net behind the revocation poll (1s..24h)"},
	{"restate.ingress_url", "", "Restate ingress URL, e.g. http://restate:8080; empty turns the deploy workflows and the deploy API off"},
	{"restate.admin_url", "", "Restate admin API URL, e.g. http://restate:9070 (registration of ctrl's endpoint)"},
	{"restate.ca_file", "", "CA bundle (PEM) that signed the certificates of https:// restate.ingress_url and restate.admin_url (a TLS proxy in front of Restate); re-read when it changes; empty: the system roots"},
	{"restate.endpoint.listen", ":9080", "listen address of the endpoint Restate calls (cleartext HTTP/2 unless restate.endpoint.tls_cert is set; keep it on a private network either way)"},
	{"restate.endpoint.url", "", "URL Restate calls the endpoint at; default http://<listen host, or this hostname>:<port> (https:// with restate.endpoint.tls_cert)"},
	{"restate.endpoint.tls_cert", "", "TLS certificate file (PEM) of the endpoint Restate calls, read again when it changes; Restate must trust its CA (restate-server reads extra CAs from SSL_CERT_FILE). Without it the endpoint speaks cleartext HTTP/2"},
	{"restate.endpoint.tls_key", "", "TLS private key file (PEM) of restate.endpoint.tls_cert"},
	{"restate.register_on_start", true, "register the endpoint with Restate when ctrl starts (idempotent; retried in the background)"},
	{"restate.identity_keys", "", "public keys (publickeyv1_..., comma separated) Restate signs its requests to the endpoint with (restate-server's worker.invoker.request-identity-private-key-pem-file); the endpoint refuses requests without such a signature"},
	{"restate.allow_unsigned", false, "serve the endpoint without restate.identity_keys, answering unsigned requests: only where nothing but Restate can reach restate.endpoint.listen"},
	{"deploy.timeout", 5 * time.Minute, "how long a deploy waits for every region to run when its request does not say"},
	{"deploy.live_cluster_within", 2 * time.Minute, "a deployment (or sentinel) deploy is refused at once when no cluster of a region it targets sent a heartbeat this recently naming a running controller for the kind (hosts send one every 30s); 0 turns the check off"},
	{"deploy.resync_interval", 30 * time.Second, "how often deploys in progress are checked again (lost wake-ups, workflows that never started, overdue deploys)"},
	{"sentinel.default_image", version.SentinelImage(version.Version), "image of the sentinel a deploy creates for an environment that has none: by default this release's krane-sentinel image (make release builds it; push it where clusters pull, or name it with its registry here)"},
	{"sentinel.default_replicas", 2, "replicas of a new sentinel"},
	{"sentinel.default_cpu_millicores", 250, "CPU of a new sentinel, in millicores"},
	{"sentinel.default_memory_mib", 256, "memory of a new sentinel, in MiB"},
	{"sentinel.deploy_timeout", 10 * time.Minute, "how long a sentinel deploy (and each sentinel of a rollout) waits for its cluster to run the new configuration healthy, when the request does not say"},
	{"sentinel.idle_stop_after", time.Hour, "stop an environment's sentinel in a region once the environment has had no live or in-progress deployment there for this long (its objects are deleted, the row stays; the next deploy starts it again); 0 never stops one"},
	{"vault.keyring_file", "", "keyring file sealing deployments' secret variables (mode 0600; `ctrl vault init` creates it, reloaded when it changes); empty: no secrets"},
	{"vault.audit_retention", 30 * 24 * time.Hour, "how long the audit of secret openings (vault_audit, `ctrl vault audit`) keeps a row (1h..87600h); older rows are deleted hourly"},
	{"vault.decrypt_per_minute", 1000, "DecryptEnv calls one cluster may make of one ctrl per minute, in bursts of as many (1..100000); past it the cluster is told to retry later, unaudited"},
	{"console.addr", "", "listen address of the web console, e.g. :8080; empty: no console"},
	{"console.tls_cert", "", "TLS certificate file (PEM) of the console; without it the console serves plain HTTP (keep it on a private network or behind a TLS proxy)"},
	{"console.tls_key", "", "TLS private key file (PEM) of the console"},
	{"console.secure_cookie", false, "mark the console's session cookie Secure (sent over HTTPS only): set it when a TLS proxy fronts a plain-HTTP console; console.tls_cert sets it anyway"},
	{"console.session_ttl", 12 * time.Hour, "a console session ends this long after sign-in (1m..168h); revoking the operator token ends it at once"},
	{"console.live_per_token", 64, "live pages (event streams) one operator token may hold open on one ctrl, across its sessions (1..10000); one session holds at most 16"},
	{"log.level", "info", "log level: trace, debug, info, warn, error"},
	{"log.format", "json", "log format: json or text"},
}

// ConfigFlag names the flag (and CTRL_CONFIG the variable) of the optional
// YAML configuration file.
const ConfigFlag = "config"

func flagName(key string) string { return strings.NewReplacer(".", "-", "_", "-").Replace(key) }
func envName(key string) string {
	return "CTRL_" + strings.ToUpper(strings.NewReplacer(".", "_", "-", "_").Replace(key))
}

// AddFlags defines a flag on fs for every key include accepts (every key
// when include is nil).
func AddFlags(fs *pflag.FlagSet, include func(key string) bool) {
	for _, s := range settings {
		if include != nil && !include(s.key) {
			continue
		}
		name, usage := flagName(s.key), s.usage+" (env "+envName(s.key)+")"
		switch d := s.def.(type) {
		case string:
			fs.String(name, d, usage)
		case int:
			fs.Int(name, d, usage)
		case bool:
			fs.Bool(name, d, usage)
		case time.Duration:
			fs.Duration(name, d, usage)
		default:
			panic(fmt.Sprintf("serve: setting %s has an unsupported type %T", s.key, d))
		}
	}
}

// AddConfigFlag defines --config on fs.
func AddConfigFlag(fs *pflag.FlagSet) {
	fs.String(ConfigFlag, "", "YAML configuration file (env CTRL_CONFIG); flags and CTRL_* variables override it")
}

// LoadConfig merges defaults, the file named by --config (or CTRL_CONFIG),
// CTRL_* variables and the flags set on fs. Unknown keys in the file are
// errors, so a typo does not silently leave a default in place.
func LoadConfig(fs *pflag.FlagSet) (Config, error) {
	k := koanf.New(".")
	defaults := map[string]any{}
	known := map[string]bool{}
	byEnv := map[string]string{}
	byFlag := map[string]string{}
	for _, s := range settings {
		defaults[s.key] = s.def
		known[s.key] = true
		byEnv[envName(s.key)] = s.key
		byFlag[flagName(s.key)] = s.key
	}
	if err := k.Load(confmap.Provider(defaults, "."), nil); err != nil {
		return Config{}, err
	}

	path := os.Getenv("CTRL_CONFIG")
	if fs != nil {
		if f := fs.Lookup(ConfigFlag); f != nil && f.Changed {
			path = f.Value.String()
		}
	}
	if path != "" {
		fk := koanf.New(".")
		if err := fk.Load(file.Provider(path), yaml.Parser()); err != nil {
			return Config{}, fmt.Errorf("config file %s: %w", path, err)
		}
		var unknown []string
		for _, key := range fk.Keys() {
			if !known[key] {
				unknown = append(unknown, key)
			}
		}
		if len(unknown) > 0 {
			sort.Strings(unknown)
			return Config{}, fmt.Errorf("config file %s: unknown keys %s (known keys: see `ctrl serve --help`)", path, strings.Join(unknown, ", "))
		}
		if err := k.Merge(fk); err != nil {
			return Config{}, err
		}
	}

	if err := k.Load(env.Provider(".", env.Opt{
		Prefix: "CTRL_",
		TransformFunc: func(name, value string) (string, any) {
			return byEnv[name], value // "" (an unknown CTRL_ variable) is skipped
		},
	}), nil); err != nil {
		return Config{}, err
	}

	if fs != nil {
		if err := k.Load(posflag.ProviderWithFlag(fs, ".", k, func(f *pflag.Flag) (string, any) {
			key, ok := byFlag[f.Name]
			if !ok || !f.Changed {
				return "", nil
			}
			return key, posflag.FlagVal(fs, f)
		}), nil); err != nil {
			return Config{}, err
		}
	}

	var cfg Config
	if err := k.UnmarshalWithConf("", &cfg, koanf.UnmarshalConf{Tag: "koanf"}); err != nil {
		return Config{}, fmt.Errorf("configuration: %w", err)
	}
	return cfg, nil
}

// Validate checks what Start needs.
func (c Config) Validate() error {
	var errs []error
	if c.DB.DSN == "" {
		errs = append(errs, errors.New("db.dsn is required (--db-dsn or CTRL_DB_DSN)"))
	}
	if (c.GRPC.TLSCert == "") != (c.GRPC.TLSKey == "") {
		errs = append(errs, errors.New("grpc.tls_cert and grpc.tls_key must be set together"))
	}
	if (c.DB.TLSCert == "") != (c.DB.TLSKey == "") {
		errs = append(errs, errors.New("db.tls_cert and db.tls_key must be set together"))
	}
	if c.GRPC.ClientCA != "" && c.GRPC.TLSCert == "" {
		errs = append(errs, errors.New("grpc.client_ca (mTLS) needs grpc.tls_cert and grpc.tls_key"))
	}
	if c.DB.MaxWriteBatch < 1 || c.DB.MaxWriteBatch > 1000 {
		errs = append(errs, fmt.Errorf("db.max_write_batch %d is out of range 1..1000 (1 turns group commit off)", c.DB.MaxWriteBatch))
	}
	if c.DB.BatchLockWait < time.Second || c.DB.BatchLockWait > time.Minute {
		errs = append(errs, fmt.Errorf("db.batch_lock_wait %s is out of range 1s..1m", c.DB.BatchLockWait))
	}
	if c.DB.WriteCommitters < 1 || c.DB.WriteCommitters > 64 {
		errs = append(errs, fmt.Errorf("db.write_committers %d is out of range 1..64", c.DB.WriteCommitters))
	}
	if c.Watch.FeedWindow < 1 || c.Watch.FeedWindow > 1000000 {
		errs = append(errs, fmt.Errorf("watch.feed_window %d is out of range 1..1000000", c.Watch.FeedWindow))
	}
	if l := c.Reports.Linger; l < time.Millisecond || l > time.Second {
		errs = append(errs, fmt.Errorf("reports.linger %s is out of range 1ms..1s", l))
	}
	if q := c.Reports.Queue; q < 100 || q > 1000000 {
		errs = append(errs, fmt.Errorf("reports.queue %d is out of range 100..1000000", q))
	}
	if q := c.Reports.QueueShare; q < 0 || q > c.Reports.Queue {
		errs = append(errs, fmt.Errorf("reports.queue_share %d is out of range 0..reports.queue (%d)", q, c.Reports.Queue))
	}
	if l := c.Reports.HeartbeatLinger; l < time.Millisecond || l > 30*time.Second {
		errs = append(errs, fmt.Errorf("reports.heartbeat_linger %s is out of range 1ms..30s", l))
	}
	if c.GRPC.MaxConnectionAge < 0 || c.GRPC.MaxConnectionAgeGrace < 0 {
		errs = append(errs, fmt.Errorf("grpc.max_connection_age %s and grpc.max_connection_age_grace %s must not be negative", c.GRPC.MaxConnectionAge, c.GRPC.MaxConnectionAgeGrace))
	}
	if n := c.Watch.MaxBootstraps; n < 1 || n > 10000 {
		errs = append(errs, fmt.Errorf("watch.max_bootstraps %d is out of range 1..10000", n))
	}
	if n := c.Watch.BootstrapQueue; n < 0 || n > 1000000 {
		errs = append(errs, fmt.Errorf("watch.bootstrap_queue %d is out of range 0..1000000", n))
	}
	if r := c.Watch.BootstrapRetry; r < 100*time.Millisecond || r > time.Minute {
		errs = append(errs, fmt.Errorf("watch.bootstrap_retry %s is out of range 100ms..1m", r))
	}
	if c.Watch.PageSize <= 0 || c.Watch.PageSize > 10000 {
		errs = append(errs, fmt.Errorf("watch.page_size %d is out of range 1..10000", c.Watch.PageSize))
	}
	if c.Log.Format != "json" && c.Log.Format != "text" {
		errs = append(errs, fmt.Errorf("log.format %q is not json or text", c.Log.Format))
	}
	if hclogLevel(c.Log.Level) == 0 {
		errs = append(errs, fmt.Errorf("log.level %q is not trace, debug, info, warn or error", c.Log.Level))
	}
	if p := c.Auth.RevocationPollInterval; p < 10*time.Millisecond || p > time.Minute {
		errs = append(errs, fmt.Errorf("auth.revocation_poll_interval %s is out of range 10ms..1m: it is how long a token revoked elsewhere keeps its open streams on this ctrl (default 250ms)", p))
	}
	if r := c.Auth.RecheckInterval; r < time.Second || r > 24*time.Hour {
		errs = append(errs, fmt.Errorf("auth.recheck_interval %s is out of range 1s..24h (default 1m)", r))
	}
	if r := c.Vault.AuditRetention; r < time.Hour || r > 87600*time.Hour {
		errs = append(errs, fmt.Errorf("vault.audit_retention %s is out of range 1h..87600h (default 720h)", r))
	}
	if n := c.Vault.DecryptPerMinute; n < 1 || n > 100000 {
		errs = append(errs, fmt.Errorf("vault.decrypt_per_minute %d is out of range 1..100000 (default 1000)", n))
	}
	errs = append(errs, c.validateRestate()...)
	errs = append(errs, c.validateConsole()...)
	return errors.Join(errs...)
}

func (c Config) validateConsole() []error {
	k := c.Console
	if !k.Enabled() {
		if k.TLSCert != "" || k.TLSKey != "" {
			return []error{errors.New("console.tls_cert/console.tls_key are set but console.addr is not: set console.addr to serve the console")}
		}
		return nil
	}
	var errs []error
	if _, _, err := net.SplitHostPort(k.Addr); err != nil {
		errs = append(errs, fmt.Errorf("console.addr %q is not host:port (e.g. :8080 or 127.0.0.1:8080)", k.Addr))
	}
	if (k.TLSCert == "") != (k.TLSKey == "") {
		errs = append(errs, errors.New("console.tls_cert and console.tls_key must be set together"))
	}
	if k.SessionTTL < time.Minute || k.SessionTTL > 7*24*time.Hour {
		errs = append(errs, fmt.Errorf("console.session_ttl %s is out of range 1m..168h (default 12h)", k.SessionTTL))
	}
	if k.LivePerToken < 1 || k.LivePerToken > 10000 {
		errs = append(errs, fmt.Errorf("console.live_per_token %d is out of range 1..10000 (default 64)", k.LivePerToken))
	}
	return errs
}

func (c Config) validateRestate() []error {
	r := c.Restate
	if !r.Enabled() {
		if r.AdminURL != "" {
			return []error{errors.New("restate.admin_url is set but restate.ingress_url is not: set both to run the deploy workflows, or neither")}
		}
		return nil
	}
	var errs []error
	checkURL := func(key, v string) {
		u, err := url.Parse(v)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			errs = append(errs, fmt.Errorf("%s %q is not an http:// or https:// URL", key, v))
		}
	}
	checkURL("restate.ingress_url", r.IngressURL)
	if r.AdminURL != "" {
		checkURL("restate.admin_url", r.AdminURL)
	} else if r.RegisterOnStart {
		errs = append(errs, errors.New("restate.register_on_start needs restate.admin_url (or turn registration off and run `ctrl restate register`)"))
	}
	if (r.Endpoint.TLSCert == "") != (r.Endpoint.TLSKey == "") {
		errs = append(errs, errors.New("restate.endpoint.tls_cert and restate.endpoint.tls_key must be set together"))
	}
	if r.Endpoint.TLSCert != "" && r.Endpoint.URL != "" && !strings.HasPrefix(r.Endpoint.URL, "https://") {
		errs = append(errs, fmt.Errorf("restate.endpoint.url %q must be https:// when restate.endpoint.tls_cert is set (Restate would speak cleartext to a TLS port)", r.Endpoint.URL))
	}
	if r.Endpoint.URL != "" {
		checkURL("restate.endpoint.url", r.Endpoint.URL)
	}
	if r.CAFile != "" && !strings.HasPrefix(r.IngressURL, "https://") && !strings.HasPrefix(r.AdminURL, "https://") {
		errs = append(errs, errors.New("restate.ca_file is set but neither restate.ingress_url nor restate.admin_url is https://: it verifies a TLS proxy in front of Restate; use https:// URLs or remove it"))
	}
	if _, _, err := net.SplitHostPort(r.Endpoint.Listen); err != nil {
		errs = append(errs, fmt.Errorf("restate.endpoint.listen %q is not host:port", r.Endpoint.Listen))
	}
	keys := r.IdentityKeyList()
	if len(keys) == 0 && !r.AllowUnsigned {
		errs = append(errs, errors.New("restate.identity_keys is required: the public key Restate signs its requests to ctrl's endpoint with "+
			"(restate-server: worker.invoker.request-identity-private-key-pem-file; see docs/operating.md); "+
			"without it anyone who reaches restate.endpoint.listen runs ctrl's handlers. Set restate.allow_unsigned=true only where nothing but Restate reaches it"))
	}
	for _, k := range keys {
		if err := restateendpoint.CheckIdentityKey(k); err != nil {
			errs = append(errs, fmt.Errorf("restate.identity_keys: %w", err))
		}
	}
	if c.Deploy.Timeout <= 0 || c.Deploy.Timeout > 24*time.Hour {
		errs = append(errs, fmt.Errorf("deploy.timeout %s is out of range (0, 24h]", c.Deploy.Timeout))
	}
	if n := c.HTTP.MetricsPerClusterMax; n < 0 || n > 100000 {
		errs = append(errs, fmt.Errorf("http.metrics_per_cluster_max %d is out of range 0..100000 (0: no per-cluster series)", n))
	}
	if w := c.Deploy.LiveClusterWithin; w != 0 && (w < time.Minute || w > 24*time.Hour) {
		errs = append(errs, fmt.Errorf("deploy.live_cluster_within %s is out of range: 0 (no check) or 1m..24h (hosts send a heartbeat every 30s)", w))
	}
	if c.Deploy.ResyncInterval < time.Second {
		errs = append(errs, fmt.Errorf("deploy.resync_interval %s is below 1s", c.Deploy.ResyncInterval))
	}
	s := c.Sentinel
	if s.DefaultImage == "" {
		errs = append(errs, errors.New("sentinel.default_image is empty: deploys create a sentinel from it for environments that have none; remove the setting to use this release's krane-sentinel image, or name an image"))
	}
	if s.DeployTimeout <= 0 || s.DeployTimeout > 24*time.Hour {
		errs = append(errs, fmt.Errorf("sentinel.deploy_timeout %s is out of range (0, 24h]", s.DeployTimeout))
	}
	if s.IdleStopAfter < 0 {
		errs = append(errs, fmt.Errorf("sentinel.idle_stop_after %s is negative (0 turns the idle stop off)", s.IdleStopAfter))
	}
	if s.DefaultReplicas < 1 || s.DefaultCPUMillicores < 1 || s.DefaultMemoryMiB < 1 {
		errs = append(errs, errors.New("sentinel.default_replicas, sentinel.default_cpu_millicores and sentinel.default_memory_mib must be at least 1"))
	}
	return errs
}
