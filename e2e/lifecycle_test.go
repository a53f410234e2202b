package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"krane.dev/internal/stack"
)

// ctrlRun runs the ctrl CLI against the stack (at addr when not empty) and
// returns its exit status, standard output and standard error.
func ctrlRun(t *testing.T, st *stack.Stack, addr string, args ...string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := st.CtrlCommand(ctx, args...)
	if addr != "" {
		cmd.Env = append(cmd.Env, "CTRL_ADDR="+addr)
	}
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		return ee.ExitCode(), out.String(), errOut.String()
	case err != nil:
		t.Fatalf("ctrl %s: %v", strings.Join(args, " "), err)
	}
	return 0, out.String(), errOut.String()
}

// ctrlJSON runs a ctrl command with -o json that must succeed and decodes
// its output (protobuf JSON: camelCase names, zero values left out).
func ctrlJSON(t *testing.T, st *stack.Stack, addr string, args ...string) map[string]any {
	t.Helper()
	code, out, errOut := ctrlRun(t, st, addr, append(args, "-o", "json")...)
	var doc map[string]any
	if err := json.Unmarshal([]byte(out), &doc); code != 0 || err != nil {
		t.Fatalf("ctrl %s: exit %d, %v\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), code, err, out, errOut)
	}
	return doc
}

// deployReady creates a deployment in both regions with --wait and returns
// its id once ctrl says it is ready.
func deployReady(t *testing.T, st *stack.Stack, addr, environment, image string, replicas int) string {
	t.Helper()
	doc := ctrlJSON(t, st, addr, "deploy", "create", "--workspace", "e2e", "--project", "p", "--app", "a", "--environment", environment,
		"--image", image, "--replicas", fmt.Sprint(replicas), "--region", "local-a,local-b", "--wait")
	if doc["status"] != "DEPLOYMENT_STATUS_READY" {
		t.Fatalf("deploy of %s: %v", image, doc)
	}
	return doc["id"].(string)
}

// waitPods waits until each region runs exactly n pods of the deployment
// (none left deleting), all of image.
func waitPods(t *testing.T, st *stack.Stack, id, image string, n int) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		var problems []string
		for region, c := range st.Clusters {
			list, err := c.Client.CoreV1().Pods("").List(context.Background(), metav1.ListOptions{LabelSelector: "unkey.com/deployment.id=" + id})
			if err != nil {
				t.Fatal(err)
			}
			runningN := 0
			for _, p := range list.Items {
				if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil && p.Spec.Containers[0].Image == image {
					runningN++
				}
			}
			if runningN != n || len(list.Items) != n {
				problems = append(problems, fmt.Sprintf("%s runs %d of %d pods (%d exist)", region, runningN, n, len(list.Items)))
			}
		}
		if len(problems) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("deployment %s: %s", id, strings.Join(problems, "; "))
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// TestDeployScaleRollbackStop walks one app through its life on both
// clusters with the CLI: deploy, scale, a second release, promote, roll
// back, stop; every step is checked in the clusters, not only in ctrl.
func TestDeployScaleRollbackStop(t *testing.T) {
	st := sharedStack(t)
	const environment = "e2e-lifecycle"
	imageV1, imageV2 := "registry.local/e2e/lifecycle:1", "registry.local/e2e/lifecycle:2"

	v1 := deployReady(t, st, "", environment, imageV1, 1)
	waitPods(t, st, v1, imageV1, 1)

	code, out, errOut := ctrlRun(t, st, "", "deploy", "scale", v1, "--replicas", "3", "--wait")
	if code != 0 || !strings.Contains(out, "scaled from 1 to 3 replicas per region") || !strings.Contains(out, "local-a 3/3, local-b 3/3") {
		t.Fatalf("scale --wait: exit %d\n%s%s", code, out, errOut)
	}
	waitPods(t, st, v1, imageV1, 3)

	v2 := deployReady(t, st, "", environment, imageV2, 1)
	waitPods(t, st, v2, imageV2, 1)
	if code, out, errOut := ctrlRun(t, st, "", "deploy", "promote", v2); code != 0 {
		t.Fatalf("promote: exit %d\n%s%s", code, out, errOut)
	}

	// The rollback restores v1's configuration as it is now: scaled to 3.
	rb := ctrlJSON(t, st, "", "deploy", "rollback", "--environment", environment, "--wait")
	v3, _ := rb["id"].(string)
	if v3 == "" || v3 == v1 || rb["image"] != imageV1 || rb["rolledBackFrom"] != v2 || rb["live"] != true || rb["replicas"] != float64(3) {
		t.Fatalf("rollback: %v; want a new live deployment of %s with 3 replicas, rolled back from %s", rb, imageV1, v2)
	}
	waitPods(t, st, v3, imageV1, 3)

	if code, out, errOut := ctrlRun(t, st, "", "deploy", "stop", v2); code != 0 {
		t.Fatalf("stop: exit %d\n%s%s", code, out, errOut)
	}
	waitPods(t, st, v2, imageV2, 0)
	// The ReplicaSets go too (a foreground delete may outlive its pods).
	deadline := time.Now().Add(60 * time.Second)
	for region, c := range st.Clusters {
		for {
			rs, err := c.Client.AppsV1().ReplicaSets("").List(context.Background(), metav1.ListOptions{LabelSelector: "unkey.com/deployment.id=" + v2})
			if err != nil {
				t.Fatal(err)
			}
			if len(rs.Items) == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s keeps %d ReplicaSets of stopped %s", region, len(rs.Items), v2)
			}
			time.Sleep(250 * time.Millisecond)
		}
	}
	// What stayed is untouched by the stop.
	waitPods(t, st, v3, imageV1, 3)
}

