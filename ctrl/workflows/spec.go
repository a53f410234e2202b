package workflows

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"krane.dev/ctrl/store"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
)

// DeployRequest is the input of DeployWorkflow's Run handler. The workflow's
// key is the deployment's id.
type DeployRequest struct {
	Deployment Spec `json:"deployment"`
	// Regions to run in; empty means every region with a registered
	// cluster.
	Regions []string `json:"regions,omitempty"`
	// TimeoutSeconds bounds the wait for every region to run; 0 means
	// ctrl's deploy.timeout.
	TimeoutSeconds int32 `json:"timeout_seconds,omitempty"`
	// Note is the first entry of the deployment's history when the
	// workflow creates the row (e.g. "rollback of dep_x").
	Note string `json:"note,omitempty"`
}

// Spec is a deployment's configuration as the workflow journals it (JSON).
// EncryptedEnv is a sealed blob; plaintext secrets never appear here.
type Spec struct {
	ID             string            `json:"id"`
	WorkspaceID    string            `json:"workspace_id"`
	ProjectID      string            `json:"project_id"`
	EnvironmentID  string            `json:"environment_id"`
	AppID          string            `json:"app_id"`
	K8sNamespace   string            `json:"k8s_namespace"`
	K8sName        string            `json:"k8s_name"`
	Image          string            `json:"image"`
	CPUMillicores  int64             `json:"cpu_millicores"`
	MemoryMiB      int64             `json:"memory_mib"`
	Replicas       int32             `json:"replicas"`
	EnvVars        map[string]string `json:"env_vars,omitempty"`
	EncryptedEnv   []byte            `json:"encrypted_env,omitempty"`
	SecretEnvKeys  []string          `json:"secret_env_keys,omitempty"`
	Healthcheck    *Healthcheck      `json:"healthcheck,omitempty"`
	Port           int32             `json:"port"`
	Command        []string          `json:"command,omitempty"`
	ShutdownSignal string            `json:"shutdown_signal,omitempty"`
	RolledBackFrom string            `json:"rolled_back_from,omitempty"`
}

// Healthcheck is a deployment's probe (see krane.cluster.v1.Healthcheck).
type Healthcheck struct {
	Method              string `json:"method,omitempty"`
	Path                string `json:"path,omitempty"`
	Port                int32  `json:"port,omitempty"`
	InitialDelaySeconds int32  `json:"initial_delay_seconds,omitempty"`
	PeriodSeconds       int32  `json:"period_seconds,omitempty"`
	TimeoutSeconds      int32  `json:"timeout_seconds,omitempty"`
	FailureThreshold    int32  `json:"failure_threshold,omitempty"`
}

// HealthcheckFromProto converts the wire form (nil stays nil).
func HealthcheckFromProto(h *clusterv1.Healthcheck) *Healthcheck {
	if h == nil {
		return nil
	}
	return &Healthcheck{Method: h.GetMethod(), Path: h.GetPath(), Port: h.GetPort(), InitialDelaySeconds: h.GetInitialDelaySeconds(),
		PeriodSeconds: h.GetPeriodSeconds(), TimeoutSeconds: h.GetTimeoutSeconds(), FailureThreshold: h.GetFailureThreshold()}
}

// Proto converts to the wire form (nil stays nil).
func (h *Healthcheck) Proto() *clusterv1.Healthcheck {
	if h == nil {
		return nil
	}
	return &clusterv1.Healthcheck{Method: h.Method, Path: h.Path, Port: h.Port, InitialDelaySeconds: h.InitialDelaySeconds,
		PeriodSeconds: h.PeriodSeconds, TimeoutSeconds: h.TimeoutSeconds, FailureThreshold: h.FailureThreshold}
}

