package controller

import (
	"net/url"
	"slices"
	"strings"
	"unicode"

	"k8s.io/apimachinery/pkg/util/validation"

	clusterv1 "krane.dev/proto/krane/cluster/v1"
	"krane.dev/sdk"
	"krane.dev/sdk/kube"
)

// shutdownSignals maps the accepted shutdown signals to kill(1) names.
var shutdownSignals = map[string]string{"SIGTERM": "TERM", "SIGINT": "INT", "SIGQUIT": "QUIT", "SIGKILL": "KILL"}

// Bounds of the fields the API server would otherwise reject late or that
// no sane workload needs.
const (
	maxProbeSeconds = 3600
	maxPathLength   = 2048
)

// validate checks a desired Deployment before anything reaches the cluster.
// Every failure is a permanent error naming the spec field, because ctrl has
// to send a new version to fix it.
func validate(id string, d *clusterv1.Deployment, cfg Config) error {
	if errs := validation.IsValidLabelValue(id); len(errs) > 0 || id == "" {
		return sdk.InvalidField("id", "%q is not usable as a label value: %s", id, firstOr(errs, "empty"))
	}
	if d.GetId() != "" && d.GetId() != id {
		return sdk.InvalidField("id", "spec id %q differs from the change id %q", d.GetId(), id)
	}
	for _, f := range []struct {
		field, value string
		required     bool
	}{
		{"workspace_id", d.GetWorkspaceId(), true},
		{"project_id", d.GetProjectId(), true},
		{"environment_id", d.GetEnvironmentId(), true},
		{"app_id", d.GetAppId(), false},
	} {
		if f.value == "" && f.required {
			return sdk.InvalidField(f.field, "is required")
		}
		if errs := validation.IsValidLabelValue(f.value); len(errs) > 0 {
			return sdk.InvalidField(f.field, "%q is not usable as a label value: %s", f.value, errs[0])
		}
	}
	ns := d.GetK8SNamespace()
	if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
		return sdk.InvalidField("k8s_namespace", "%q: %s", ns, errs[0])
	}
	// User workloads (and so the registry credentials copied to them)
	// never go into the cluster's own namespaces, krane's, or the
	// sentinels'.
	if why := reservedNamespace(cfg, ns); why != "" {
		return sdk.InvalidField("k8s_namespace", "%q is reserved (%s): ctrl must send the workspace's own namespace (\"ws-...\")", ns, why)
	}
	if errs := validation.IsDNS1123Label(d.GetK8SName()); len(errs) > 0 {
		return sdk.InvalidField("k8s_name", "%q: %s", d.GetK8SName(), errs[0])
	}
	w := workloadOf(d)
	if err := kube.ValidateImage("image", w.GetImage()); err != nil {
		return err
	}
	if c := w.GetCpuMillicores(); c < 1 || c > cfg.MaxCPUMillicores {
		return sdk.InvalidField("cpu_millicores", "%d is out of range 1..%d", c, cfg.MaxCPUMillicores)
	}
	if m := w.GetMemoryMib(); m < 1 || m > cfg.MaxMemoryMiB {
		return sdk.InvalidField("memory_mib", "%d is out of range 1..%d", m, cfg.MaxMemoryMiB)
	}
	if r := d.GetReplicas(); r < 0 || r > cfg.MaxReplicas {
		return sdk.InvalidField("replicas", "%d is out of range 0..%d", r, cfg.MaxReplicas)
	}
	if p := w.GetPort(); p < 0 || p > 65535 {
		return sdk.InvalidField("port", "%d is out of range 1..65535 (0 means %d)", p, defaultPort)
	}
	reserved := cfg.EnvVarNames.list()
	for name, value := range w.GetEnvVars() {
		if !cIdentifier.MatchString(name) {
			return sdk.InvalidField("env_vars", "name %q: want letters, digits and _, not starting with a digit", name)
		}
		if slices.Contains(reserved, name) {
			return sdk.InvalidField("env_vars", "name %q is set by Krane itself", name)
		}
		if strings.ContainsRune(value, 0) {
			return sdk.InvalidField("env_vars", "value of %q contains a NUL byte", name)
		}
	}
	for i, arg := range w.GetCommand() {
		if strings.ContainsRune(arg, 0) || (i == 0 && arg == "") {
			return sdk.InvalidField("command", "argument %d is empty or contains a NUL byte", i)
		}
	}
	if s := w.GetShutdownSignal(); s != "" {
		if _, ok := shutdownSignals[s]; !ok {
			return sdk.InvalidField("shutdown_signal", "%q: want SIGTERM, SIGINT, SIGQUIT or SIGKILL", s)
		}
	}
	if hc := w.GetHealthcheck(); hc != nil {
		return validateHealthcheck(hc)
	}
	return nil
}

func validateHealthcheck(hc *clusterv1.Healthcheck) error {
	if m := hc.GetMethod(); m != "" && m != "GET" && m != "POST" {
		return sdk.InvalidField("healthcheck.method", "%q: want GET or POST", m)
	}
	path := hc.GetPath()
	if !strings.HasPrefix(path, "/") || len(path) > maxPathLength || strings.IndexFunc(path, notPrintableASCII) >= 0 {
		return sdk.InvalidField("healthcheck.path", "%q: want an absolute path of at most %d printable characters, starting with /", path, maxPathLength)
	}
	// "//host/x" would read as a host to the kubelet's URL parser.
	if u, err := url.ParseRequestURI(path); err != nil || u.Host != "" || strings.HasPrefix(path, "//") {
		return sdk.InvalidField("healthcheck.path", "%q is not a request path", path)
	}
	if p := hc.GetPort(); p < 0 || p > 65535 {
		return sdk.InvalidField("healthcheck.port", "%d is out of range 1..65535 (0 means the container port)", p)
	}
	for _, f := range []struct {
		field string
		v     int32
	}{
		{"initial_delay_seconds", hc.GetInitialDelaySeconds()},
		{"period_seconds", hc.GetPeriodSeconds()},
		{"timeout_seconds", hc.GetTimeoutSeconds()},
		{"failure_threshold", hc.GetFailureThreshold()},
	} {
		if f.v < 0 || f.v > maxProbeSeconds {
			return sdk.InvalidField("healthcheck."+f.field, "%d is out of range 0..%d (0 means the default)", f.v, maxProbeSeconds)
		}
	}
	return nil
}

func notPrintableASCII(r rune) bool { return r > unicode.MaxASCII || !unicode.IsPrint(r) || r == ' ' }

func firstOr(errs []string, def string) string {
	if len(errs) > 0 {
		return errs[0]
	}
	return def
}
