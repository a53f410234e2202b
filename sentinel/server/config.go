package server

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"
)

// Environment variables. The UNKEY_* ones are set by the sentinel plugin on
// every sentinel container; the KRANE_SENTINEL_* ones are the sentinel's own.
const (
	EnvSentinelID     = "UNKEY_SENTINEL_ID"
	EnvEnvironmentID  = "UNKEY_ENVIRONMENT_ID"
	EnvRegion         = "UNKEY_REGION"
	EnvHTTPPort       = "UNKEY_HTTP_PORT"
	EnvRoutes         = "KRANE_SENTINEL_ROUTES"
	EnvAdminAddr      = "KRANE_SENTINEL_ADMIN_ADDR"
	EnvAccessLog      = "KRANE_SENTINEL_ACCESS_LOG"
	EnvLogLevel       = "KRANE_SENTINEL_LOG_LEVEL"
	EnvTrusted        = "KRANE_SENTINEL_TRUSTED_PROXIES"
	EnvMaxHeaderBytes = "KRANE_SENTINEL_MAX_HEADER_BYTES"
	EnvMaxBodyBytes   = "KRANE_SENTINEL_MAX_BODY_BYTES"
	EnvReadHeader     = "KRANE_SENTINEL_READ_HEADER_TIMEOUT"
	EnvRead           = "KRANE_SENTINEL_READ_TIMEOUT"
	EnvWrite          = "KRANE_SENTINEL_WRITE_TIMEOUT"
	EnvIdle           = "KRANE_SENTINEL_IDLE_TIMEOUT"
	EnvDial           = "KRANE_SENTINEL_DIAL_TIMEOUT"
	EnvUpstreamHeader = "KRANE_SENTINEL_UPSTREAM_HEADER_TIMEOUT"
	EnvShutdownDelay  = "KRANE_SENTINEL_SHUTDOWN_DELAY"
	EnvDrainTimeout   = "KRANE_SENTINEL_DRAIN_TIMEOUT"
	EnvKubeconfig     = "KUBECONFIG"
)

// Config is a sentinel's configuration.
type Config struct {
	SentinelID, EnvironmentID, Region string
	// HTTPAddr is the data port's listen address (":" + UNKEY_HTTP_PORT).
	HTTPAddr  string
	AdminAddr string
	// RoutesNamespace/RoutesName locate the routes ConfigMap.
	RoutesNamespace, RoutesName string
	// Kubeconfig is a file; empty means the in-cluster config.
	Kubeconfig     string
	AccessLog      bool
	LogLevel       string
	TrustedProxies []netip.Prefix

	MaxHeaderBytes int
	MaxBodyBytes   int64

	ReadHeaderTimeout     time.Duration
	ReadTimeout           time.Duration
	WriteTimeout          time.Duration
	IdleTimeout           time.Duration
	DialTimeout           time.Duration
	UpstreamHeaderTimeout time.Duration
	ShutdownDelay         time.Duration
	DrainTimeout          time.Duration
}

// FromEnv reads the configuration. Every error names the variable and the
// form it expects.
func FromEnv(getenv func(string) string) (Config, error) {
	c := Config{
		SentinelID:    getenv(EnvSentinelID),
		EnvironmentID: getenv(EnvEnvironmentID),
		Region:        getenv(EnvRegion),
		AdminAddr:     or(getenv(EnvAdminAddr), ":9091"),
		Kubeconfig:    getenv(EnvKubeconfig),
		LogLevel:      or(getenv(EnvLogLevel), "info"),
	}
	var errs []string
	fail := func(f string, a ...any) { errs = append(errs, fmt.Sprintf(f, a...)) }
	if c.EnvironmentID == "" {
		fail("%s is required (the environment this sentinel serves; the sentinel plugin sets it)", EnvEnvironmentID)
	}
	port := or(getenv(EnvHTTPPort), "8040")
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		fail("%s=%q is not a port (1-65535)", EnvHTTPPort, port)
	}
	c.HTTPAddr = ":" + port
	ns, name, ok := strings.Cut(getenv(EnvRoutes), "/")
	if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
		fail("%s=%q must be <namespace>/<configmap name> of the routes ConfigMap", EnvRoutes, getenv(EnvRoutes))
	}
	c.RoutesNamespace, c.RoutesName = ns, name
	switch v := strings.ToLower(getenv(EnvAccessLog)); v {
	case "", "1", "true", "on", "yes":
		c.AccessLog = true
	case "0", "false", "off", "no":
	default:
		fail("%s=%q must be true or false", EnvAccessLog, v)
	}
	if v := getenv(EnvTrusted); v != "" {
		for _, s := range strings.Split(v, ",") {
			p, err := netip.ParsePrefix(strings.TrimSpace(s))
			if err != nil {
				fail("%s: %q is not a CIDR (e.g. 10.0.0.0/8): %v", EnvTrusted, s, err)
				continue
			}
			c.TrustedProxies = append(c.TrustedProxies, p)
		}
	}
	num := func(env string, def, lo, hi int64) int64 {
		v := getenv(env)
		if v == "" {
			return def
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < lo || n > hi {
			fail("%s=%q must be a number of bytes in [%d, %d]", env, v, lo, hi)
			return def
		}
		return n
	}
	c.MaxHeaderBytes = int(num(EnvMaxHeaderBytes, 64<<10, 4<<10, 1<<20))
	c.MaxBodyBytes = num(EnvMaxBodyBytes, 32<<20, 1, 1<<40)
	dur := func(env string, def time.Duration) time.Duration {
		v := getenv(env)
		if v == "" {
			return def
		}
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			fail("%s=%q must be a duration such as 30s", env, v)
			return def
		}
		return d
	}
	c.ReadHeaderTimeout = dur(EnvReadHeader, 10*time.Second)
	c.ReadTimeout = dur(EnvRead, 60*time.Second)
	c.WriteTimeout = dur(EnvWrite, 60*time.Second)
	c.IdleTimeout = dur(EnvIdle, 120*time.Second)
	c.DialTimeout = dur(EnvDial, 2*time.Second)
	c.UpstreamHeaderTimeout = dur(EnvUpstreamHeader, 60*time.Second)
	c.ShutdownDelay = dur(EnvShutdownDelay, 5*time.Second)
	c.DrainTimeout = dur(EnvDrainTimeout, 20*time.Second)
	if len(errs) > 0 {
		return c, fmt.Errorf("sentinel configuration:\n  %s", strings.Join(errs, "\n  "))
	}
	return c, nil
}

func or(v, def string) string {
	if v == "" {
		return def
	}
	return v
}