// SpecFromStore is the spec of a stored deployment.
func SpecFromStore(d store.Deployment) Spec {
	return Spec{
		ID: d.ID, WorkspaceID: d.WorkspaceID, ProjectID: d.ProjectID, EnvironmentID: d.EnvironmentID, AppID: d.AppID,
		K8sNamespace: d.K8sNamespace, K8sName: d.K8sName, Image: d.Image, CPUMillicores: d.CPUMillicores, MemoryMiB: d.MemoryMiB,
		Replicas: d.Replicas, EnvVars: d.EnvVars, EncryptedEnv: d.EncryptedEnv, SecretEnvKeys: d.SecretEnvKeys, Healthcheck: HealthcheckFromProto(d.Healthcheck),
		Port: d.Port, Command: d.Command, ShutdownSignal: d.ShutdownSignal, RolledBackFrom: d.RolledBackFrom,
	}
}

// Store is the spec as a deployments row (status pending).
func (s Spec) Store() store.Deployment {
	return store.Deployment{
		ID: s.ID, WorkspaceID: s.WorkspaceID, ProjectID: s.ProjectID, EnvironmentID: s.EnvironmentID, AppID: s.AppID,
		K8sNamespace: s.K8sNamespace, K8sName: s.K8sName, Image: s.Image, CPUMillicores: s.CPUMillicores, MemoryMiB: s.MemoryMiB,
		Replicas: s.Replicas, EnvVars: s.EnvVars, EncryptedEnv: s.EncryptedEnv, SecretEnvKeys: s.SecretEnvKeys, Healthcheck: s.Healthcheck.Proto(),
		Port: s.Port, Command: s.Command, ShutdownSignal: s.ShutdownSignal, RolledBackFrom: s.RolledBackFrom,
		Status: store.StatusPending,
	}
}

// FieldError is invalid input: which field (as the API names it) and why.
type FieldError struct {
	Field  string
	Reason string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Reason }

