// Package config reads krane.hcl: the krane host's settings and one
// `controller "NAME" {}` block per plugin. Values come from built-in
// defaults, then the file, then KRANE_* environment variables (nesting with
// a double underscore: KRANE_CONTROL_PLANE__URL sets control_plane.url).
// Unknown keys and wrong types are errors naming the key; a controller's
// `config {}` block is opaque here and checked against the plugin's own
// schema when the plugin starts (and by `krane validate`).
package config

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"time"

	"github.com/go-viper/mapstructure/v2"
	"github.com/knadh/koanf/providers/confmap"
	"github.com/knadh/koanf/providers/env/v2"
	"github.com/knadh/koanf/providers/file"
	"github.com/knadh/koanf/v2"
)

// EnvPrefix prefixes every environment override.
const EnvPrefix = "KRANE_"

// Config is a parsed, validated krane.hcl.
type Config struct {
	// Region and ClusterID identify this cluster to ctrl; they must match
	// the cluster's token.
	Region    string `koanf:"region"`
	ClusterID string `koanf:"cluster_id"`

	ControlPlane ControlPlane `koanf:"control_plane"`
	Kubernetes   Kubernetes   `koanf:"kubernetes"`
	Sync         Sync         `koanf:"sync"`
	GC           GC           `koanf:"gc"`
	Server       Server       `koanf:"server"`
	Log          Log          `koanf:"log"`
	Leader       Leader       `koanf:"leader_election"`

	// PluginDir is where relative controller paths are resolved; relative
	// to the config file's directory when itself relative.
	PluginDir string `koanf:"plugin_dir"`

	Controllers map[string]Controller `koanf:"controller"`

	// Path is the file this config came from.
	Path string `koanf:"-"`
}

// ControlPlane says how to reach ctrl.
type ControlPlane struct {
	// URL is http://host:port (plaintext, only when explicitly chosen) or
	// https://host:port (TLS).
	URL string `koanf:"url"`
	// Exactly one token source: inline, a file (re-read when it changes), or
	// an environment variable's name.
	Token     string `koanf:"token"`
	TokenFile string `koanf:"token_file"`
	TokenEnv  string `koanf:"token_env"`
	// CAFile verifies ctrl's certificate (system roots when empty);
	// ClientCertFile/ClientKeyFile enable mTLS.
	CAFile         string `koanf:"ca_file"`
	ClientCertFile string `koanf:"client_cert_file"`
	ClientKeyFile  string `koanf:"client_key_file"`
}

// Kubernetes says how the host and its plugins reach the API server.
type Kubernetes struct {
	// Kubeconfig is a kubeconfig path; empty means in-cluster. It is the
	// host's own identity; plugins get theirs (PluginIdentities).
	Kubeconfig string  `koanf:"kubeconfig"`
	Context    string  `koanf:"context"`
	QPS        float32 `koanf:"qps"`
	Burst      int     `koanf:"burst"`

	PluginIdentities PluginIdentities `koanf:"plugin_identities"`
}

// PluginIdentities gives each plugin a Kubernetes identity of its own: the
// host requests short-lived tokens for the plugin's ServiceAccount
// (TokenRequest API) and hands the plugin a kubeconfig of that account, so
// a plugin holds only the permissions its own role grants.
type PluginIdentities struct {
	// Enabled: each plugin runs as its ServiceAccount. Off, every plugin
	// uses the host's own credentials (development against a cluster where
	// the plugins' accounts do not exist).
	Enabled bool `koanf:"enabled"`
	// Namespace holds the plugins' ServiceAccounts.
	Namespace string `koanf:"namespace"`
	// TokenTTL is the lifetime asked for each token (at least 10m, the API
	// server's minimum; it may grant less).
	TokenTTL time.Duration `koanf:"token_ttl"`
	// Refresh is how long after it was issued a token is replaced; 0 means
	// at 80% of the lifetime the API server granted (what the kubelet does
	// for projected tokens).
	Refresh time.Duration `koanf:"refresh"`
	// PodName and PodUID name the pod krane runs in (the manifests set them
	// from the downward API): each plugin token is then bound to that pod,
	// so a token that leaks stops working when the pod is gone rather than
	// at the end of its lifetime. Unset (krane outside a pod), tokens are
	// bound to nothing, and krane says so at start.
	PodName string `koanf:"pod_name"`
	PodUID  string `koanf:"pod_uid"`
}

// MinTokenTTL is the shortest token lifetime the TokenRequest API grants.
const MinTokenTTL = 10 * time.Minute

