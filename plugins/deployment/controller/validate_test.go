package controller

//lint:file-ignore SA1019 legacy-workload: removed no earlier than v0.3.0 (docs/compatibility.md); this file builds or reads the deprecated top-level workload fields

import (
	"errors"
	"strings"
	"testing"

	clusterv1 "krane.dev/proto/krane/cluster/v1"
	"krane.dev/sdk"
)

// InvalidCase is a desired state validation must refuse, naming Field.
// Exported for the conformance test in package controller_test.
type InvalidCase struct {
	Name  string
	ID    string // the change id; "" means "dep_1"
	Field string
	Edit  func(d *clusterv1.Deployment)
}

// ValidSpec is a Deployment that passes validation.
func ValidSpec() *clusterv1.Deployment { return validSpec() }

// InvalidCases covers every rule of validate.
func InvalidCases() []InvalidCase {
	long := strings.Repeat("a", 64)
	return []InvalidCase{
		{"id not a label value", "dep 1", "id", func(*clusterv1.Deployment) {}},
		{"spec id differs", "", "id", func(d *clusterv1.Deployment) { d.Id = "dep_2" }},
		{"workspace missing", "", "workspace_id", func(d *clusterv1.Deployment) { d.WorkspaceId = "" }},
		{"project not a label value", "", "project_id", func(d *clusterv1.Deployment) { d.ProjectId = "proj/1" }},
		{"environment missing", "", "environment_id", func(d *clusterv1.Deployment) { d.EnvironmentId = "" }},
		{"app too long", "", "app_id", func(d *clusterv1.Deployment) { d.AppId = long }},
		{"namespace not DNS-1123", "", "k8s_namespace", func(d *clusterv1.Deployment) { d.K8SNamespace = "Team_A" }},
		{"namespace reserved", "", "k8s_namespace", func(d *clusterv1.Deployment) { d.K8SNamespace = "kube-system" }},
		{"namespace of the sentinels", "", "k8s_namespace", func(d *clusterv1.Deployment) { d.K8SNamespace = "sentinel" }},
		{"name not DNS-1123", "", "k8s_name", func(d *clusterv1.Deployment) { d.K8SName = "web.v1" }},
		{"name too long", "", "k8s_name", func(d *clusterv1.Deployment) { d.K8SName = long }},
		{"image missing", "", "image", func(d *clusterv1.Deployment) { d.Image = "" }},
		{"image upper case", "", "image", func(d *clusterv1.Deployment) { d.Image = "Registry.example/Web:v1" }},
		{"image with spaces", "", "image", func(d *clusterv1.Deployment) { d.Image = "web :v1" }},
		{"image bad digest", "", "image", func(d *clusterv1.Deployment) { d.Image = "web@sha256:1234" }},
		{"cpu zero", "", "cpu_millicores", func(d *clusterv1.Deployment) { d.CpuMillicores = 0 }},
		{"cpu huge", "", "cpu_millicores", func(d *clusterv1.Deployment) { d.CpuMillicores = 1 << 40 }},
		{"memory negative", "", "memory_mib", func(d *clusterv1.Deployment) { d.MemoryMib = -1 }},
		{"memory huge", "", "memory_mib", func(d *clusterv1.Deployment) { d.MemoryMib = 1 << 40 }},
		{"replicas negative", "", "replicas", func(d *clusterv1.Deployment) { d.Replicas = -1 }},
		{"replicas huge", "", "replicas", func(d *clusterv1.Deployment) { d.Replicas = 1 << 20 }},
		{"port out of range", "", "port", func(d *clusterv1.Deployment) { d.Port = 70000 }},
		{"env name not an identifier", "", "env_vars", func(d *clusterv1.Deployment) { d.EnvVars = map[string]string{"1ST": "x"} }},
		{"env name with a dash", "", "env_vars", func(d *clusterv1.Deployment) { d.EnvVars = map[string]string{"MY-VAR": "x"} }},
		{"env name reserved", "", "env_vars", func(d *clusterv1.Deployment) { d.EnvVars = map[string]string{"UNKEY_DEPLOYMENT_ID": "x"} }},
		{"env value with NUL", "", "env_vars", func(d *clusterv1.Deployment) { d.EnvVars = map[string]string{"A": "x\x00y"} }},
		{"command empty program", "", "command", func(d *clusterv1.Deployment) { d.Command = []string{"", "x"} }},
		{"shutdown signal unknown", "", "shutdown_signal", func(d *clusterv1.Deployment) { d.ShutdownSignal = "SIGHUP" }},
		{"healthcheck method", "", "healthcheck.method", func(d *clusterv1.Deployment) { d.Healthcheck = &clusterv1.Healthcheck{Method: "PUT", Path: "/"} }},
		{"healthcheck path relative", "", "healthcheck.path", func(d *clusterv1.Deployment) { d.Healthcheck = &clusterv1.Healthcheck{Path: "health"} }},
		{"healthcheck path with space", "", "healthcheck.path", func(d *clusterv1.Deployment) { d.Healthcheck = &clusterv1.Healthcheck{Path: "/he alth"} }},
		{"healthcheck path with host", "", "healthcheck.path", func(d *clusterv1.Deployment) { d.Healthcheck = &clusterv1.Healthcheck{Path: "//evil.example/x"} }},
		{"healthcheck port", "", "healthcheck.port", func(d *clusterv1.Deployment) { d.Healthcheck = &clusterv1.Healthcheck{Path: "/", Port: -1} }},
		{"healthcheck timing", "", "healthcheck.timeout_seconds", func(d *clusterv1.Deployment) {
			d.Healthcheck = &clusterv1.Healthcheck{Path: "/", TimeoutSeconds: -5}
		}},
		{"healthcheck period", "", "healthcheck.period_seconds", func(d *clusterv1.Deployment) {
			d.Healthcheck = &clusterv1.Healthcheck{Path: "/", PeriodSeconds: 100000}
		}},
	}
}