func fieldErr(field, format string, args ...any) *FieldError {
	return &FieldError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// Limits of a deployment's configuration.
const (
	MaxReplicas      = 1000
	MaxCPUMillicores = 256_000
	MaxMemoryMiB     = 1 << 20 // 1 TiB
	MaxTimeout       = 24 * 60 * 60
	maxEnvVars       = 1000
	maxEnvValueBytes = 32 << 10
	maxCommandArgs   = 256
	maxArgBytes      = 4096
)

var (
	// namePattern: workspace, project, environment and app ids, and
	// regions (the rule cluster registration applies to regions).
	namePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`)
	// regionPattern is the rule `ctrl cluster register` applies.
	regionPattern = regexp.MustCompile(`^[a-z0-9_.-]{1,64}$`)
	// imagePattern is a container image reference:
	// [registry[:port]/]path[:tag][@sha256:digest].
	imagePattern = regexp.MustCompile(`^(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*(?::[0-9]+)?/)?` +
		`[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*` +
		`(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[a-f0-9]{64})?$`)
	envNamePattern = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	dnsLabel       = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)
	signals        = []string{"SIGTERM", "SIGINT", "SIGQUIT", "SIGKILL"}
)

// ValidName checks an id-like field (workspace, project, environment, app).
func ValidName(field, v string) error {
	if !namePattern.MatchString(v) {
		return fieldErr(field, "%q must be 1-64 characters of letters, digits, '_', '.' or '-', starting with a letter or digit", v)
	}
	return nil
}

// ValidRegions checks a list of regions: valid names, no duplicates.
func ValidRegions(field string, regions []string) error {
	seen := map[string]bool{}
	for i, r := range regions {
		f := fmt.Sprintf("%s[%d]", field, i)
		if !regionPattern.MatchString(r) {
			return fieldErr(f, "%q is not a region name (1-64 characters of a-z, 0-9, '-', '_' or '.')", r)
		}
		if seen[r] {
			return fieldErr(f, "region %q is listed twice", r)
		}
		seen[r] = true
	}
	return nil
}

// ValidSecretEnvKeys checks the names of secret variables: variable names,
// at most maxEnvVars, none also a plain variable (which one would win in
// the container is not obvious).
func ValidSecretEnvKeys(field string, names []string, plain map[string]string) error {
	if len(names) > maxEnvVars {
		return fieldErr(field, "%d variables; at most %d", len(names), maxEnvVars)
	}
	for _, k := range slices.Sorted(slices.Values(names)) {
		if !envNamePattern.MatchString(k) || len(k) > 256 {
			return fieldErr(field, "%q is not a variable name (letters, digits and '_', not starting with a digit)", k)
		}
		if _, dup := plain[k]; dup {
			return fieldErr(field, "%s is also set in env_vars; set it in one of them", k)
		}
	}
	return nil
}

// ValidImage checks a container image reference.
func ValidImage(field, image string) error {
	if image == "" {
		return fieldErr(field, "an image is required, e.g. registry.example.com/team/app:1.2.3")
	}
	if len(image) > 512 || !imagePattern.MatchString(image) {
		return fieldErr(field, "%q is not a valid image reference (want [registry[:port]/]name[:tag][@sha256:digest], lowercase name)", image)
	}
	return nil
}

// Validate checks a spec; the error names the first bad field the way the
// deploy API does.
func (s Spec) Validate() error {
	for _, f := range []struct{ name, v string }{
		{"workspace_id", s.WorkspaceID}, {"project_id", s.ProjectID}, {"environment_id", s.EnvironmentID}, {"app_id", s.AppID},
	} {
		if err := ValidName(f.name, f.v); err != nil {
			return err
		}
	}
	if s.ID == "" {
		return fieldErr("id", "a deployment id is required")
	}
	if !dnsLabel.MatchString(s.K8sName) {
		return fieldErr("k8s_name", "%q is not a DNS-1123 label", s.K8sName)
	}
	if !dnsLabel.MatchString(s.K8sNamespace) {
		return fieldErr("k8s_namespace", "%q is not a DNS-1123 label", s.K8sNamespace)
	}
	if err := ValidImage("image", s.Image); err != nil {
		return err
	}
	if s.Replicas < 1 || s.Replicas > MaxReplicas {
		return fieldErr("replicas", "%d is out of range 1..%d", s.Replicas, MaxReplicas)
	}
	if s.CPUMillicores < 1 || s.CPUMillicores > MaxCPUMillicores {
		return fieldErr("cpu_millicores", "%d is out of range 1..%d", s.CPUMillicores, MaxCPUMillicores)
	}
	if s.MemoryMiB < 1 || s.MemoryMiB > MaxMemoryMiB {
		return fieldErr("memory_mib", "%d is out of range 1..%d", s.MemoryMiB, MaxMemoryMiB)
	}
	if s.Port < 1 || s.Port > 65535 {
		return fieldErr("port", "%d is out of range 1..65535", s.Port)
	}
	if len(s.EnvVars) > maxEnvVars {
		return fieldErr("env_vars", "%d variables; at most %d", len(s.EnvVars), maxEnvVars)
	}
	keys := make([]string, 0, len(s.EnvVars))
	for k := range s.EnvVars {
		keys = append(keys, k)
	}
	slices.Sort(keys) // report the same bad key every time
	for _, k := range keys {
		if !envNamePattern.MatchString(k) || len(k) > 256 {
			return fieldErr("env_vars", "%q is not a variable name (letters, digits and '_', not starting with a digit)", k)
		}
		if len(s.EnvVars[k]) > maxEnvValueBytes {
			return fieldErr("env_vars", "the value of %s is %d bytes; at most %d", k, len(s.EnvVars[k]), maxEnvValueBytes)
		}
	}
	if err := ValidSecretEnvKeys("secret_env", s.SecretEnvKeys, s.EnvVars); err != nil {
		return err
	}
	if (len(s.SecretEnvKeys) == 0) != (len(s.EncryptedEnv) == 0) {
		return fieldErr("secret_env", "the sealed environment and the names of its variables must come together")
	}
	if len(s.Command) > maxCommandArgs {
		return fieldErr("command", "%d arguments; at most %d", len(s.Command), maxCommandArgs)
	}
	for i, a := range s.Command {
		if len(a) > maxArgBytes {
			return fieldErr(fmt.Sprintf("command[%d]", i), "%d bytes; at most %d", len(a), maxArgBytes)
		}
	}
	if s.ShutdownSignal != "" && !slices.Contains(signals, s.ShutdownSignal) {
		return fieldErr("shutdown_signal", "%q is not one of %s", s.ShutdownSignal, strings.Join(signals, ", "))
	}
	if h := s.Healthcheck; h != nil {
		if h.Method != "" && h.Method != "GET" && h.Method != "POST" {
			return fieldErr("healthcheck.method", "%q is not GET or POST", h.Method)
		}
		if !strings.HasPrefix(h.Path, "/") {
			return fieldErr("healthcheck.path", "%q must start with '/'", h.Path)
		}
		if h.Port < 0 || h.Port > 65535 {
			return fieldErr("healthcheck.port", "%d is out of range 0..65535 (0: the deployment's port)", h.Port)
		}
		if h.InitialDelaySeconds < 0 || h.PeriodSeconds < 0 || h.TimeoutSeconds < 0 || h.FailureThreshold < 0 {
			return fieldErr("healthcheck", "delays, periods, timeouts and thresholds cannot be negative")
		}
	}
	if s.RolledBackFrom != "" && len(s.RolledBackFrom) > 64 {
		return fieldErr("rolled_back_from", "%q is too long", s.RolledBackFrom)
	}
	return nil
}

func (r DeployRequest) validate(key string) error {
	if r.Deployment.ID != key {
		return fieldErr("deployment.id", "%q differs from the workflow's key %q (start the workflow with the deployment id as its key)", r.Deployment.ID, key)
	}
	if err := r.Deployment.Validate(); err != nil {
		return err
	}
	if err := ValidRegions("regions", r.Regions); err != nil {
		return err
	}
	if r.TimeoutSeconds < 0 || r.TimeoutSeconds > MaxTimeout {
		return fieldErr("timeout_seconds", "%d is out of range 0..%d", r.TimeoutSeconds, MaxTimeout)
	}
	return nil
}

// idEncoding is lowercase base32: ids and the Kubernetes names derived from
// them stay DNS-safe.
var idEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// idLen is the random part of an id: 20 base32 characters, 100 bits.
const idLen = 20

func newID(prefix string, random []byte) string {
	return prefix + idEncoding.EncodeToString(random)[:idLen]
}

// NewDeploymentID returns a fresh deployment id: "dep_" and 20 random
// base32 characters.
func NewDeploymentID() string {
	b := make([]byte, 13)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return newID("dep_", b)
}

// K8sName derives a deployment's or sentinel's Kubernetes name from its id:
// "dep_abc" becomes "dep-abc", a DNS-1123 label.
func K8sName(id string) string {
	return strings.ToLower(strings.ReplaceAll(id, "_", "-"))
}

// Namespace is the Kubernetes namespace of a workspace's deployments:
// "ws-" and the workspace id made a DNS-1123 label. When that changed the
// id (case, characters, length), a hash of the original is appended so two
// workspaces never share a namespace.
func Namespace(workspaceID string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(workspaceID) {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') || r == '-' {
			b.WriteRune(r)
		} else {
			b.WriteByte('-')
		}
	}
	clean := strings.Trim(b.String(), "-")
	if clean == workspaceID && len(clean) <= 60 && clean != "" {
		return "ws-" + clean
	}
	sum := sha256.Sum256([]byte(workspaceID))
	suffix := idEncoding.EncodeToString(sum[:])[:8]
	if len(clean) > 50 {
		clean = strings.TrimRight(clean[:50], "-")
	}
	if clean == "" {
		return "ws-" + suffix
	}
	return "ws-" + clean + "-" + suffix
}
