package cli_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"krane.dev/ctrl/internal/ctrltest"
	"krane.dev/internal/testenv"
	ctrlv1 "krane.dev/proto/krane/ctrl/v1"
)

// deployEnv is a ctrl with Restate, two fake clusters, and CTRL_ADDR /
// CTRL_TOKEN set for the CLI.
func deployEnv(t *testing.T) (*ctrltest.Env, map[string]*ctrltest.FakeCluster) {
	t.Helper()
	env := ctrltest.Start(t, ctrltest.Options{Restate: testenv.SharedRestate(t)})
	clusters := map[string]*ctrltest.FakeCluster{
		"eu": env.FakeCluster(t, "eu", "eu-1"),
		"us": env.FakeCluster(t, "us", "us-1"),
	}
	t.Setenv("CTRL_ADDR", env.Server.GRPCAddr())
	t.Setenv("CTRL_TOKEN", env.OperatorToken(t, "cli test"))
	return env, clusters
}

// newDeployment waits for the environment's newest deployment to reach
// status network and returns its id.
func newDeployment(t *testing.T, env *ctrltest.Env, environment string, not ...string) string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		var id string
		err := env.Store.DB().QueryRow("SELECT id FROM deployments WHERE environment_id = ? AND status = 'network' ORDER BY created_at DESC LIMIT 1", environment).Scan(&id)
		if err == nil && !contains(not, id) {
			return id
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("no deployment of %s reached network", environment)
	return ""
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

type result struct {
	code        int
	out, errOut string
}

func runAsync(t *testing.T, args ...string) <-chan result {
	ch := make(chan result, 1)
	go func() {
		code, out, errOut := run(t, args...)
		ch <- result{code, out, errOut}
	}()
	return ch
}

func await(t *testing.T, ch <-chan result) result {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(60 * time.Second):
		t.Fatal("the command did not finish within 60s")
	}
	return result{}
}

var create = []string{"deploy", "create", "--poll-interval", "20ms", "--workspace", "ws1", "--project", "p1", "--app", "a1"}