// tokenReread is how often client-go re-reads a token file; a plugin's
// old token must outlive its renewal by more than this.
const tokenReread = time.Minute

// Sync tunes the per-kind sync loops.
type Sync struct {
	// ResyncInterval is how often desired state is re-read and drift
	// repaired (jittered by up to 10%).
	ResyncInterval time.Duration `koanf:"resync_interval"`
	// Reconnects to ctrl wait a random duration in [ReconnectMin, ReconnectMax].
	ReconnectMin time.Duration `koanf:"reconnect_min"`
	ReconnectMax time.Duration `koanf:"reconnect_max"`
	// Workers bounds parallel applies per kind.
	Workers int `koanf:"workers"`
	// ApplyTimeout bounds one Apply call.
	ApplyTimeout time.Duration `koanf:"apply_timeout"`
	// MaxPending bounds queued changes per kind; the stream is read no
	// faster than they are applied beyond it.
	MaxPending int `koanf:"max_pending"`
	// StreamTimeout is how long a stream from ctrl may stay silent (no
	// change, no keep-alive) before it is torn down and resumed from the
	// cursor. Keep it at three times ctrl's watch.keepalive (15s).
	StreamTimeout time.Duration `koanf:"stream_timeout"`
}

// GC is the garbage collection brake (invariant 5).
type GC struct {
	// MaxDeleteFraction of a kind's managed objects may be deleted in one
	// pass; more trips the brake and deletes nothing.
	MaxDeleteFraction float64 `koanf:"max_delete_fraction"`
	// MinDeletes are always allowed, whatever the fraction (small clusters).
	MinDeletes int `koanf:"min_deletes"`
	// AllowMassDelete overrides the brake for deliberate mass deletions.
	AllowMassDelete bool `koanf:"allow_mass_delete"`
}

// Server is the HTTP endpoint for /healthz, /readyz and /metrics.
type Server struct {
	Listen string `koanf:"listen"`
}

// Leader is leader election between krane replicas of one cluster: only
// the holder of a coordination.k8s.io Lease runs controllers; the others
// wait and take over when it stops renewing.
type Leader struct {
	Enabled   bool   `koanf:"enabled"`
	Namespace string `koanf:"namespace"`
	Name      string `koanf:"name"`
	// Identity of this replica; default: hostname and process id.
	Identity      string        `koanf:"identity"`
	LeaseDuration time.Duration `koanf:"lease_duration"`
	RenewDeadline time.Duration `koanf:"renew_deadline"`
	RetryPeriod   time.Duration `koanf:"retry_period"`
}

// Log configures the host's (and plugins') logs.
type Log struct {
	Level string `koanf:"level"`
	JSON  bool   `koanf:"json"`
}

// Controller is one plugin.
type Controller struct {
	Name    string `koanf:"-"`
	Enabled bool   `koanf:"enabled"`
	// Path of the plugin binary, relative to PluginDir unless absolute.
	// Default: krane-plugin-NAME.
	Path string `koanf:"path"`
	// SHA256 pins the binary: its digest (hex), or a list of digests any
	// of which may run (the old and the new release's, while an upgrade
	// rolls); any other binary is refused (PinError). One string is a list
	// of one.
	SHA256 []string `koanf:"sha256"`
	// ServiceAccount is the plugin's Kubernetes identity, in
	// kubernetes.plugin_identities.namespace. Default: krane-plugin-NAME.
	ServiceAccount string `koanf:"service_account"`
	// Config is the plugin's own block, checked against its schema.
	Config map[string]any `koanf:"config"`
}

// leaderJitter is client-go's leaderelection.JitterFactor (not imported:
// this package stays free of client-go).
const leaderJitter = 1.2

