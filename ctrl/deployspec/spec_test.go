package deployspec_test

import (
	"strings"
	"testing"

	"krane.dev/ctrl/deployspec"
)

func TestIDsAndNames(t *testing.T) {
	id := deployspec.NewDeploymentID()
	if len(id) != 24 || !strings.HasPrefix(id, "dep_") || id == deployspec.NewDeploymentID() {
		t.Fatalf("deployment id %q", id)
	}
	if k := deployspec.K8sName(id); k != "dep-"+id[4:] {
		t.Fatalf("k8s name %q", k)
	}
	for in, want := range map[string]string{
		"acme":    "ws-acme",
		"ws_ACME": "ws-ws-acme-",
		"":        "ws-",
	} {
		got := deployspec.Namespace(in)
		if !strings.HasPrefix(got, want) || len(got) > 63 {
			t.Errorf("Namespace(%q) = %q, want a DNS label starting %q", in, got, want)
		}
	}
	if deployspec.Namespace("ws_a") == deployspec.Namespace("ws-a") {
		t.Fatal("two workspace ids share a namespace")
	}
	long := deployspec.Namespace(strings.Repeat("x", 64))
	if len(long) > 63 {
		t.Fatalf("namespace %q is longer than 63", long)
	}
}

func TestSpecValidationNamesTheField(t *testing.T) {
	good := deployspec.Spec{ID: "dep_x", WorkspaceID: "ws", ProjectID: "p", EnvironmentID: "e", AppID: "a", K8sName: "dep-x", K8sNamespace: "ws-ws",
		Image: "registry.example.com:5000/team/app:1.2.3", Replicas: 1, CPUMillicores: 100, MemoryMiB: 128, Port: 8080}
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	for field, mutate := range map[string]func(*deployspec.Spec){
		"image":              func(s *deployspec.Spec) { s.Image = "Registry/App:latest" },
		"replicas":           func(s *deployspec.Spec) { s.Replicas = 0 },
		"environment_id":     func(s *deployspec.Spec) { s.EnvironmentID = "bad env" },
		"env_vars":           func(s *deployspec.Spec) { s.EnvVars = map[string]string{"1X": "y"} },
		"port":               func(s *deployspec.Spec) { s.Port = 70000 },
		"shutdown_signal":    func(s *deployspec.Spec) { s.ShutdownSignal = "SIGHUP" },
		"healthcheck.path":   func(s *deployspec.Spec) { s.Healthcheck = &deployspec.Healthcheck{Path: "healthz"} },
		"healthcheck.method": func(s *deployspec.Spec) { s.Healthcheck = &deployspec.Healthcheck{Method: "PUT", Path: "/"} },
	} {
		s := good
		mutate(&s)
		err := s.Validate()
		if err == nil || !strings.HasPrefix(err.Error(), field+": ") {
			t.Errorf("%s: error %v, want one naming the field", field, err)
		}
	}
}
