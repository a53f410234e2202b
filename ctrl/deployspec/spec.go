package deployspec

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"

	"krane.dev/ctrl/api"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
)

// Spec is a deployment's configuration as the workflow journals it (JSON,
// see json.go) and the store keeps it. What runs is Workload, one message
// from the operator's request to the cluster's plugin; the rest is where,
// how many and under which names. EncryptedEnv is a sealed blob; plaintext
// secrets never appear here.
type Spec struct {
	ID            string `json:"id"`
	WorkspaceID   string `json:"workspace_id"`
	ProjectID     string `json:"project_id"`
	EnvironmentID string `json:"environment_id"`
	AppID         string `json:"app_id"`
	K8sNamespace  string `json:"k8s_namespace"`
	K8sName       string `json:"k8s_name"`
	// Replicas per region as the deploy asked for them (a scale changes the
	// regions' topology and this count).
	Replicas int32 `json:"replicas"`
	// Workload is what runs, defaults filled in (WithDefaults).
	Workload       *clusterv1.Workload `json:"-"`
	EncryptedEnv   []byte              `json:"encrypted_env,omitempty"`
	SecretEnvKeys  []string            `json:"secret_env_keys,omitempty"`
	RolledBackFrom string              `json:"rolled_back_from,omitempty"`
}

// FieldError is invalid input: which field (as the API names it) and why.
// It is ctrl's one field-error type, api.FieldError.
type FieldError = api.FieldError

// Errorf is a FieldError with a formatted reason.
func Errorf(field, format string, args ...any) *FieldError { return api.Fieldf(field, format, args...) }

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
	// regionPattern is the rule `ctrl admin cluster register` applies.
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
		return Errorf(field, "%q must be 1-64 characters of letters, digits, '_', '.' or '-', starting with a letter or digit", v)
	}
	return nil
}

