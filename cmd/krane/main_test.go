package main_test

import (
	"bufio"

	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"krane.dev/internal/clustertest"
	"krane.dev/internal/testenv"
	"krane.dev/internal/testenv/kubeenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// setup builds krane and two plugins and writes a krane.hcl.
func setup(t *testing.T, controllers string) (krane, cfg string) {
	t.Helper()
	krane = testenv.Build(t, "krane.dev/cmd/krane", "krane")
	cm := testenv.Build(t, "krane.dev/sdk/examples/configmap", "krane-plugin-configmap")
	noop := testenv.Build(t, "krane.dev/internal/testplugins/noop/plugin", "krane-plugin-noop-a")
	dir := t.TempDir()
	for _, p := range []string{cm, noop} {
		if err := os.Link(p, filepath.Join(dir, filepath.Base(p))); err != nil {
			t.Fatal(err)
		}
	}
	ctrl := clustertest.Start(t, "r1", "tok")
	kube := kubeenv.Shared(t)
	cfg = filepath.Join(dir, "krane.hcl")
	hcl := fmt.Sprintf(`region = "r1"
cluster_id = "c1"
control_plane {
  url = %q
  token = "tok"
}
kubernetes {
  kubeconfig = %q
  # The test's admin credentials serve the plugins too.
  plugin_identities { enabled = false }
}
server { listen = "127.0.0.1:0" }
plugin_dir = "."
%s`, ctrl.URL(), kube.Kubeconfig, controllers)
	if err := os.WriteFile(cfg, []byte(hcl), 0o600); err != nil {
		t.Fatal(err)
	}
	return krane, cfg
}

func sha(t *testing.T, path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// children lists the pids whose parent is pid.
func children(pid int) []int {
	var out []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		f, err := os.Open(filepath.Join("/proc", e.Name(), "status"))
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), "PPid:"); ok {
				if ppid, _ := strconv.Atoi(strings.TrimSpace(v)); ppid == pid {
					out = append(out, child)
				}
				break
			}
		}
		f.Close()
	}
	return out
}

// alive reports whether pid runs (a zombie counts as dead).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	fields := strings.Fields(string(b))
	return len(fields) > 2 && fields[2] != "Z"
}

// TestKill9HostLeavesNoPlugin: plugins die with their host, however it dies.
func TestKill9HostLeavesNoPlugin(t *testing.T) {
	krane, cfg := setup(t, `controller "configmap" {}
controller "noop-a" {}`)
	cmd := exec.Command(krane, "run", "-c", cfg)
	cmd.Stderr = os.Stderr
	if os.Getenv("KRANE_TEST_VERBOSE") == "" {
		cmd.Stderr = nil
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	var plugins []int
	deadline := time.Now().Add(30 * time.Second)
	for len(plugins) < 2 && time.Now().Before(deadline) {
		plugins = children(cmd.Process.Pid)
		time.Sleep(100 * time.Millisecond)
	}
	if len(plugins) < 2 {
		t.Fatalf("host started %d plugin processes, want 2", len(plugins))
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	eventually(t, 5*time.Second, func() error {
		for _, p := range plugins {
			if alive(p) {
				return fmt.Errorf("plugin %d survived its host", p)
			}
		}
		return nil
	})
}

func TestValidate(t *testing.T) {
	krane, cfg := setup(t, `controller "configmap" {
  config { allowed_namespaces = ["a"] }
}`)
	out, err := exec.Command(krane, "validate", "-c", cfg).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "controller configmap") || !strings.Contains(string(out), "ok (configmap") {
		t.Fatalf("valid file: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "a reload (SIGHUP, or the file changing) applies everything but server.listen, leader_election, log.json") {
		t.Errorf("validate does not say what only a restart applies:\n%s", out)
	}
	bin := filepath.Join(filepath.Dir(cfg), "krane-plugin-configmap")
	bad := map[string]string{
		`controller "configmap" { config { allowed_namespace = ["a"] } }`:        `config key "allowed_namespace": unknown key`,
		`controller "configmap" { config { allowed_namespaces = "a" } }`:         `config key "allowed_namespaces"`,
		`controller "configmap" { sha256 = "` + strings.Repeat("ab", 32) + `" }`: "which its pin does not list",
		`controller "configmap" { path = "nope" }`:                               "no such file",
		`controller "configmap" { enabld = true }`:                               `unknown key "controller.configmap.enabld"`,
	}
	for block, want := range bad {
		_, cfg := setup(t, block)
		out, err := exec.Command(krane, "validate", "-c", cfg).CombinedOutput()
		if err == nil || !strings.Contains(string(out), want) || !strings.Contains(string(out), "configmap") {
			t.Errorf("%s:\n got %v: %s\n want an error naming the controller and %q", block, err, out, want)
		}
	}
	// The right pin passes.
	_, cfg = setup(t, `controller "configmap" { sha256 = "`+sha(t, bin)+`" }`)
	if out, err := exec.Command(krane, "validate", "-c", cfg).CombinedOutput(); err != nil {
		t.Errorf("correct sha256 rejected: %v\n%s", err, out)
	}
}

func TestVersion(t *testing.T) {
	krane := testenv.Build(t, "krane.dev/cmd/krane", "krane")
	out, err := exec.Command(krane, "--version").CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "krane version ") {
		t.Fatalf("%v: %s", err, out)
	}
}

func eventually(t *testing.T, timeout time.Duration, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var err error
	for time.Now().Before(deadline) {
		if err = cond(); err == nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatal(err)
}
