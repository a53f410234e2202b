package cli_test

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	"krane.dev/ctrl/internal/ctrltest"
	"krane.dev/ctrl/rules"
)

const (
	sentinelV1 = "registry.test/krane/sentinel:1.0.0"
	sentinelV2 = "registry.test/krane/sentinel:2.0.0"
	sentinelV3 = "registry.test/krane/sentinel:3.0.0"
)

// sentinelEnv is a ctrl on a Restate of its own (the rollout is a
// singleton), a fake sentinel cluster in eu with n converged sentinels, and
// CTRL_ADDR / CTRL_TOKEN set for the CLI.
func sentinelEnv(t *testing.T, n int) (*ctrltest.Env, *ctrltest.SentinelCluster, []string) {
	t.Helper()
	env := ctrltest.Start(t, ctrltest.Options{Restate: ctrltest.FreshRestate(t)})
	eu := env.SentinelCluster(t, "eu", "eu-1")
	ids := env.CreateSentinels(t, "eu", "sen", sentinelV1, n)
	for _, id := range ids {
		deadline := time.Now().Add(30 * time.Second)
		for {
			r, err := env.Store.GetSentinel(t.Context(), id)
			if err == nil && rules.SentinelConverged(r) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("sentinel %s did not converge", id)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	t.Setenv("CTRL_ADDR", env.Server.GRPCAddr())
	t.Setenv("CTRL_TOKEN", env.OperatorToken(t, "cli test"))
	return env, eu, ids
}

func TestRolloutCommands(t *testing.T) {
	_, eu, ids := sentinelEnv(t, 10)

	if code, out, errOut := run(t, "rollout", "status"); code != 0 || !strings.Contains(out, "Rollout:  none yet (idle)") {
		t.Fatalf("status before any rollout: %d %q %q", code, out, errOut)
	}

	// start --watch: waves of 2, 4 and 4; one sentinel of wave 2 cannot run
	// the image, so the rollout pauses there: exit status 2.
	eu.Break(ids[3], sentinelV2, "pod sen-003-x cannot pull image")
	r := await(t, runAsync(t, "rollout", "start", "--image", sentinelV2, "--waves", "20,60,100", "--deploy-timeout", "2s", "--watch", "--poll-interval", "20ms"))
	if r.code != 2 {
		t.Fatalf("start --watch: exit %d, want 2 (paused)\nstdout:\n%s\nstderr:\n%s", r.code, r.out, r.errOut)
	}
	for _, want := range []string{
		"] in_progress   wave 1/3  ready 0/10, failed 0  | w1 0/2 in_progress | w2 0/4 pending | w3 0/4 pending\n",
		"] in_progress   wave 2/3  ready 2/10, failed 0  | w1 2/2 completed | w2 0/4 in_progress | w3 0/4 pending\n",
		"] paused        wave 2/3  ready 5/10, failed 1  | w1 2/2 completed | w2 3/4 failed | w3 0/4 pending\n",
		"Failed:    sen-003\n",
		"2     60%    4     3      1       failed     [###############xxxxx]\n",
		"3     100%   4     0      0       pending    [....................]\n",
	} {
		if !strings.Contains(r.out, want) {
			t.Errorf("start --watch output lacks %q", want)
		}
	}
	if !regexp.MustCompile(`^ctrl: rollout r1-[0-9a-f]{6} is paused: paused at wave 2/3: 1 sentinels failed \(sen-003\)`).MatchString(r.errOut) {
		t.Errorf("start --watch stderr: %q", r.errOut)
	}
	if t.Failed() {
		t.Fatalf("stdout:\n%s", r.out)
	}
	t.Logf("ctrl rollout start --watch printed:\n%s", r.out)

	// status: text and JSON; exit status 2 while paused.
	code, out, _ := run(t, "rollout", "status", "-o", "json")
	var doc struct {
		State     string   `json:"state"`
		Run       string   `json:"run"`
		FailedIDs []string `json:"failedIds"`
		Waves     []struct {
			Size  int    `json:"size"`
			State string `json:"state"`
		} `json:"waves"`
	}
	if err := json.Unmarshal([]byte(out), &doc); code != 2 || err != nil || doc.State != "paused" || len(doc.FailedIDs) != 1 || doc.FailedIDs[0] != "sen-003" ||
		len(doc.Waves) != 3 || doc.Waves[1].State != "failed" || doc.Waves[2].Size != 4 {
		t.Fatalf("status -o json: exit %d, %v\n%s", code, err, out)
	}

	// Invalid calls: exit 1 with the service's explanation.
	if code, _, errOut := run(t, "rollout", "start", "--image", sentinelV3); code != 1 || !strings.Contains(errOut, "is paused") {
		t.Fatalf("start while paused: %d %q", code, errOut)
	}
	if code, _, errOut := run(t, "rollout", "start", "--image", sentinelV3, "--waves", "10,50"); code != 1 ||
		!strings.Contains(errOut, "wave_percentages: the last percentage is 50, not 100") {
		t.Fatalf("start with bad waves: %d %q", code, errOut)
	}

	// cancel works (exit 0); status then says cancelled (exit 3).
	if code, out, errOut := run(t, "rollout", "cancel"); code != 0 || !strings.Contains(out, "(cancelled)") || !strings.Contains(out, "skipped") {
		t.Fatalf("cancel: %d %q %q", code, out, errOut)
	}
	if code, _, errOut := run(t, "rollout", "status"); code != 3 || !strings.Contains(errOut, "is cancelled: cancelled at wave 2/3") {
		t.Fatalf("status when cancelled: %d %q", code, errOut)
	}
	if code, _, errOut := run(t, "rollout", "resume"); code != 1 || !strings.Contains(errOut, "only a paused rollout can be resumed") {
		t.Fatalf("resume when cancelled: %d %q", code, errOut)
	}

	// rollback: the six touched sentinels go back (the broken one too).
	code, out, errOut := run(t, "rollout", "rollback", "--poll-interval", "20ms")
	if code != 0 || !regexp.MustCompile(`rolled back after [0-9.]+m?s: 6 of 6 touched sentinels are on their previous image again\n$`).MatchString(out) {
		t.Fatalf("rollback: %d %q %q", code, out, errOut)
	}

	// A new rollout, followed as JSON: completed, exit 0.
	eu.Fix(ids[3])
	r = await(t, runAsync(t, "rollout", "start", "--image", sentinelV2, "--watch", "--poll-interval", "20ms", "-o", "json"))
	if err := json.Unmarshal([]byte(r.out), &doc); r.code != 0 || err != nil || doc.State != "completed" || !strings.HasPrefix(doc.Run, "r2-") {
		t.Fatalf("start --watch -o json: exit %d, %v\nstdout:\n%s\nstderr:\n%s", r.code, err, r.out, r.errOut)
	}
	if !strings.Contains(r.errOut, "] completed") {
		t.Fatalf("with -o json the progress goes to stderr: %q", r.errOut)
	}
	if code, _, errOut := run(t, "rollout", "rollback"); code != 1 || !strings.Contains(errOut, "only a paused or cancelled rollout can be rolled back; rollout r2-") {
		t.Fatalf("rollback of a completed rollout: %d %q", code, errOut)
	}
}

func TestSentinelCommands(t *testing.T) {
	_, eu, ids := sentinelEnv(t, 3)

	code, out, _ := run(t, "sentinel", "list", "-o", "json")
	var list struct {
		Sentinels []struct {
			ID     string `json:"id"`
			Health string `json:"health"`
		} `json:"sentinels"`
	}
	if err := json.Unmarshal([]byte(out), &list); code != 0 || err != nil || len(list.Sentinels) != 3 || list.Sentinels[0].ID != ids[0] ||
		list.Sentinels[0].Health != "HEALTH_HEALTHY" {
		t.Fatalf("sentinel list -o json: %d %v\n%s", code, err, out)
	}
	code, out, _ = run(t, "sentinel", "list", "--region", "eu")
	if lines := strings.Split(strings.TrimSpace(out), "\n"); code != 0 || len(lines) != 4 ||
		strings.Join(strings.Fields(lines[3]), " ") != ids[2]+" eu env-"+ids[2]+" "+sentinelV1+" 2/2 healthy idle" {
		t.Fatalf("sentinel list:\n%s", out)
	}

	// deploy --wait follows the sentinel and exits 0 when it is ready.
	code, out, errOut := run(t, "sentinel", "deploy", ids[0], "--image", sentinelV2, "--replicas", "3", "--wait", "--poll-interval", "20ms")
	if code != 0 || !regexp.MustCompile(`sentinel `+ids[0]+` is ready after [0-9.]+m?s: `+regexp.QuoteMeta(sentinelV2)+`, 3/3 available, version \d+\n$`).MatchString(out) {
		t.Fatalf("deploy --wait: %d\n%s%s", code, out, errOut)
	}
	if !strings.Contains(out, "] idle         healthy") && !strings.Contains(out, "] progressing  healthy") && !strings.Contains(out, "] ready        healthy") {
		t.Fatalf("deploy --wait shows no progress line:\n%s", out)
	}
	code, out, _ = run(t, "sentinel", "get", ids[0])
	if code != 0 || !strings.Contains(out, "Image:                "+sentinelV2) || !strings.Contains(out, "Deploy:               ready") ||
		!strings.Contains(out, "Size:                 3 replicas, 250m CPU, 256 MiB") {
		t.Fatalf("sentinel get:\n%s", out)
	}

	// A broken image: exit 1, with the reason.
	eu.Break(ids[1], sentinelV3, "pod sen-001-x cannot pull image")
	code, out, errOut = run(t, "sentinel", "deploy", ids[1], "--image", sentinelV3, "--timeout", "2s", "--wait", "--poll-interval", "20ms", "-o", "json")
	var resp struct {
		Result  string `json:"result"`
		Message string `json:"message"`
	}
	if err := json.Unmarshal([]byte(out), &resp); code != 1 || err != nil || resp.Result != "failed" ||
		!strings.Contains(errOut, "ctrl: sentinel "+ids[1]+" failed: timed out after 2s") || !strings.Contains(errOut, "cannot pull image") {
		t.Fatalf("deploy of a broken image: %d %v\nstdout:\n%s\nstderr:\n%s", code, err, out, errOut)
	}
	// Without --wait: started, progressing.
	if code, out, errOut := run(t, "sentinel", "deploy", ids[2], "--cpu", "500"); code != 0 || !strings.Contains(out, "sentinel "+ids[2]+": ") {
		t.Fatalf("deploy without --wait: %d %q %q", code, out, errOut)
	}
	if code, _, errOut := run(t, "sentinel", "deploy", "sen-nope", "--image", sentinelV2); code != 1 || !strings.Contains(errOut, `no sentinel "sen-nope"`) {
		t.Fatalf("deploy of an unknown sentinel: %d %q", code, errOut)
	}

	// stop: stopped at a new version; again: nothing to do; deploy starts
	// it again.
	if code, out, errOut := run(t, "sentinel", "stop", ids[0]); code != 0 ||
		!regexp.MustCompile(`^sentinel `+ids[0]+` stopped at version \d+; its cluster in eu deletes its objects\n$`).MatchString(out) {
		t.Fatalf("sentinel stop: %d %q %q", code, out, errOut)
	}
	if code, out, _ := run(t, "sentinel", "get", ids[0]); code != 0 || !strings.Contains(out, "Desired state:        stopped") {
		t.Fatalf("sentinel get after stop:\n%s", out)
	}
	if code, out, errOut := run(t, "sentinel", "stop", ids[0]); code != 0 || !strings.Contains(out, "sentinel "+ids[0]+" was already stopped") {
		t.Fatalf("second sentinel stop: %d %q %q", code, out, errOut)
	}
	if code, _, errOut := run(t, "sentinel", "stop", "sen-nope"); code != 1 || !strings.Contains(errOut, `no sentinel "sen-nope"`) {
		t.Fatalf("stop of an unknown sentinel: %d %q", code, errOut)
	}
	if code, out, errOut := run(t, "sentinel", "deploy", ids[0], "--wait", "--poll-interval", "20ms"); code != 0 || !strings.Contains(out, "sentinel "+ids[0]+" is ready") {
		t.Fatalf("deploy of a stopped sentinel: %d\n%s%s", code, out, errOut)
	}
	if code, out, _ := run(t, "sentinel", "get", ids[0]); code != 0 || !strings.Contains(out, "Desired state:        running") {
		t.Fatalf("sentinel get after the deploy:\n%s", out)
	}
}