func TestDeployCreateWaitShowsProgressPerRegionAndExitsZeroWhenReady(t *testing.T) {
	env, clusters := deployEnv(t)
	ch := runAsync(t, append(create, "--environment", "prod", "--image", "registry.test/app:1", "--replicas", "2", "--env", "LOG=debug", "--wait")...)
	id := newDeployment(t, env, "prod")
	time.Sleep(150 * time.Millisecond)
	clusters["eu"].Report(t, id, ctrltest.Running("a-0"), ctrltest.Pending("a-1", "ContainerCreating"))
	time.Sleep(150 * time.Millisecond)
	clusters["eu"].ReportRunning(t, id, 2)
	time.Sleep(150 * time.Millisecond)
	clusters["us"].ReportRunning(t, id, 2)
	r := await(t, ch)
	if r.code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.out, r.errOut)
	}
	for _, want := range []string{
		"deployment " + id + " created; following it",
		"] network    eu 0/2 running | us 0/2 running\n",
		"] network    eu 1/2 running, 1 pending | us 0/2 running\n",
		"] network    eu 2/2 running | us 0/2 running\n",
		"] ready      eu 2/2 running | us 2/2 running\n",
	} {
		if !strings.Contains(r.out, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	if !regexp.MustCompile(`deployment ` + id + ` is ready after [0-9.]+m?s: eu 2/2, us 2/2; live\n$`).MatchString(r.out) {
		t.Errorf("output does not end with the summary")
	}
	if t.Failed() {
		t.Fatalf("stdout:\n%s", r.out)
	}
	t.Logf("ctrl deploy create --wait printed:\n%s", r.out)

	// get (text and JSON), list (JSON).
	code, out, errOut := run(t, "deploy", "get", id)
	if code != 0 || !strings.Contains(out, "Status:       ready") || !strings.Contains(out, "Env:          LOG") || !strings.Contains(out, ctrltest.K8sName(id)+"-eu-0  running") {
		t.Fatalf("deploy get: %d\n%s%s", code, out, errOut)
	}
	// The history, oldest first, with what the deploy noted.
	if !regexp.MustCompile(`(?s)\S+\s+pending\s+created by .*\S+\s+deploying\s.*\S+\s+network\s.*\S+\s+ready\s+promoted: the environment's live deployment`).MatchString(out) {
		t.Fatalf("deploy get shows no history:\n%s", out)
	}
	code, out, _ = run(t, "deploy", "list", "--environment", "prod", "-o", "json")
	var list struct {
		Deployments []struct {
			ID     string `json:"id"`
			Status string `json:"status"`
			Live   bool   `json:"live"`
		} `json:"deployments"`
	}
	if err := json.Unmarshal([]byte(out), &list); code != 0 || err != nil || len(list.Deployments) != 1 ||
		list.Deployments[0].ID != id || list.Deployments[0].Status != "DEPLOYMENT_STATUS_READY" || !list.Deployments[0].Live {
		t.Fatalf("deploy list -o json: %d %v\n%s", code, err, out)
	}
}

func TestDeployCreateWaitExitsNonZeroWithTheReasonOnFailure(t *testing.T) {
	env, clusters := deployEnv(t)
	ch := runAsync(t, append(create, "--environment", "prod", "--image", "registry.test/app:missing", "--region", "eu", "--wait")...)
	id := newDeployment(t, env, "prod")
	clusters["eu"].Report(t, id, ctrltest.Failed("web-0", "ImagePullBackOff", "Back-off pulling image"))
	r := await(t, ch)
	want := "ctrl: deployment " + id + " failed: region eu: 0/1 running: pod web-0 ImagePullBackOff: Back-off pulling image\n"
	if r.code == 0 || r.errOut != want || !strings.Contains(r.out, "] failed     eu 0/1 running, 1 failed (stopped)  region eu") {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr: %q\nwant stderr %q", r.code, r.out, r.errOut, want)
	}
}

func TestDeployJSONOutputParsesAndRollbackPromoteStopWork(t *testing.T) {
	env, clusters := deployEnv(t)
	deployJSON := func(image string, not ...string) map[string]any {
		t.Helper()
		ch := runAsync(t, append(create, "--environment", "stage", "--image", image, "--region", "us", "--wait", "-o", "json")...)
		id := newDeployment(t, env, "stage", not...)
		clusters["us"].ReportRunning(t, id, 1)
		r := await(t, ch)
		var doc map[string]any
		if err := json.Unmarshal([]byte(r.out), &doc); r.code != 0 || err != nil || doc["id"] != id || doc["status"] != "DEPLOYMENT_STATUS_READY" {
			t.Fatalf("create -o json: exit %d, %v\nstdout:\n%s\nstderr:\n%s", r.code, err, r.out, r.errOut)
		}
		if !strings.Contains(r.errOut, "] ready") {
			t.Fatalf("with -o json, progress goes to stderr: %q", r.errOut)
		}
		return doc
	}
	v1 := deployJSON("registry.test/app:1")["id"].(string)
	v2 := deployJSON("registry.test/app:2", v1)["id"].(string)

	if code, out, errOut := run(t, "deploy", "promote", v2); code != 0 || out != "deployment "+v2+" promoted\n" {
		t.Fatalf("promote: %d %q %q", code, out, errOut)
	}
	ch := runAsync(t, "deploy", "rollback", "--environment", "stage", "--wait", "--poll-interval", "20ms")
	v3 := newDeployment(t, env, "stage", v1, v2)
	clusters["us"].ReportRunning(t, v3, 1)
	if r := await(t, ch); r.code != 0 || !strings.Contains(r.out, "deployment "+v3+" is ready") || !strings.HasSuffix(r.out, "; live\n") {
		t.Fatalf("rollback --wait: %d\n%s%s", r.code, r.out, r.errOut)
	}
	code, out, _ := run(t, "deploy", "get", v3, "-o", "json")
	var doc map[string]any
	if err := json.Unmarshal([]byte(out), &doc); code != 0 || err != nil || doc["image"] != "registry.test/app:1" || doc["rolledBackFrom"] != v2 {
		t.Fatalf("get -o json of the rollback: %d %v\n%s", code, err, out)
	}
	// Scale with --wait: follows until the region runs the new count.
	ch = runAsync(t, "deploy", "scale", v3, "--replicas", "3", "--wait", "--poll-interval", "20ms")
	waitDesired(t, env, v3, 3)
	clusters["us"].ReportRunning(t, v3, 3)
	if r := await(t, ch); r.code != 0 || !strings.Contains(r.out, "scaled from 1 to 3 replicas per region") || !strings.Contains(r.out, "deployment "+v3+" is ready") ||
		!strings.Contains(r.out, "us 3/3") {
		t.Fatalf("scale --wait: %d\n%s%s", r.code, r.out, r.errOut)
	}
	if code, _, errOut := run(t, "deploy", "scale", v3, "--replicas", "0"); code == 0 || !strings.Contains(errOut, "replicas: must be greater than or equal to 1") {
		t.Fatalf("scale to 0: %d %q", code, errOut)
	}
	if code, out, errOut := run(t, "deploy", "stop", v3, "-o", "json"); code != 0 || json.Unmarshal([]byte(out), &doc) != nil || doc["result"] != "stopped" {
		t.Fatalf("stop -o json: %d %q %q", code, out, errOut)
	}
	if code, _, errOut := run(t, "deploy", "promote", v3); code == 0 || !strings.Contains(errOut, "only a ready deployment can be promoted") {
		t.Fatalf("promote a stopped deployment: %d %q", code, errOut)
	}
}

// waitDesired waits until ctrl wants replicas of the deployment in every
// region it runs in.
func waitDesired(t *testing.T, env *ctrltest.Env, id string, replicas int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		var n int
		err := env.Store.DB().QueryRow("SELECT COUNT(*) FROM deployment_topology WHERE deployment_id = ? AND desired_status = 'running' AND desired_replicas <> ?", id, replicas).Scan(&n)
		if err == nil && n == 0 {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("deployment %s was not scaled to %d", id, replicas)
}

func TestDeployCLIErrorsSayWhatToDo(t *testing.T) {
	env, _ := deployEnv(t)
	if code, _, errOut := run(t, append(create, "--environment", "prod", "--image", "Bad Image")...); code == 0 || !strings.Contains(errOut, "image: ") {
		t.Fatalf("bad image: %d %q", code, errOut)
	}
	if code, _, errOut := run(t, append(create, "--environment", "prod")...); code == 0 || !strings.Contains(errOut, "--image, or \"image\" in --workload") {
		t.Fatalf("no image: %d %q", code, errOut)
	}
	bad := filepath.Join(t.TempDir(), "workload.json")
	if err := os.WriteFile(bad, []byte(`{"image": "registry.test/app:1", "no_such_field": 1}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, _, errOut := run(t, append(create, "--environment", "prod", "--workload", bad)...); code == 0 || !strings.Contains(errOut, "is not a workload as JSON") {
		t.Fatalf("a workload file with an unknown field: %d %q", code, errOut)
	}
	t.Setenv("CTRL_TOKEN", "")
	if code, _, errOut := run(t, "deploy", "list", "--environment", "prod"); code == 0 || !strings.Contains(errOut, "CTRL_TOKEN") {
		t.Fatalf("no token: %d %q", code, errOut)
	}
	t.Setenv("CTRL_TOKEN", env.ClusterToken(t, "eu", "eu-9"))
	if code, _, errOut := run(t, "deploy", "list", "--environment", "prod"); code == 0 || !strings.Contains(errOut, "operator token") {
		t.Fatalf("cluster token: %d %q", code, errOut)
	}
}

func TestRestateRegisterCommandIsIdempotent(t *testing.T) {
	env, _ := deployEnv(t)
	r := testenv.SharedRestate(t)
	url := env.Server.RestateEndpointURL()
	code, out, errOut := run(t, "restate", "register", "--restate-admin-url", r.AdminURL(), "--restate-endpoint-url", url)
	if code != 0 || !strings.HasPrefix(out, "unchanged "+url) {
		t.Fatalf("restate register after ctrl registered itself: %d %q %q", code, out, errOut)
	}
	code, out, errOut = run(t, "restate", "register", "--restate-admin-url", r.AdminURL(), "--restate-endpoint-url", url, "--force")
	if code != 0 || !strings.HasPrefix(out, "forced "+url) {
		t.Fatalf("restate register --force: %d %q %q", code, out, errOut)
	}
}

// TestDeployCreateTakesAWorkloadFile: --workload sets the workload from a
// file (every field, including those no flag sets), and a flag given wins
// over the file.
func TestDeployCreateTakesAWorkloadFile(t *testing.T) {
	env, _ := deployEnv(t)
	file := filepath.Join(t.TempDir(), "workload.json")
	if err := os.WriteFile(file, []byte(`{"image": "registry.test/app:1", "port": 9000, "command": ["/app", "serve"]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := run(t, append(create, "--environment", "wl", "--region", "eu", "--workload", file, "--image", "registry.test/app:2")...)
	if code != 0 {
		t.Fatalf("create --workload: %d %q", code, errOut)
	}
	d, err := env.Deployments(t).GetDeployment(context.Background(), &ctrlv1.GetDeploymentRequest{DeploymentId: strings.TrimSpace(out)})
	if err != nil {
		t.Fatal(err)
	}
	if w := d.GetWorkload(); w.GetImage() != "registry.test/app:2" || w.GetPort() != 9000 || strings.Join(w.GetCommand(), " ") != "/app serve" {
		t.Fatalf("the workload created from the file and --image: %v", w)
	}
}