// sentinelImages maps each sentinel Deployment (region/name) to its image.
func sentinelImages(t *testing.T, st *stack.Stack) map[string]string {
	t.Helper()
	out := map[string]string{}
	for region, c := range st.Clusters {
		list, err := c.Client.AppsV1().Deployments("sentinel").List(context.Background(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=sentinel"})
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range list.Items {
			out[region+"/"+d.Name] = d.Spec.Template.Spec.Containers[0].Image
		}
	}
	return out
}

// TestSentinelRolloutPausesOnAFailingImageAndRollsBack: a fleet rollout of
// an image whose pods crash-loop fails its first wave and pauses there (the
// second wave never starts); rolling back puts every touched sentinel back
// on its previous image in the clusters.
func TestSentinelRolloutPausesOnAFailingImageAndRollsBack(t *testing.T) {
	st := sharedStack(t)
	// An environment of its own gives the fleet at least one sentinel per
	// region, whatever ran before.
	deployReady(t, st, "", "e2e-rollout", "registry.local/e2e/rollout:1", 1)
	before := sentinelImages(t, st)
	if len(before) < 2 {
		t.Fatalf("want a sentinel per region before the rollout, found %v", before)
	}
	const failing = "registry.local/krane/sentinel:kwok-crash-loop"

	begin := time.Now()
	code, out, errOut := ctrlRun(t, st, "", "rollout", "start", "--image", failing, "--waves", "50,100", "--deploy-timeout", "20s", "--watch", "--poll-interval", "200ms")
	if code != 2 || !strings.Contains(errOut+out, "paused") {
		t.Fatalf("rollout of a crash-looping image: exit %d (want 2, paused)\n%s%s", code, out, errOut)
	}
	t.Logf("rollout paused %s after it started", time.Since(begin).Round(100*time.Millisecond))
	// status exits 2 while the rollout is paused, and still prints it.
	code, out, errOut = ctrlRun(t, st, "", "rollout", "status", "-o", "json")
	var status map[string]any
	if err := json.Unmarshal([]byte(out), &status); code != 2 || err != nil || status["state"] != "paused" {
		t.Fatalf("rollout status: exit %d (want 2), %v\n%s%s", code, err, out, errOut)
	}
	during := sentinelImages(t, st)
	touched := 0
	for k, img := range during {
		if img == failing {
			touched++
		} else if img != before[k] {
			t.Errorf("sentinel %s runs %s during the paused rollout, want %s or %s", k, img, before[k], failing)
		}
	}
	if touched == 0 || touched > (len(before)+1)/2 {
		t.Fatalf("%d of %d sentinels got the failing image; want the first wave only (50%%)", touched, len(before))
	}

	code, out, errOut = ctrlRun(t, st, "", "rollout", "rollback", "--poll-interval", "200ms")
	if code != 0 || !strings.Contains(out, "rolled back") {
		t.Fatalf("rollout rollback: exit %d\n%s%s", code, out, errOut)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		after := sentinelImages(t, st)
		var wrong []string
		for k, img := range before {
			if after[k] != img {
				wrong = append(wrong, fmt.Sprintf("%s runs %s, want %s", k, after[k], img))
			}
		}
		if len(wrong) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the rollback: %s", strings.Join(wrong, "; "))
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// streamsOn sums ctrl's open desired-state streams of a region.
func streamsOn(t *testing.T, httpURL, region string) float64 {
	t.Helper()
	resp, err := http.Get(httpURL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	sum := 0.0
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, "krane_ctrl_watch_streams_active{") && strings.Contains(line, `region="`+region+`"`) {
			var v float64
			fmt.Sscanf(line[strings.LastIndexByte(line, ' ')+1:], "%g", &v)
			sum += v
		}
	}
	return sum
}

// TestKraneOnAnyCtrlReplicaGetsEveryChange: with two ctrl processes on one
// MySQL and one Restate, local-b's krane talks to the second while the
// first serves local-a's. Changes made through either ctrl reach both
// clusters, and status reported to either completes the deploy.
func TestKraneOnAnyCtrlReplicaGetsEveryChange(t *testing.T) {
	st := sharedStack(t)
	ctx := context.Background()
	replica, err := st.StartCtrlReplica("ctrl-2")
	if err != nil {
		t.Fatal(err)
	}
	original := st.KraneEnv("local-b")
	st.SetKraneEnv("local-b", append(append([]string{}, original...), "KRANE_CONTROL_PLANE__URL=http://"+replica.Addr))
	if err := st.RestartKrane(ctx, "local-b", false); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		st.SetKraneEnv("local-b", original)
		if err := st.RestartKrane(ctx, "local-b", false); err != nil {
			t.Errorf("give local-b back to the first ctrl: %v", err)
		}
		replica.Stop()
	})
	deadline := time.Now().Add(30 * time.Second)
	for streamsOn(t, replica.HTTP, "local-b") == 0 {
		if time.Now().After(deadline) {
			t.Fatal("local-b's krane has no stream open on the second ctrl")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if n := streamsOn(t, replica.HTTP, "local-a"); n != 0 {
		t.Fatalf("local-a has %v streams on the second ctrl, want none", n)
	}

	const environment = "e2e-replicas"
	image := "registry.local/e2e/replicas:1"
	// Written through the first ctrl, run by both clusters; local-b's
	// status goes through the second ctrl and still completes the deploy.
	viaFirst := deployReady(t, st, "", environment, image, 1)
	waitPods(t, st, viaFirst, image, 1)
	// Written through the second ctrl: a deploy, then a scale, then a stop.
	viaSecond := deployReady(t, st, replica.Addr, environment, "registry.local/e2e/replicas:2", 1)
	waitPods(t, st, viaSecond, "registry.local/e2e/replicas:2", 1)
	if code, out, errOut := ctrlRun(t, st, replica.Addr, "deploy", "scale", viaFirst, "--replicas", "2", "--wait"); code != 0 {
		t.Fatalf("scale through the second ctrl: exit %d\n%s%s", code, out, errOut)
	}
	waitPods(t, st, viaFirst, image, 2)
	if code, out, errOut := ctrlRun(t, st, replica.Addr, "deploy", "stop", viaFirst); code != 0 {
		t.Fatalf("stop through the second ctrl: exit %d\n%s%s", code, out, errOut)
	}
	waitPods(t, st, viaFirst, image, 0)
	waitPods(t, st, viaSecond, "registry.local/e2e/replicas:2", 1)
}
