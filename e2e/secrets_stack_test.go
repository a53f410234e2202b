package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"krane.dev/internal/testenv"
)

// TestSecretsThroughTheStack: the deployment layout an operator runs (the
// ctrl and krane binaries as processes, krane authenticated by KRANE_TOKEN
// and reaching its API server as the ServiceAccount of deploy/): `ctrl
// deploy create --secret-env` reaches both regions' workloads; no plugin
// process holds the cluster token; no process log holds a value or token.
func TestSecretsThroughTheStack(t *testing.T) {
	st := sharedStack(t)
	ctx := context.Background()
	fromEnv, fromFile := randomSecret(), randomSecret()
	envFile := filepath.Join(t.TempDir(), "secrets.env")
	if err := os.WriteFile(envFile, []byte("# from a file\nFILE_SECRET=\""+fromFile+"\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := st.CtrlCommand(ctx, "deploy", "create", "--workspace", "e2e", "--project", "p", "--app", "a", "--environment", "e2e-secrets",
		"--image", "registry.local/e2e/secrets:1", "--replicas", "1", "--secret-env", "API_KEY", "--secret-env-file", envFile, "--wait", "-o", "json")
	cmd.Env = append(cmd.Env, "API_KEY="+fromEnv)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("deploy create --secret-env: %v\n%s%s", err, out, stderr.String())
	}
	var d struct {
		ID            string   `json:"id"`
		Status        string   `json:"status"`
		SecretEnvKeys []string `json:"secretEnvKeys"`
	}
	dec := json.NewDecoder(bytes.NewReader(out))
	for dec.More() {
		if err := dec.Decode(&d); err != nil {
			t.Fatalf("deploy create -o json: %v\n%s", err, out)
		}
	}
	if !strings.Contains(d.Status, "READY") || strings.Join(d.SecretEnvKeys, ",") != "API_KEY,FILE_SECRET" {
		t.Fatalf("deployment %s: status %s, secret names %v", d.ID, d.Status, d.SecretEnvKeys)
	}
	for _, v := range []string{fromEnv, fromFile} {
		if bytes.Contains(out, []byte(v)) || strings.Contains(stderr.String(), v) {
			t.Fatal("the CLI printed a secret value")
		}
	}

	// Every region's workload reads the values from its Secret.
	sel := metav1.ListOptions{LabelSelector: "unkey.com/deployment.id=" + d.ID}
	for region, c := range st.Clusters {
		secrets, err := c.Client.CoreV1().Secrets("").List(ctx, sel)
		if err != nil || len(secrets.Items) != 1 {
			t.Fatalf("%s: Secrets of %s: %v", region, d.ID, err)
		}
		data := secrets.Items[0].Data
		if string(data["API_KEY"]) != fromEnv || string(data["FILE_SECRET"]) != fromFile || len(data) != 2 {
			t.Fatalf("%s: the Secret does not hold the deployment's values", region)
		}
		pods, err := c.Client.CoreV1().Pods(secrets.Items[0].Namespace).List(ctx, sel)
		if err != nil || len(pods.Items) != 1 || len(pods.Items[0].Spec.Containers[0].EnvFrom) != 1 ||
			pods.Items[0].Spec.Containers[0].EnvFrom[0].SecretRef.Name != secrets.Items[0].Name {
			t.Fatalf("%s: pods of %s do not read the Secret: %v", region, d.ID, err)
		}
	}

	// The plugins run without the token krane got in KRANE_TOKEN.
	for region := range st.Clusters {
		krane := st.Krane(region)
		children := childProcesses(t, krane.Pid())
		if len(children) < 3 {
			t.Fatalf("%s: krane (pid %d) runs %d plugin processes, want its 3", region, krane.Pid(), len(children))
		}
		for _, pid := range children {
			environ, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
			if err != nil {
				t.Fatal(err)
			}
			if bytes.Contains(environ, []byte(st.ClusterTokens[region])) || bytes.Contains(environ, []byte("KRANE_TOKEN=")) {
				t.Fatalf("%s: plugin process %d holds the cluster token", region, pid)
			}
		}
	}

	// No process log of the stack holds a value or a token.
	logs, err := filepath.Glob(filepath.Join(st.Dir(), "*.log"))
	if err != nil || len(logs) < 3 {
		t.Fatalf("process logs: %v, %v", logs, err)
	}
	needles := []string{fromEnv, fromFile, st.OperatorToken}
	for _, tok := range st.ClusterTokens {
		needles = append(needles, tok)
	}
	size := 0
	for _, path := range logs {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		size += len(b)
		for _, n := range needles {
			for _, form := range testenv.LeakForms(n) {
				if bytes.Contains(b, []byte(form)) {
					t.Errorf("%s holds a secret value or a token", filepath.Base(path))
				}
			}
		}
	}
	t.Logf("%d process logs (%d bytes) of ctrl and every krane with its plugins: no value, no token", len(logs), size)
	if _, err := st.Ctrl(ctx, "deploy", "stop", d.ID); err != nil {
		t.Fatal(err)
	}
}

// childProcesses lists the pids whose parent is pid.
func childProcesses(t *testing.T, pid int) []int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces, so split after ')'.
		rest := string(stat[bytes.LastIndexByte(stat, ')')+1:])
		fields := strings.Fields(rest)
		if len(fields) > 1 && fields[1] == strconv.Itoa(pid) {
			out = append(out, child)
		}
	}
	return out
}