// Defaults are the values used when krane.hcl says nothing.
func Defaults() map[string]any {
	return map[string]any{
		"sync.resync_interval":                   "1m",
		"sync.reconnect_min":                     "1s",
		"sync.reconnect_max":                     "5s",
		"sync.workers":                           16,
		"sync.apply_timeout":                     "30s",
		"sync.max_pending":                       10000,
		"sync.stream_timeout":                    "45s",
		"gc.max_delete_fraction":                 0.25,
		"gc.min_deletes":                         5,
		"gc.allow_mass_delete":                   false,
		"server.listen":                          "127.0.0.1:9464",
		"log.level":                              "info",
		"log.json":                               false,
		"kubernetes.qps":                         500,
		"kubernetes.burst":                       1000,
		"kubernetes.plugin_identities.enabled":   true,
		"kubernetes.plugin_identities.namespace": "krane",
		"kubernetes.plugin_identities.token_ttl": "1h",
		"kubernetes.plugin_identities.refresh":   "0s",
		"kubernetes.plugin_identities.pod_name":  "",
		"kubernetes.plugin_identities.pod_uid":   "",
		"plugin_dir":                             ".",
		"leader_election.enabled":                false,
		"leader_election.namespace":              "krane",
		"leader_election.name":                   "krane",
		"leader_election.identity":               "",
		"leader_election.lease_duration":         "10s",
		"leader_election.renew_deadline":         "7s",
		"leader_election.retry_period":           "2s",
		"control_plane.url":                      "",
		"control_plane.token":                    "",
		"control_plane.token_env":                "",
	}
}

// Load reads path, applies environ's KRANE_* overrides (os.Environ() when
// nil) and validates the result.
func Load(path string, environ []string) (*Config, error) {
	k := koanf.New(".")
	if err := k.Load(confmap.Provider(Defaults(), "."), nil); err != nil {
		return nil, err
	}
	if err := k.Load(file.Provider(path), hclParser{}); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if environ == nil {
		environ = os.Environ()
	}
	known := knownKeys()
	controllers := k.MapKeys("controller")
	err := k.Load(env.Provider(".", env.Opt{
		Prefix:      EnvPrefix,
		EnvironFunc: func() []string { return environ },
		TransformFunc: func(key, value string) (string, any) {
			return envKey(key, known, controllers), value
		},
	}), nil)
	if err != nil {
		return nil, err
	}
	var cfg Config
	dc := &mapstructure.DecoderConfig{
		Result:           &cfg,
		TagName:          "koanf",
		ErrorUnused:      true,
		WeaklyTypedInput: true, // environment values are strings
		DecodeHook:       mapstructure.ComposeDecodeHookFunc(mapstructure.StringToTimeDurationHookFunc()),
	}
	if err := k.UnmarshalWithConf("", &cfg, koanf.UnmarshalConf{DecoderConfig: dc}); err != nil {
		return nil, fmt.Errorf("%s: %s", path, describeDecodeError(err))
	}
	cfg.Path = path
	if err := cfg.finish(k); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &cfg, nil
}

// envKey maps KRANE_SYNC__WORKERS to "sync.workers". Variables that name no
// setting return "" and are ignored: Kubernetes injects KRANE_SERVICE_HOST
// and friends for a Service named krane, and plugins' own variables share
// the prefix. Controller names may contain dashes, which environment names
// cannot: KRANE_CONTROLLER__MY_PLUGIN__ENABLED reaches controller "my-plugin".
func envKey(name string, known map[string]bool, controllers []string) string {
	parts := strings.Split(strings.ToLower(strings.TrimPrefix(name, EnvPrefix)), "__")
	if len(parts) >= 3 && parts[0] == "controller" {
		for _, c := range controllers {
			if strings.ReplaceAll(c, "-", "_") == parts[1] {
				parts[1] = c
			}
		}
		if known["controller.*."+parts[2]] || (parts[2] == "config" && len(parts) > 3) {
			return strings.Join(parts, ".")
		}
		return ""
	}
	key := strings.Join(parts, ".")
	if known[key] {
		return key
	}
	return ""
}

// knownKeys lists the settings' key paths from Config's koanf tags;
// controller fields appear as "controller.*.FIELD".
func knownKeys() map[string]bool {
	keys := map[string]bool{}
	var walk func(prefix string, t reflect.Type)
	walk = func(prefix string, t reflect.Type) {
		for i := range t.NumField() {
			f := t.Field(i)
			tag := f.Tag.Get("koanf")
			if tag == "" || tag == "-" {
				continue
			}
			switch {
			case f.Type.Kind() == reflect.Struct && f.Type != reflect.TypeOf(time.Duration(0)):
				walk(prefix+tag+".", f.Type)
			case f.Type.Kind() == reflect.Map && f.Type.Elem().Kind() == reflect.Struct:
				walk(prefix+tag+".*.", f.Type.Elem())
			default:
				keys[prefix+tag] = true
			}
		}
	}
	walk("", reflect.TypeOf(Config{}))
	return keys
}

