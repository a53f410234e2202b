package controller

//lint:file-ignore SA1019 legacy-workload: removed no earlier than v0.3.0 (docs/compatibility.md); this file builds or reads the deprecated top-level workload fields

import (
	"testing"

	"google.golang.org/protobuf/proto"
	"k8s.io/apimachinery/pkg/util/validation"

	clusterv1 "krane.dev/proto/krane/cluster/v1"
	"krane.dev/sdk"
	"krane.dev/sdk/kube"
)

// FuzzValidateBuild feeds validate and buildReplicaSet with fields that ctrl
// could send, and with arbitrary bytes decoded as a Deployment. Whatever
// comes in, nothing panics, invalid input is a permanent error, and valid
// input builds a ReplicaSet the API server's name and label rules accept.
// Seeds: testdata/fuzz/FuzzValidateBuild. Run: go test -fuzz FuzzValidateBuild.
func FuzzValidateBuild(f *testing.F) {
	f.Add("dep_1", "registry.example/team/web:v1", "ws-1", "web", int64(250), int64(256), int32(3),
		"ALPHA", "first", "GET", "/health", int32(0), "SIGTERM", []byte(nil))
	wire, _ := proto.Marshal(validSpec())
	f.Add("dep_1", "nginx", "ws-1", "api", int64(1), int64(1), int32(0), "_x", "", "POST", "/", int32(65535), "SIGKILL", wire)
	cfg := Defaults()
	f.Fuzz(func(t *testing.T, id, image, ns, name string, cpu, mem int64, replicas int32,
		envName, envValue, method, path string, port int32, signal string, raw []byte) {
		d := &clusterv1.Deployment{
			WorkspaceId: "ws_1", ProjectId: "proj_1", EnvironmentId: "env_1",
			K8SNamespace: ns, K8SName: name, Image: image,
			CpuMillicores: cpu, MemoryMib: mem, Replicas: replicas,
			EnvVars:        map[string]string{envName: envValue},
			Healthcheck:    &clusterv1.Healthcheck{Method: method, Path: path, Port: port},
			Port:           port,
			ShutdownSignal: signal,
		}
		checkValidateBuild(t, id, d, cfg)
		fromWire := &clusterv1.Deployment{}
		if proto.Unmarshal(raw, fromWire) == nil {
			checkValidateBuild(t, id, fromWire, cfg)
		}
	})
}

func checkValidateBuild(t *testing.T, id string, d *clusterv1.Deployment, cfg Config) {
	if err := validate(id, d, cfg); err != nil {
		if !sdk.IsPermanent(err) {
			t.Fatalf("validate: %v is not permanent", err)
		}
		return
	}
	rs := buildReplicaSet(id, 1, d, cfg)
	if errs := validation.IsDNS1123Subdomain(rs.Name); len(errs) > 0 {
		t.Fatalf("ReplicaSet name %q: %v", rs.Name, errs)
	}
	for k, v := range rs.Spec.Template.Labels {
		if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
			t.Fatalf("label %s=%q: %v", k, v, errs)
		}
	}
	seen := map[string]bool{}
	for _, e := range rs.Spec.Template.Spec.Containers[0].Env {
		if seen[e.Name] {
			t.Fatalf("env var %s twice (server-side apply refuses duplicate keys)", e.Name)
		}
		seen[e.Name] = true
	}
	if _, err := kube.ToUnstructured(rs); err != nil {
		t.Fatalf("ToUnstructured: %v", err)
	}
	if again := buildReplicaSet(id, 1, d, cfg); again.Name != rs.Name {
		t.Fatalf("build is not deterministic: %s vs %s", again.Name, rs.Name)
	}
}