// ValidRegions checks a list of regions: valid names, no duplicates.
func ValidRegions(field string, regions []string) error {
	seen := map[string]bool{}
	for i, r := range regions {
		f := fmt.Sprintf("%s[%d]", field, i)
		if !regionPattern.MatchString(r) {
			return Errorf(f, "%q is not a region name (1-64 characters of a-z, 0-9, '-', '_' or '.')", r)
		}
		if seen[r] {
			return Errorf(f, "region %q is listed twice", r)
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
		return Errorf(field, "%d variables; at most %d", len(names), maxEnvVars)
	}
	for _, k := range slices.Sorted(slices.Values(names)) {
		if !envNamePattern.MatchString(k) || len(k) > 256 {
			// Not quoted: a malformed line of a secrets file can put a
			// value (a password) where the name should be.
			return Errorf(field, "a name of %d characters is not a variable name (letters, digits and '_', not starting with a digit, at most 256)", len(k))
		}
		if _, dup := plain[k]; dup {
			return Errorf(field, "%s is also set in env_vars; set it in one of them", k)
		}
	}
	return nil
}

// ValidImage checks a container image reference.
func ValidImage(field, image string) error {
	if image == "" {
		return Errorf(field, "an image is required, e.g. registry.example.com/team/app:1.2.3")
	}
	if len(image) > 512 || !imagePattern.MatchString(image) {
		return Errorf(field, "%q is not a valid image reference (want [registry[:port]/]name[:tag][@sha256:digest], lowercase name)", image)
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
		return Errorf("id", "a deployment id is required")
	}
	if !dnsLabel.MatchString(s.K8sName) {
		return Errorf("k8s_name", "%q is not a DNS-1123 label", s.K8sName)
	}
	if !dnsLabel.MatchString(s.K8sNamespace) {
		return Errorf("k8s_namespace", "%q is not a DNS-1123 label", s.K8sNamespace)
	}
	if s.Replicas < 1 || s.Replicas > MaxReplicas {
		return Errorf("replicas", "%d is out of range 1..%d", s.Replicas, MaxReplicas)
	}
	if err := ValidWorkload(s.Workload); err != nil {
		return err
	}
	if err := ValidSecretEnvKeys("secret_env", s.SecretEnvKeys, s.Workload.GetEnvVars()); err != nil {
		return err
	}
	if (len(s.SecretEnvKeys) == 0) != (len(s.EncryptedEnv) == 0) {
		return Errorf("secret_env", "the sealed environment and the names of its variables must come together")
	}
	if s.RolledBackFrom != "" && len(s.RolledBackFrom) > 64 {
		return Errorf("rolled_back_from", "%q is too long", s.RolledBackFrom)
	}
	return nil
}

// ValidWorkload checks a workload with its defaults filled in
// (WithDefaults); the error names the first bad field by its name in the
// workload. Bounds the proto declares are checked before any handler
// runs; these are the rules a bound cannot say.
func ValidWorkload(w *clusterv1.Workload) error {
	if w == nil {
		return Errorf("workload", "a workload is required (its image at least)")
	}
	if err := ValidImage("image", w.GetImage()); err != nil {
		return err
	}
	if c := w.GetCpuMillicores(); c < 1 || c > MaxCPUMillicores {
		return Errorf("cpu_millicores", "%d is out of range 1..%d", c, MaxCPUMillicores)
	}
	if m := w.GetMemoryMib(); m < 1 || m > MaxMemoryMiB {
		return Errorf("memory_mib", "%d is out of range 1..%d", m, MaxMemoryMiB)
	}
	if p := w.GetPort(); p < 1 || p > 65535 {
		return Errorf("port", "%d is out of range 1..65535", p)
	}
	env := w.GetEnvVars()
	if len(env) > maxEnvVars {
		return Errorf("env_vars", "%d variables; at most %d", len(env), maxEnvVars)
	}
	for _, k := range slices.Sorted(maps.Keys(env)) { // the same bad key every time
		if !envNamePattern.MatchString(k) || len(k) > 256 {
			return Errorf("env_vars", "%q is not a variable name (letters, digits and '_', not starting with a digit)", k)
		}
		if len(env[k]) > maxEnvValueBytes {
			return Errorf("env_vars", "the value of %s is %d bytes; at most %d", k, len(env[k]), maxEnvValueBytes)
		}
	}
	if len(w.GetCommand()) > maxCommandArgs {
		return Errorf("command", "%d arguments; at most %d", len(w.GetCommand()), maxCommandArgs)
	}
	for i, a := range w.GetCommand() {
		if len(a) > maxArgBytes {
			return Errorf(fmt.Sprintf("command[%d]", i), "%d bytes; at most %d", len(a), maxArgBytes)
		}
	}
	if sig := w.GetShutdownSignal(); sig != "" && !slices.Contains(signals, sig) {
		return Errorf("shutdown_signal", "%q is not one of %s", sig, strings.Join(signals, ", "))
	}
	if h := w.GetHealthcheck(); h != nil {
		if h.GetMethod() != "" && h.GetMethod() != "GET" && h.GetMethod() != "POST" {
			return Errorf("healthcheck.method", "%q is not GET or POST", h.GetMethod())
		}
		if !strings.HasPrefix(h.GetPath(), "/") {
			return Errorf("healthcheck.path", "%q must start with '/'", h.GetPath())
		}
		if h.GetPort() < 0 || h.GetPort() > 65535 {
			return Errorf("healthcheck.port", "%d is out of range 0..65535 (0: the deployment's port)", h.GetPort())
		}
		if h.GetInitialDelaySeconds() < 0 || h.GetPeriodSeconds() < 0 || h.GetTimeoutSeconds() < 0 || h.GetFailureThreshold() < 0 {
			return Errorf("healthcheck", "delays, periods, timeouts and thresholds cannot be negative")
		}
	}
	return nil
}

// idEncoding is lowercase base32: ids and the Kubernetes names derived from
// them stay DNS-safe.
var idEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// idLen is the random part of an id: 20 base32 characters, 100 bits.
const idLen = 20

// NewID is prefix and the random bytes in lowercase base32, cut to 20
// characters (100 bits): a DNS-safe id.
func NewID(prefix string, random []byte) string {
	return prefix + idEncoding.EncodeToString(random)[:idLen]
}

// NewDeploymentID returns a fresh deployment id: "dep_" and 20 random
// base32 characters.
func NewDeploymentID() string {
	b := make([]byte, 13)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return NewID("dep_", b)
}

// K8sName derives a deployment's or sentinel's Kubernetes name from its id:
// "dep_abc" becomes "dep-abc", a DNS-1123 label.
func K8sName(id string) string {
	return strings.ToLower(strings.ReplaceAll(id, "_", "-"))
}

// Namespace is the Kubernetes namespace a new workspace's deployments go
// to (CreateDeployment keeps a workspace's existing namespace: see
// deployapi). Two workspaces never share one, by construction:
//
//   - The plain form is "ws-" and the id itself, used only when the id is
//     already a DNS-1123 label of at most 60 and does not end in "-" and 8
//     characters of lowercase base32 (the hashed form's tail). Distinct
//     ids give distinct plain names.
//   - Any other id takes the hashed form: "ws-", the id made a label (cut
//     to 50; "0" when nothing is left), "-", and 8 base32 characters of the
//     SHA-256 of the exact id. A plain name never ends like that, so the
//     two forms never meet; two hashed names are equal only when the
//     readable parts and the hashes of two different ids both agree (a
//     40-bit hash collision among ids that clean to the same prefix), and
//     the store refuses to hand out a namespace another workspace holds
//     (store.WorkspaceNamespace), which closes even that.
//
// Before this rule, an id shaped like a hashed name ("acme-g4bwzwhz") took
// the plain form and could land on another id's hashed name ("Acme"); such
// ids, and the empty id, now map elsewhere. Every other id maps as before.
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
	if clean == workspaceID && len(clean) <= 60 && clean != "" && !hashedTail.MatchString(clean) {
		return "ws-" + clean
	}
	sum := sha256.Sum256([]byte(workspaceID))
	suffix := idEncoding.EncodeToString(sum[:])[:8]
	if len(clean) > 50 {
		clean = strings.TrimRight(clean[:50], "-")
	}
	if clean == "" {
		clean = "0"
	}
	return "ws-" + clean + "-" + suffix
}