var (
	mapIndexRE    = regexp.MustCompile(`\[([^\]]+)\]`)
	notAMapRE     = regexp.MustCompile(`'([^']+)' expected a map or struct, got "slice"`)
	invalidKeysRE = regexp.MustCompile(`'([^']*)' has invalid keys: (.*)`)
	nameRE        = regexp.MustCompile(`^[a-z][a-z0-9-]{0,62}$`)
	sha256RE      = regexp.MustCompile(`^[0-9a-f]{64}$`)
	dnsLabelRE    = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)
	// A DNS subdomain, as Kubernetes requires of ServiceAccount names.
	serviceAccountRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?$`)
)

// describeDecodeError rewrites mapstructure's messages into "unknown key
// X" / "key X: reason" lines.
func describeDecodeError(err error) string {
	var lines []string
	for _, line := range strings.Split(err.Error(), "\n") {
		line = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(line), "*"))
		line = mapIndexRE.ReplaceAllString(line, ".$1")
		if m := notAMapRE.FindStringSubmatch(line); m != nil {
			lines = append(lines, fmt.Sprintf("block %q is defined more than once", m[1]))
			continue
		}
		if line == "" || strings.HasPrefix(line, "decoding failed") || strings.HasSuffix(line, "error(s) decoding:") {
			continue
		}
		if m := invalidKeysRE.FindStringSubmatch(line); m != nil {
			for _, key := range strings.Split(m[2], ", ") {
				lines = append(lines, fmt.Sprintf("unknown key %q", join(m[1], key)))
			}
			continue
		}
		lines = append(lines, line)
	}
	if len(lines) == 0 {
		return err.Error()
	}
	return strings.Join(lines, "; ")
}

// finish fills derived values and checks what types cannot express.
func (c *Config) finish(k *koanf.Koanf) error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, fmt.Errorf("key %q: %s", key, fmt.Sprintf(format, args...)))
	}
	if c.Region == "" {
		bad("region", "required: the region this cluster serves (it must match the cluster's token)")
	}
	if c.ClusterID == "" {
		bad("cluster_id", "required: this cluster's id (as registered with `ctrl admin cluster register`)")
	}
	if u, err := url.Parse(c.ControlPlane.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		bad("control_plane.url", "%q: want http://host:port (plaintext) or https://host:port (TLS)", c.ControlPlane.URL)
	}
	sources := 0
	for _, s := range []string{c.ControlPlane.Token, c.ControlPlane.TokenFile, c.ControlPlane.TokenEnv} {
		if s != "" {
			sources++
		}
	}
	if sources != 1 {
		bad("control_plane.token", "set exactly one of token, token_file or token_env (found %d)", sources)
	}
	if (c.ControlPlane.ClientCertFile == "") != (c.ControlPlane.ClientKeyFile == "") {
		bad("control_plane.client_cert_file", "client_cert_file and client_key_file go together")
	}
	s := c.Sync
	if s.ResyncInterval < 5*time.Second {
		bad("sync.resync_interval", "%s is too short (minimum 5s)", s.ResyncInterval)
	}
	if s.ReconnectMin <= 0 || s.ReconnectMax < s.ReconnectMin {
		bad("sync.reconnect_min", "want 0 < reconnect_min <= reconnect_max (got %s and %s)", s.ReconnectMin, s.ReconnectMax)
	}
	if s.Workers < 1 || s.Workers > 1024 {
		bad("sync.workers", "%d is out of range 1..1024", s.Workers)
	}
	if s.ApplyTimeout <= 0 {
		bad("sync.apply_timeout", "must be positive")
	}
	if s.MaxPending < 1 {
		bad("sync.max_pending", "must be positive")
	}
	if s.StreamTimeout < time.Second {
		bad("sync.stream_timeout", "%s is too short (minimum 1s; keep it at three times ctrl's watch.keepalive)", s.StreamTimeout)
	}
	if c.GC.MaxDeleteFraction <= 0 || c.GC.MaxDeleteFraction > 1 {
		bad("gc.max_delete_fraction", "%v is out of range (0, 1]", c.GC.MaxDeleteFraction)
	}
	if c.GC.MinDeletes < 0 {
		bad("gc.min_deletes", "must not be negative")
	}
	if l := c.Leader; l.Enabled {
		if l.Namespace == "" || l.Name == "" {
			bad("leader_election.name", "namespace and name of the Lease are required")
		}
		// What client-go's leader election requires: renewals are retried
		// every retry_period with up to 20% jitter, and must have had their
		// chance before renew_deadline, which must leave the lease time to
		// expire before another replica takes it.
		if !(l.RetryPeriod > 0 && float64(l.RenewDeadline) > leaderJitter*float64(l.RetryPeriod) && l.RenewDeadline < l.LeaseDuration) {
			bad("leader_election.lease_duration", "want retry_period > 0, renew_deadline > 1.2 x retry_period and lease_duration > renew_deadline (got retry_period %s, renew_deadline %s, lease_duration %s)", l.RetryPeriod, l.RenewDeadline, l.LeaseDuration)
		}
	}
	if pi := c.Kubernetes.PluginIdentities; pi.Enabled {
		if !dnsLabelRE.MatchString(pi.Namespace) {
			bad("kubernetes.plugin_identities.namespace", "%q is not a namespace name (lowercase letters, digits and dashes)", pi.Namespace)
		}
		if pi.TokenTTL < MinTokenTTL {
			bad("kubernetes.plugin_identities.token_ttl", "%s is shorter than the %s the TokenRequest API grants at least", pi.TokenTTL, MinTokenTTL)
		}
		if pi.Refresh < 0 || (pi.Refresh > 0 && pi.Refresh > pi.TokenTTL-2*tokenReread) {
			bad("kubernetes.plugin_identities.refresh", "%s: want 0 (80%% of the granted lifetime) or a duration ending at least %s before token_ttl (%s), so the old token outlives the plugin's switch to the new one", pi.Refresh, 2*tokenReread, pi.TokenTTL)
		}
		if (pi.PodName == "") != (pi.PodUID == "") {
			bad("kubernetes.plugin_identities.pod_name", "pod_name %q and pod_uid %q: set both (the downward API's metadata.name and metadata.uid) or neither", pi.PodName, pi.PodUID)
		}
	}
	if !filepath.IsAbs(c.PluginDir) && c.Path != "" {
		c.PluginDir = filepath.Join(filepath.Dir(c.Path), c.PluginDir)
	}
	for name, ctl := range c.Controllers {
		key := "controller." + name
		if !nameRE.MatchString(name) {
			bad(key, "controller names are lowercase letters, digits and dashes")
		}
		ctl.Name = name
		// A block present without `enabled` means enabled.
		if !k.Exists(key + ".enabled") {
			ctl.Enabled = true
		}
		if ctl.Path == "" {
			ctl.Path = "krane-plugin-" + name
		}
		if !filepath.IsAbs(ctl.Path) {
			ctl.Path = filepath.Join(c.PluginDir, ctl.Path)
		}
		if ctl.ServiceAccount == "" {
			ctl.ServiceAccount = "krane-plugin-" + name
		}
		if !serviceAccountRE.MatchString(ctl.ServiceAccount) {
			bad(key+".service_account", "%q is not a ServiceAccount name (lowercase letters, digits, dots and dashes)", ctl.ServiceAccount)
		}
		for i, pin := range ctl.SHA256 {
			ctl.SHA256[i] = strings.ToLower(strings.TrimSpace(pin))
			if !sha256RE.MatchString(ctl.SHA256[i]) {
				bad(key+".sha256", "%q: want 64 hex digits (sha256sum of the plugin binary), or a list of them", pin)
			}
		}
		if ctl.Config == nil {
			ctl.Config = map[string]any{}
		}
		c.Controllers[name] = ctl
	}
	return errors.Join(errs...)
}

// Enabled returns the enabled controllers.
func (c *Config) Enabled() []Controller {
	var out []Controller
	for _, ctl := range c.Controllers {
		if ctl.Enabled {
			out = append(out, ctl)
		}
	}
	return out
}

// ConfigJSON is the controller's config block as JSON, shaped by the
// plugin's JSON Schema where HCL v1 is ambiguous (see coerceToSchema).
func (ctl Controller) ConfigJSON(schema string) (json.RawMessage, error) {
	v := coerceToSchema(ctl.Config, schema)
	return json.Marshal(v)
}

// Token returns the control plane token from its configured source.
func (cp ControlPlane) ReadToken() (string, error) {
	switch {
	case cp.Token != "":
		return cp.Token, nil
	case cp.TokenFile != "":
		b, err := os.ReadFile(cp.TokenFile)
		if err != nil {
			return "", fmt.Errorf("read control_plane.token_file: %w", err)
		}
		return strings.TrimSpace(string(b)), nil
	case cp.TokenEnv != "":
		t := os.Getenv(cp.TokenEnv)
		if t == "" {
			return "", fmt.Errorf("control_plane.token_env: environment variable %s is empty", cp.TokenEnv)
		}
		return t, nil
	}
	return "", errors.New("no control plane token configured")
}
