package workflows_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"krane.dev/ctrl/internal/ctrltest"
	"krane.dev/ctrl/serve"
	"krane.dev/ctrl/store"
	"krane.dev/internal/testenv"
	ctrlv1 "krane.dev/proto/krane/ctrl/v1"
)

// slackSink is a local Slack incoming webhook: it keeps every message's
// text in arrival order.
type slackSink struct {
	mu   sync.Mutex
	msgs []string
	srv  *httptest.Server
}

func newSlackSink(t *testing.T) *slackSink {
	s := &slackSink{}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var m struct {
			Text string `json:"text"`
		}
		if r.Method != http.MethodPost || r.Header.Get("Content-Type") != "application/json" || json.Unmarshal(body, &m) != nil || m.Text == "" {
			t.Errorf("slack webhook got %s %s %q", r.Method, r.Header.Get("Content-Type"), body)
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		s.mu.Lock()
		s.msgs = append(s.msgs, m.Text)
		s.mu.Unlock()
		_, _ = io.WriteString(w, "ok")
	}))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *slackSink) messages() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.msgs)
}

// expect checks the messages, in order, each against a substring.
func (s *slackSink) expect(t *testing.T, want ...string) {
	t.Helper()
	got := s.messages()
	ok := len(got) == len(want)
	for i := 0; ok && i < len(want); i++ {
		ok = strings.Contains(got[i], want[i])
	}
	if !ok {
		t.Fatalf("slack messages:\n  %s\nwant, in order, messages containing:\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
}

type rolloutEnv struct {
	env      *ctrltest.Env
	api      ctrlv1.RolloutServiceClient
	clusters map[string]*ctrltest.SentinelCluster
}

// newRolloutEnv is a ctrl on a Restate of the test's own (the rollout is a
// singleton) with fake sentinel clusters in eu and us.
func newRolloutEnv(t *testing.T) *rolloutEnv {
	env := ctrltest.Start(t, ctrltest.Options{Restate: ctrltest.FreshRestate(t)})
	return &rolloutEnv{env: env, api: env.Rollouts(t), clusters: map[string]*ctrltest.SentinelCluster{
		"eu": env.SentinelCluster(t, "eu", "eu-1"), "us": env.SentinelCluster(t, "us", "us-1"),
	}}
}

func (e *rolloutEnv) status(t *testing.T) *ctrlv1.RolloutStatus {
	t.Helper()
	st, err := e.api.GetRolloutStatus(context.Background(), &ctrlv1.GetRolloutStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// waitState polls the status until it is in state (and, if wave > 0, at
// that wave) and returns it.
func (e *rolloutEnv) waitState(t *testing.T, timeout time.Duration, state string, wave int32) *ctrlv1.RolloutStatus {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		// UNAVAILABLE says retry: Restate may be recovering (just
		// restarted), its partitions not yet taking invocations.
		st, err := e.api.GetRolloutStatus(context.Background(), &ctrlv1.GetRolloutStatusRequest{})
		if status.Code(err) == codes.Unavailable && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if st.GetState() == state && (wave == 0 || st.GetCurrentWave() == wave) {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("rollout: %s at wave %d (%s) after %s, want %s at wave %d", st.GetState(), st.GetCurrentWave(), st.GetMessage(), timeout, state, wave)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func waveSizes(st *ctrlv1.RolloutStatus) []int32 {
	var out []int32
	for _, w := range st.GetWaves() {
		out = append(out, w.GetSize())
	}
	return out
}

func waveStates(st *ctrlv1.RolloutStatus) []string {
	var out []string
	for _, w := range st.GetWaves() {
		out = append(out, w.GetState())
	}
	return out
}

type imageVersion struct {
	Image   string
	Version uint64
}

func sentinelRows(t *testing.T, st *store.Store) map[string]imageVersion {
	t.Helper()
	rows, err := st.DB().Query("SELECT id, image, version FROM sentinels")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]imageVersion{}
	for rows.Next() {
		var id string
		var iv imageVersion
		if err := rows.Scan(&id, &iv.Image, &iv.Version); err != nil {
			t.Fatal(err)
		}
		out[id] = iv
	}
	return out
}

// TestRolloutOf100Sentinels: waves of 1, 4, 20, 25 and 50; a sentinel of
// wave 3 cannot run the new image, so the rollout pauses with it failed; a
// retry fails again; Resume moves on to wave 4, where another one fails;
// RollbackAll then puts exactly the 50 touched sentinels (failed ones
// included) back on their previous image, with new versions, and leaves
// wave 5 alone. Slack receives every transition, in order.
func TestRolloutOf100Sentinels(t *testing.T) {
	e := newRolloutEnv(t)
	slack := newSlackSink(t)
	eu := e.env.CreateSentinels(t, "eu", "sen-eu", imgV1, 50) // waves 1-4, in id order
	us := e.env.CreateSentinels(t, "us", "sen-us", imgV1, 50) // wave 5
	all := append(slices.Clone(eu), us...)
	waitConverged(t, e.env.Store, all...)
	initial := sentinelRows(t, e.env.Store)
	badWave3, badWave4 := eu[10], eu[30]
	e.clusters["eu"].Break(badWave3, imgV2, "pod "+badWave3+"-x cannot pull image")
	e.clusters["eu"].Break(badWave4, imgV2, "pod "+badWave4+"-x is crash-looping")
	ctx := context.Background()
	timeline := []string{}
	begin := time.Now()
	mark := func(what string) {
		timeline = append(timeline, time.Since(begin).Round(10*time.Millisecond).String()+" "+what)
	}

	st, err := e.api.StartRollout(ctx, &ctrlv1.StartRolloutRequest{Image: imgV2, SlackWebhookUrl: slack.srv.URL, DeployTimeoutSeconds: 30})
	if err != nil {
		t.Fatal(err)
	}
	mark("started")
	if st.GetState() != "in_progress" || st.GetTotal() != 100 || !slices.Equal(waveSizes(st), []int32{1, 4, 20, 25, 50}) {
		t.Fatalf("started: %v", st)
	}
	st = e.waitState(t, 5*time.Minute, "paused", 3)
	mark("paused at wave 3")
	if !slices.Equal(st.GetFailedIds(), []string{badWave3}) || st.GetSucceeded() != 24 ||
		!slices.Equal(waveStates(st), []string{"completed", "completed", "failed", "pending", "pending"}) || st.GetWaves()[2].GetFailed() != 1 {
		t.Fatalf("paused at wave 3: %v", st)
	}

	// Another rollout may not start now; neither may a rollback of an
	// active one, or a resume of a running one.
	if _, err := e.api.StartRollout(ctx, &ctrlv1.StartRolloutRequest{Image: imgV3}); status.Code(err) != codes.FailedPrecondition ||
		!strings.Contains(err.Error(), "is paused") {
		t.Fatalf("a second rollout while paused: %v", err)
	}

	// Retrying the failed sentinel fails again (its image is still bad).
	if st, err = e.api.ResumeRollout(ctx, &ctrlv1.ResumeRolloutRequest{RetryFailed: true}); err != nil || st.GetState() != "in_progress" {
		t.Fatalf("resume with retry: %v, %v", st, err)
	}
	st = e.waitState(t, 5*time.Minute, "paused", 3)
	mark("retry failed, paused at wave 3 again")
	if !slices.Equal(st.GetFailedIds(), []string{badWave3}) {
		t.Fatalf("after the retry: %v", st)
	}

	// Resume moves past wave 3; wave 4 has its own bad sentinel.
	if _, err := e.api.ResumeRollout(ctx, &ctrlv1.ResumeRolloutRequest{}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.api.RollbackAll(ctx, &ctrlv1.RollbackAllRequest{}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("rollback while in progress: %v", err)
	}
	st = e.waitState(t, 5*time.Minute, "paused", 4)
	mark("paused at wave 4")
	if !slices.Equal(st.GetFailedIds(), []string{badWave3, badWave4}) || st.GetSucceeded() != 48 ||
		!slices.Equal(waveStates(st), []string{"completed", "completed", "failed", "failed", "pending"}) {
		t.Fatalf("paused at wave 4: %v", st)
	}
	forward := sentinelRows(t, e.env.Store)
	for _, id := range eu {
		if forward[id].Image != imgV2 || forward[id].Version <= initial[id].Version {
			t.Fatalf("after wave 4: %s is %+v, want %s at a new version", id, forward[id], imgV2)
		}
	}

	rb, err := e.api.RollbackAll(ctx, &ctrlv1.RollbackAllRequest{})
	if err != nil {
		t.Fatal(err)
	}
	mark("rolled back")
	if rb.GetReverted() != 50 || len(rb.GetFailedIds()) != 0 || rb.GetStatus().GetState() != "cancelled" || rb.GetStatus().GetRollbackTotal() != 50 {
		t.Fatalf("rollback: %v", rb)
	}
	after := sentinelRows(t, e.env.Store)
	for _, id := range eu { // touched: previous image, newer version
		if after[id].Image != imgV1 || after[id].Version <= forward[id].Version {
			t.Errorf("touched %s after the rollback: %+v, want %s at a version above %d", id, after[id], imgV1, forward[id].Version)
		}
	}
	for _, id := range us { // never touched: not even a new version
		if after[id] != initial[id] {
			t.Errorf("untouched %s after the rollback: %+v, want %+v", id, after[id], initial[id])
		}
	}
	waitConverged(t, e.env.Store, eu...)

	slack.expect(t,
		"started: image "+imgV2+" to 100 sentinels in 5 waves (1, 4, 20, 25, 50)",
		"wave 1/5 started: 1 sentinels",
		"wave 1/5 completed",
		"wave 2/5 started: 4 sentinels",
		"wave 2/5 completed",
		"wave 3/5 started: 20 sentinels",
		"paused: wave 3/5: 19 of 20 sentinels ready, 1 failed: "+badWave3,
		"resumed: retrying 1 failed sentinels: "+badWave3,
		"paused: wave 3/5: 19 of 20 sentinels ready, 1 failed",
		"resumed after wave 3/5",
		"wave 4/5 started: 25 sentinels",
		"paused: wave 4/5: 24 of 25 sentinels ready, 1 failed",
		"rollback started: 50 touched sentinels",
		"rollback completed: rolled back: 50 of 50",
	)
	t.Logf("timeline (deploy timeout 30s):\n  %s", strings.Join(timeline, "\n  "))
	t.Logf("slack messages:\n  %s", strings.Join(slack.messages(), "\n  "))
}

// TestRolloutCompletes: the whole fleet, every wave, completed; a second
// rollout of the same image has nothing to do; bad requests are refused
// with the field named.
func TestRolloutCompletes(t *testing.T) {
	e := newRolloutEnv(t)
	ids := e.env.CreateSentinels(t, "eu", "sen", imgV1, 100)
	waitConverged(t, e.env.Store, ids...)
	ctx := context.Background()
	begin := time.Now()
	if _, err := e.api.StartRollout(ctx, &ctrlv1.StartRolloutRequest{Image: imgV2}); err != nil {
		t.Fatal(err)
	}
	st := e.waitState(t, 5*time.Minute, "completed", 0)
	took := time.Since(begin)
	if st.GetSucceeded() != 100 || st.GetFailed() != 0 || !slices.Equal(waveStates(st), []string{"completed", "completed", "completed", "completed", "completed"}) {
		t.Fatalf("completed: %v", st)
	}
	for id, r := range sentinelRows(t, e.env.Store) {
		if r.Image != imgV2 {
			t.Fatalf("%s on %s after the rollout", id, r.Image)
		}
	}
	t.Logf("rollout of 100 sentinels in 5 waves: %s (%.0f ms per wave)", took.Round(time.Millisecond), float64(took.Milliseconds())/5)

	st, err := e.api.StartRollout(ctx, &ctrlv1.StartRolloutRequest{Image: imgV2})
	if err != nil || st.GetState() != "completed" || st.GetTotal() != 0 || !strings.Contains(st.GetMessage(), "nothing to do") {
		t.Fatalf("a rollout with nothing to do: %v, %v", st, err)
	}
	for _, c := range []struct {
		req  *ctrlv1.StartRolloutRequest
		want string
	}{
		{&ctrlv1.StartRolloutRequest{}, "image"},
		{&ctrlv1.StartRolloutRequest{Image: imgV3, WavePercentages: []int32{10, 50}}, "the last percentage is 50, not 100"},
		{&ctrlv1.StartRolloutRequest{Image: imgV3, WavePercentages: []int32{50, 20, 100}}, "wave_percentages[1]"},
		{&ctrlv1.StartRolloutRequest{Image: imgV3, WavePercentages: []int32{0, 100}}, "wave_percentages[0]: must be greater than or equal to 1"},
		{&ctrlv1.StartRolloutRequest{Image: imgV3, SlackWebhookUrl: "ftp://x"}, "slack_webhook_url"},
		{&ctrlv1.StartRolloutRequest{Image: imgV3, BakeSeconds: -1}, "bake_seconds"},
	} {
		if _, err := e.api.StartRollout(ctx, c.req); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), c.want) {
			t.Errorf("StartRollout(%v): %v, want InvalidArgument naming %q", c.req, err, c.want)
		}
	}
	for name, call := range map[string]func() error{
		"resume":   func() error { _, err := e.api.ResumeRollout(ctx, &ctrlv1.ResumeRolloutRequest{}); return err },
		"cancel":   func() error { _, err := e.api.CancelRollout(ctx, &ctrlv1.CancelRolloutRequest{}); return err },
		"rollback": func() error { _, err := e.api.RollbackAll(ctx, &ctrlv1.RollbackAllRequest{}); return err },
	} {
		if err := call(); status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "is completed") {
			t.Errorf("%s of a completed rollout: %v, want FailedPrecondition", name, err)
		}
	}
}

// TestRolloutCancelDuringLongWave: while a wave waits for slow sentinels,
// Status answers at once and Cancel takes effect at once; the wave's
// deploys finish on their own, no later wave starts, and a rollback then
// reverts the two waves that ran.
func TestRolloutCancelDuringLongWave(t *testing.T) {
	e := newRolloutEnv(t)
	ids := e.env.CreateSentinels(t, "eu", "sen", imgV1, 10)
	waitConverged(t, e.env.Store, ids...)
	initial := sentinelRows(t, e.env.Store)
	ctx := context.Background()
	wave2, wave3 := ids[2:6], ids[6:]
	e.clusters["eu"].Hold(wave2...)

	st, err := e.api.StartRollout(ctx, &ctrlv1.StartRolloutRequest{Image: imgV2, WavePercentages: []int32{20, 60, 100}, DeployTimeoutSeconds: 600})
	if err != nil || !slices.Equal(waveSizes(st), []int32{2, 4, 4}) {
		t.Fatalf("start: %v, %v", st, err)
	}
	e.waitState(t, 3*time.Minute, "in_progress", 2)
	wait(t, "wave 2 to reach its cluster", 10*time.Second, func() bool {
		for _, id := range wave2 {
			if _, spec, ok := e.clusters["eu"].Latest(id); !ok || spec.GetImage() != imgV2 {
				return false
			}
		}
		return true
	})

	// Status while the wave is in flight.
	var lat []time.Duration
	for range 50 {
		begin := time.Now()
		st := e.status(t)
		lat = append(lat, time.Since(begin))
		if st.GetState() != "in_progress" || st.GetWaves()[1].GetState() != "in_progress" {
			t.Fatalf("status during wave 2: %v", st)
		}
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	// Wave 2 is held for as long as the test likes, so a Status that waited
	// for the wave would never return: a bound far above any scheduling
	// noise tells the two apart. (Latency itself is a benchmark figure.)
	if lat[len(lat)-1] > 5*time.Second {
		t.Fatalf("Status took up to %s during a wave: it waits for the wave", lat[len(lat)-1])
	}
	t.Logf("Status during a wave, 50 calls: p50 %s, p90 %s, max %s", lat[25].Round(time.Microsecond), lat[45].Round(time.Microsecond), lat[49].Round(time.Microsecond))

	begin := time.Now()
	st, err = e.api.CancelRollout(ctx, &ctrlv1.CancelRolloutRequest{})
	took := time.Since(begin)
	if err != nil || st.GetState() != "cancelled" || !slices.Equal(waveStates(st), []string{"completed", "in_progress", "skipped"}) {
		t.Fatalf("cancel: %v, %v", st, err)
	}
	if took > 5*time.Second {
		t.Fatalf("Cancel took %s during a wave: it waits for the wave", took)
	}
	t.Logf("Cancel during a wave answered in %s", took.Round(time.Microsecond))

	// The wave's deploys end (their sentinels become ready); the rollout
	// records them and stays cancelled; wave 3 never starts.
	e.clusters["eu"].Release(t, wave2...)
	wait(t, "wave 2's results", 30*time.Second, func() bool { return e.status(t).GetWaves()[1].GetState() == "completed" })
	time.Sleep(time.Second) // a wave 3 that would start, starts now
	st = e.status(t)
	if st.GetState() != "cancelled" || st.GetSucceeded() != 6 || !slices.Equal(waveStates(st), []string{"completed", "completed", "skipped"}) {
		t.Fatalf("after the cancelled wave ended: %v", st)
	}
	rows := sentinelRows(t, e.env.Store)
	for _, id := range wave3 {
		if rows[id] != initial[id] {
			t.Fatalf("wave 3's %s changed after the cancel: %+v, was %+v", id, rows[id], initial[id])
		}
	}

	rb, err := e.api.RollbackAll(ctx, &ctrlv1.RollbackAllRequest{})
	if err != nil || rb.GetReverted() != 6 || rb.GetStatus().GetState() != "cancelled" {
		t.Fatalf("rollback after the cancel: %v, %v", rb, err)
	}
	rows = sentinelRows(t, e.env.Store)
	for _, id := range ids {
		if rows[id].Image != imgV1 {
			t.Fatalf("%s on %s after the rollback", id, rows[id].Image)
		}
	}
}

// TestRolloutBakeAndCancelBetweenWaves: a bake time holds the next wave
// back; a Cancel during the bake means it never starts. The Slack webhook
// fails throughout: the rollout does not care (the failures are logged).
func TestRolloutBakeAndCancelBetweenWaves(t *testing.T) {
	e := newRolloutEnv(t)
	ids := e.env.CreateSentinels(t, "eu", "sen", imgV1, 4)
	waitConverged(t, e.env.Store, ids...)
	initial := sentinelRows(t, e.env.Store)
	ctx := context.Background()
	var posts atomic.Int32
	broken := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		posts.Add(1)
		http.Error(w, "slack is down", http.StatusServiceUnavailable)
	}))
	defer broken.Close()
	if _, err := e.api.StartRollout(ctx, &ctrlv1.StartRolloutRequest{Image: imgV2, WavePercentages: []int32{50, 100}, BakeSeconds: 3,
		SlackWebhookUrl: broken.URL}); err != nil {
		t.Fatal(err)
	}
	wait(t, "wave 1 to complete", 30*time.Second, func() bool { return e.status(t).GetWaves()[0].GetState() == "completed" })
	st := e.status(t)
	if st.GetState() != "in_progress" || !strings.Contains(st.GetMessage(), "baking 3s before wave 2/2") || st.GetWaves()[1].GetState() != "pending" {
		t.Fatalf("baking: %v", st)
	}
	if _, err := e.api.CancelRollout(ctx, &ctrlv1.CancelRolloutRequest{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(4 * time.Second) // past the bake
	st = e.status(t)
	rows := sentinelRows(t, e.env.Store)
	if st.GetState() != "cancelled" || st.GetWaves()[1].GetState() != "skipped" || rows[ids[3]] != initial[ids[3]] {
		t.Fatalf("after the bake of a cancelled rollout: %v; %s is %+v", st, ids[3], rows[ids[3]])
	}
	// started, wave 1 started, wave 1 completed, cancelled: 3 attempts each.
	if n := posts.Load(); n != 12 {
		t.Errorf("the failing webhook got %d posts, want 4 messages x 3 attempts", n)
	}
	if n := strings.Count(e.env.Logs.String(), "cannot post a rollout notification to Slack; the rollout goes on"); n != 4 {
		t.Errorf("%d failed notifications logged, want 4", n)
	}
}

// TestRolloutSurvivesRestateKillAndCtrlRestart: Restate is killed and ctrl
// restarted while a wave waits for its sentinels; then Restate is killed
// again and the clusters report while it is down, so ctrl cannot wake the
// deploys (a lost wake-up). Once Restate is back, ctrl's resync pass
// notifies them and the rollout completes, every sentinel's configuration
// written exactly once (no version beyond one per sentinel).
//
// It failed once under load with NotFound right after Restate restarted:
// the Status invocation CtrlIngress.Call started had not reached its
// recovering partition within the attach bound, and Restate answers such
// an attach 404 as if it were the invocation's outcome. The ingress client
// now answers that case "retry" (UNAVAILABLE; restateingress
// TestAttachToAnUndeliveredInvocationSaysRetry), and waitState retries
// UNAVAILABLE within its deadline.
func TestRolloutSurvivesRestateKillAndCtrlRestart(t *testing.T) {
	rs := ctrltest.FreshRestate(t)
	dsn := testenv.SharedMySQL(t).Database(t, t.Name())
	port, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	opts := ctrltest.Options{DSN: dsn, Restate: rs, RestateListen: fmt.Sprintf("127.0.0.1:%d", port),
		Configure: func(c *serve.Config) { c.Deploy.ResyncInterval = time.Second }}
	env := ctrltest.Start(t, opts)
	eu := env.SentinelCluster(t, "eu", "eu-1")
	ids := env.CreateSentinels(t, "eu", "sen", imgV1, 20)
	waitConverged(t, env.Store, ids...)
	wave2 := ids[2:10]
	eu.Hold(wave2...)
	ctx := context.Background()
	if _, err := env.Rollouts(t).StartRollout(ctx, &ctrlv1.StartRolloutRequest{Image: imgV2, WavePercentages: []int32{10, 50, 100}, DeployTimeoutSeconds: 300}); err != nil {
		t.Fatal(err)
	}
	wait(t, "wave 2 to reach its cluster", 30*time.Second, func() bool {
		for _, id := range wave2 {
			if _, spec, ok := eu.Latest(id); !ok || spec.GetImage() != imgV2 {
				return false
			}
		}
		return true
	})

	// Crash Restate and ctrl mid-wave; bring both back.
	rs.Kill()
	if err := env.Server.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := rs.Start(); err != nil {
		t.Fatal(err)
	}
	env = ctrltest.Start(t, opts)
	// The cluster's agent reconnects to the new ctrl (with a new token):
	// the same cluster, so no second one holds the region back while the
	// first one's heartbeats age out.
	eu = env.HeldSentinelCluster(t, "eu", "eu-1")
	api := env.Rollouts(t)
	e := &rolloutEnv{env: env, api: api}
	e.waitState(t, 5*time.Minute, "in_progress", 2)
	wait(t, "the new cluster to receive the desired state", 30*time.Second, func() bool {
		_, spec, ok := eu.Latest(wave2[len(wave2)-1])
		return ok && spec.GetImage() == imgV2
	})

	// Restate down again; the cluster reports meanwhile: ctrl stores the
	// reports but cannot notify anyone.
	rs.Kill()
	eu.Release(t)
	wait(t, "a failed notification", time.Minute, func() bool { return sentinelMetric(t, env, "failed") >= 1 })
	if err := rs.Start(); err != nil {
		t.Fatal(err)
	}
	begin := time.Now()
	st := e.waitState(t, 5*time.Minute, "completed", 0)
	t.Logf("after Restate came back, the rollout completed in %s", time.Since(begin).Round(time.Millisecond))
	if st.GetSucceeded() != 20 || st.GetFailed() != 0 {
		t.Fatalf("after the crashes: %v", st)
	}
	head, err := env.Store.Head(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for id, r := range sentinelRows(t, env.Store) {
		if r.Image != imgV2 {
			t.Errorf("%s on %s", id, r.Image)
		}
	}
	if head != 40 {
		t.Fatalf("version head %d, want 40: 20 sentinels created, each rolled once", head)
	}
	if woken := sentinelMetric(t, env, "woken"); woken < float64(len(wave2)) {
		t.Fatalf("%v deploys woken by the new ctrl, want at least wave 2's %d", woken, len(wave2))
	}
}

// TestStuckRollbackCanBeCancelled: a rollback whose deploys do not end (the
// cluster never reports; a deploy may wait up to 24 h, or be paused in
// Restate) used to hold the rollout singleton in rolling_back with no way
// out: Cancel, Resume, Rollout and RollbackAll all refused it. Cancel now
// ends it, saying what was and was not reverted, and a new rollout can
// start.
func TestStuckRollbackCanBeCancelled(t *testing.T) {
	e := newRolloutEnv(t)
	ids := e.env.CreateSentinels(t, "eu", "sen-stuck", imgV1, 4)
	waitConverged(t, e.env.Store, ids...)
	ctx := context.Background()
	e.clusters["eu"].Hold(ids...)
	if _, err := e.api.StartRollout(ctx, &ctrlv1.StartRolloutRequest{Image: imgV2, WavePercentages: []int32{50, 100}, DeployTimeoutSeconds: 3600}); err != nil {
		t.Fatal(err)
	}
	e.waitState(t, 3*time.Minute, "in_progress", 1)
	if _, err := e.api.CancelRollout(ctx, &ctrlv1.CancelRolloutRequest{}); err != nil {
		t.Fatal(err)
	}
	// The rollback queues behind the held forward deploys: it cannot end.
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	_, err := e.api.RollbackAll(rctx, &ctrlv1.RollbackAllRequest{})
	cancel()
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("RollbackAll of held sentinels: %v, want it still waiting at its deadline", err)
	}
	e.waitState(t, 2*time.Minute, "rolling_back", 0)

	st, err := e.api.CancelRollout(ctx, &ctrlv1.CancelRolloutRequest{})
	if err != nil {
		t.Fatalf("Cancel of a stuck rollback: %v, want it to end the rollback", err)
	}
	if st.GetState() != "cancelled" || !strings.Contains(st.GetMessage(), "0 of 2 touched sentinels") || !strings.Contains(st.GetMessage(), "2 not reverted") {
		t.Fatalf("after Cancel: %s %q, want cancelled, saying none of the 2 touched sentinels was reverted", st.GetState(), st.GetMessage())
	}
	if st, err := e.api.StartRollout(ctx, &ctrlv1.StartRolloutRequest{Image: imgV2, DeployTimeoutSeconds: 3600}); err != nil || st.GetState() != "in_progress" {
		t.Fatalf("a new rollout after the cancelled rollback: %v, %v; want it started", st, err)
	}
}

// TestRolloutSetsStoppedSentinelsImage: a rollout sets the image of
// stopped sentinels too, without starting them, and counts them done; a
// stopped sentinel then starts on the rolled-out image, not on the one it
// had before the rollout.
func TestRolloutSetsStoppedSentinelsImage(t *testing.T) {
	e := newRolloutEnv(t)
	ids := e.env.CreateSentinels(t, "eu", "sen-stop", imgV1, 4)
	waitConverged(t, e.env.Store, ids...)
	ctx := context.Background()
	api := e.env.Sentinels(t)
	stopped := ids[1]
	if _, err := api.StopSentinel(ctx, &ctrlv1.StopSentinelRequest{SentinelId: stopped}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.api.StartRollout(ctx, &ctrlv1.StartRolloutRequest{Image: imgV2, WavePercentages: []int32{50, 100}}); err != nil {
		t.Fatal(err)
	}
	st := e.waitState(t, 2*time.Minute, "completed", 0)
	if st.GetTotal() != 4 || st.GetSucceeded() != 4 || st.GetFailed() != 0 {
		t.Fatalf("rollout over 3 running and 1 stopped sentinel: %v", st)
	}
	for _, id := range ids {
		r := getSentinel(t, e.env.Store, id)
		if r.Image != imgV2 {
			t.Errorf("sentinel %s (%s) is on %s after the rollout, want %s", id, r.DesiredState, r.Image, imgV2)
		}
		if want := map[bool]string{true: "stopped", false: "running"}[id == stopped]; r.DesiredState != want {
			t.Errorf("sentinel %s is %s after the rollout, want %s", id, r.DesiredState, want)
		}
	}
	resp, err := api.DeploySentinel(ctx, &ctrlv1.DeploySentinelRequest{SentinelId: stopped, Wait: true, TimeoutSeconds: 30})
	if s := resp.GetSentinel(); err != nil || resp.GetResult() != "ready" || s.GetDesiredState() != "running" || s.GetImage() != imgV2 {
		t.Fatalf("starting the stopped sentinel: %v, %v; want it running on %s", resp, err, imgV2)
	}
}