func TestValidateRefusesAndNamesTheField(t *testing.T) {
	cfg := Defaults()
	for _, tc := range InvalidCases() {
		d := validSpec()
		tc.Edit(d)
		id := tc.ID
		if id == "" {
			id = "dep_1"
		}
		err := validate(id, d, cfg)
		var pe *sdk.PermanentError
		if !errors.As(err, &pe) {
			t.Errorf("%s: %v, want a permanent error", tc.Name, err)
			continue
		}
		if pe.Field != tc.Field {
			t.Errorf("%s: field %q (%v), want %q", tc.Name, pe.Field, err, tc.Field)
		}
	}
}

func TestValidateAccepts(t *testing.T) {
	cfg := Defaults()
	for name, edit := range map[string]func(d *clusterv1.Deployment){
		"as is":              func(*clusterv1.Deployment) {},
		"no spec id":         func(d *clusterv1.Deployment) { d.Id = "" },
		"no app":             func(d *clusterv1.Deployment) { d.AppId = "" },
		"stopped":            func(d *clusterv1.Deployment) { d.Replicas = 0 },
		"short image":        func(d *clusterv1.Deployment) { d.Image = "nginx" },
		"digest image":       func(d *clusterv1.Deployment) { d.Image = "ghcr.io/o/app@sha256:" + strings.Repeat("ab", 32) },
		"registry with port": func(d *clusterv1.Deployment) { d.Image = "localhost:5000/app:1.0" },
		"healthcheck": func(d *clusterv1.Deployment) {
			d.Healthcheck = &clusterv1.Healthcheck{Method: "POST", Path: "/v1/health?x=1", Port: 9090}
		},
		"signals":        func(d *clusterv1.Deployment) { d.ShutdownSignal = "SIGQUIT" },
		"lower-case env": func(d *clusterv1.Deployment) { d.EnvVars = map[string]string{"_private": "", "http_proxy": "x"} },
		"port":           func(d *clusterv1.Deployment) { d.Port = 65535 },
	} {
		d := validSpec()
		edit(d)
		if err := validate("dep_1", d, cfg); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}