// hashedTail matches the end of Namespace's hashed form: "-" and 8
// characters of idEncoding.
var hashedTail = regexp.MustCompile(`-[a-z2-7]{8}$`)

// maxHosts bounds an environment's hosts (SetEnvironmentHostsRequest).
const maxHosts = 100

// Hosts checks an environment's hosts and returns them as the sentinels
// compare them: lower case, sorted, each once. A host is a DNS name
// (RFC 1123: dot-separated labels of letters, digits and inner hyphens,
// each at most 63 bytes, at most 253 in all), with no port, scheme,
// wildcard or trailing dot.
func Hosts(hosts []string) ([]string, error) {
	if len(hosts) > maxHosts {
		return nil, &api.FieldError{Field: "hosts", Reason: fmt.Sprintf("%d hosts; at most %d", len(hosts), maxHosts)}
	}
	set := map[string]bool{}
	for i, h := range hosts {
		h = strings.ToLower(strings.TrimSpace(h))
		if err := validHost(h); err != nil {
			return nil, &api.FieldError{Field: fmt.Sprintf("hosts[%d]", i), Reason: fmt.Sprintf("%q: %s", hosts[i], err)}
		}
		set[h] = true
	}
	return slices.Sorted(maps.Keys(set)), nil
}

func validHost(h string) error {
	if h == "" || len(h) > 253 {
		return fmt.Errorf("want a DNS name of 1 to 253 bytes, e.g. app.example.com")
	}
	if strings.ContainsAny(h, ":/*") {
		return fmt.Errorf("a host is a DNS name alone: no scheme, port, path or wildcard")
	}
	for _, label := range strings.Split(h, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return fmt.Errorf("label %q: each dot-separated label is 1 to 63 letters, digits or inner hyphens (no trailing dot)", label)
		}
		for _, r := range label {
			if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-') {
				return fmt.Errorf("label %q holds %q: only letters, digits and hyphens", label, r)
			}
		}
	}
	return nil
}
