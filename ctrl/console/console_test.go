package console_test

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"krane.dev/ctrl/auth"
	"krane.dev/ctrl/deployspec"
	"krane.dev/ctrl/internal/ctrltest"
	"krane.dev/ctrl/serve"
	"krane.dev/ctrl/store"
	"krane.dev/internal/testenv"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// startCtrl runs a real ctrl (MySQL, no Restate) with its console on.
func startCtrl(t *testing.T) *ctrltest.Env {
	t.Helper()
	return startCtrlWith(t, ctrltest.Options{})
}

// startCtrlWith runs a real ctrl with its console on.
func startCtrlWith(t *testing.T, o ctrltest.Options) *ctrltest.Env {
	t.Helper()
	o.Configure = func(c *serve.Config) { c.Console.Addr = "127.0.0.1:0" }
	env := ctrltest.Start(t, o)
	if env.Server.ConsoleURL() == "" {
		t.Fatal("console.addr is set but ctrl serves no console")
	}
	return env
}

// browser is an HTTP client with a cookie jar that does not follow
// redirects (tests look at them).
type browser struct {
	t    *testing.T
	base string
	c    *http.Client
}

func newBrowser(t *testing.T, base string) *browser {
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	return &browser{t: t, base: base, c: &http.Client{Jar: jar, Timeout: 30 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

func (b *browser) do(req *http.Request) (*http.Response, string) {
	b.t.Helper()
	resp, err := b.c.Do(req)
	if err != nil {
		b.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		b.t.Fatal(err)
	}
	return resp, string(body)
}

func (b *browser) get(path string) (*http.Response, string) {
	b.t.Helper()
	req, err := http.NewRequest(http.MethodGet, b.base+path, nil)
	if err != nil {
		b.t.Fatal(err)
	}
	return b.do(req)
}

func (b *browser) post(path string, form url.Values, header ...string) (*http.Response, string) {
	b.t.Helper()
	req, err := http.NewRequest(http.MethodPost, b.base+path, strings.NewReader(form.Encode()))
	if err != nil {
		b.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	return b.do(req)
}

var csrfField = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// csrf is the anti-forgery token of the page at path.
func (b *browser) csrf(path string) string {
	b.t.Helper()
	_, body := b.get(path)
	m := csrfField.FindStringSubmatch(body)
	if m == nil {
		b.t.Fatalf("no anti-forgery token on %s:\n%s", path, body)
	}
	return m[1]
}

// signIn signs in with token and returns the answer to the form.
func (b *browser) signIn(token string) (*http.Response, string) {
	b.t.Helper()
	return b.post("/login", url.Values{"csrf": {b.csrf("/login")}, "token": {token}, "next": {"/fleet"}})
}

func (b *browser) mustSignIn(token string) {
	b.t.Helper()
	resp, body := b.signIn(token)
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/fleet" {
		b.t.Fatalf("sign-in: %s\n%s", resp.Status, body)
	}
}

func cookieNamed(resp *http.Response, name string) *http.Cookie {
	for _, c := range resp.Cookies() {
		if c.Name == name {
			return c
		}
	}
	return nil
}

// TestSignInExchangesTheTokenForAStrictCookie: an operator token signs
// in; the browser gets an HttpOnly, SameSite=Strict cookie that is not the
// token, and the Fleet page shows the fleet through the operator API.
func TestSignInExchangesTheTokenForAStrictCookie(t *testing.T) {
	env := startCtrl(t)
	tok := env.OperatorToken(t, "alice")
	cluster := env.ClusterToken(t, "eu", "eu-1")
	if _, err := env.Cluster(t, cluster).Heartbeat(context.Background(), &clusterv1.HeartbeatRequest{AgentVersion: "9.9.9"}); err != nil {
		t.Fatal(err)
	}
	// eu-2's host reports its controllers and parked objects.
	if _, err := env.Cluster(t, env.ClusterToken(t, "eu", "eu-2")).Heartbeat(context.Background(), &clusterv1.HeartbeatRequest{
		AgentVersion: "9.9.9", HostReport: true, Cursors: map[string]uint64{"deployment": 0}, Parked: map[string]int32{"deployment": 7},
		Controllers: []*clusterv1.ControllerStatus{
			{Name: "deployment", PluginVersion: "4.5.6", Kinds: []string{"deployment"}, Running: true},
			{Name: "sentinel", PluginVersion: "4.5.7", Kinds: []string{"sentinel"}, LastError: "plugin process exited unexpectedly"},
		},
	}); err != nil {
		t.Fatal(err)
	}
	b := newBrowser(t, env.Server.ConsoleURL())

	resp, _ := b.get("/fleet")
	if resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(resp.Header.Get("Location"), "/login") {
		t.Fatalf("/fleet before sign-in: %s to %q, want a redirect to /login", resp.Status, resp.Header.Get("Location"))
	}
	resp, body := b.signIn(tok)
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("sign-in: %s\n%s", resp.Status, body)
	}
	c := cookieNamed(resp, "krane_console")
	if c == nil || !c.HttpOnly || c.SameSite != http.SameSiteStrictMode || c.Path != "/" {
		t.Fatalf("session cookie %+v: want HttpOnly, SameSite=Strict, Path=/", c)
	}
	if c.Secure {
		t.Errorf("session cookie is Secure on a plain-HTTP console without console.secure_cookie: the browser would never send it")
	}
	p, _ := auth.Parse(tok)
	if strings.Contains(c.Value, p.Secret) || strings.Contains(c.Value, tok) {
		t.Fatal("the session cookie carries the token")
	}
	resp, body = b.get("/fleet")
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, "eu-1") || !strings.Contains(body, "9.9.9") || !strings.Contains(body, p.ID) {
		t.Fatalf("/fleet signed in: %s\n%s", resp.Status, body)
	}
	// eu-1's host reports no controllers or parked counts: said so.
	if !strings.Contains(body, "not reported") {
		t.Errorf("/fleet does not say which heartbeat data is not reported:\n%s", body)
	}
	// eu-2's are shown: controllers with versions, the one not running,
	// parked objects.
	for _, want := range []string{"deployment 4.5.6", "sentinel 4.5.7", `title="plugin process exited unexpectedly">not running`, `<td class="num">7</td>`} {
		if !strings.Contains(body, want) {
			t.Errorf("/fleet does not show %q of eu-2:\n%s", want, body)
		}
	}
	for _, h := range []string{"Content-Security-Policy", "X-Frame-Options", "X-Content-Type-Options"} {
		if resp.Header.Get(h) == "" {
			t.Errorf("/fleet has no %s header", h)
		}
	}
	if !strings.Contains(resp.Header.Get("Cache-Control"), "no-store") {
		t.Errorf("/fleet may be cached: Cache-Control %q", resp.Header.Get("Cache-Control"))
	}
}

// TestSignInRefusesWhatIsNotAValidOperatorToken: a cluster token, a
// malformed one, a revoked one and a form without its anti-forgery token
// are refused, each with a reason, and no session is made.
func TestSignInRefusesWhatIsNotAValidOperatorToken(t *testing.T) {
	env := startCtrl(t)
	revoked := env.OperatorToken(t, "gone")
	p, _ := auth.Parse(revoked)
	if _, err := env.Server.Authenticator().Revoke(context.Background(), p.ID); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, token string
		code        int
		says        string
	}{
		{"cluster token", env.ClusterToken(t, "eu", "eu-1"), http.StatusForbidden, "cluster token"},
		{"not a token", "hunter2", http.StatusUnauthorized, "not a Krane token"},
		{"unknown token", "krane_o_aaaaaaaaaaaa_" + strings.Repeat("A", 43), http.StatusUnauthorized, "unknown or revoked"},
		{"revoked token", revoked, http.StatusUnauthorized, "revoked"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := newBrowser(t, env.Server.ConsoleURL())
			resp, body := b.signIn(tc.token)
			if resp.StatusCode != tc.code || !strings.Contains(body, tc.says) {
				t.Fatalf("sign-in with a %s: %s, want %d saying %q\n%s", tc.name, resp.Status, tc.code, tc.says, body)
			}
			if cookieNamed(resp, "krane_console") != nil {
				t.Fatal("a refused sign-in set a session cookie")
			}
			if resp, _ := b.get("/fleet"); resp.StatusCode != http.StatusSeeOther {
				t.Fatalf("/fleet after a refused sign-in: %s", resp.Status)
			}
		})
	}
	t.Run("forged form", func(t *testing.T) {
		b := newBrowser(t, env.Server.ConsoleURL())
		resp, body := b.post("/login", url.Values{"csrf": {"made-up"}, "token": {env.OperatorToken(t, "y")}})
		if resp.StatusCode != http.StatusForbidden || cookieNamed(resp, "krane_console") != nil {
			t.Fatalf("sign-in without the form's token: %s\n%s", resp.Status, body)
		}
	})
}

// TestActionsNeedTheSessionsAntiForgeryToken: every POST without the
// session's token, with another session's, or from another site is
// refused before any API call.
func TestActionsNeedTheSessionsAntiForgeryToken(t *testing.T) {
	env := startCtrl(t)
	tok := env.OperatorToken(t, "alice")
	a, other := newBrowser(t, env.Server.ConsoleURL()), newBrowser(t, env.Server.ConsoleURL())
	a.mustSignIn(tok)
	other.mustSignIn(tok)
	otherCSRF := other.csrf("/fleet")
	mine := a.csrf("/fleet")
	actions := []string{"/logout", "/deployments", "/deployments/dep_x/promote", "/deployments/rollback",
		"/rollouts/start", "/rollouts/resume", "/rollouts/cancel", "/rollouts/rollback"}
	for _, path := range actions {
		for _, forged := range []url.Values{{}, {"csrf": {"nope"}}, {"csrf": {otherCSRF}}} {
			resp, body := a.post(path, forged)
			if resp.StatusCode != http.StatusForbidden || !strings.Contains(body, "anti-forgery") {
				t.Fatalf("POST %s with csrf %q: %s, want 403\n%s", path, forged.Get("csrf"), resp.Status, body)
			}
		}
		// The right token, but sent from another site.
		resp, _ := a.post(path, url.Values{"csrf": {mine}}, "Sec-Fetch-Site", "cross-site", "Origin", "https://evil.example")
		if resp.StatusCode != http.StatusForbidden {
			t.Fatalf("cross-site POST %s: %s, want 403", path, resp.Status)
		}
	}
	// Still signed in: nothing above ran.
	if resp, _ := a.get("/fleet"); resp.StatusCode != http.StatusOK {
		t.Fatalf("/fleet after forged posts: %s", resp.Status)
	}
	// Sign-out with the token works and ends the session.
	resp, _ := a.post("/logout", url.Values{"csrf": {mine}})
	if resp.StatusCode != http.StatusSeeOther || cookieNamed(resp, "krane_console") == nil || cookieNamed(resp, "krane_console").MaxAge >= 0 {
		t.Fatalf("sign-out: %s, cookies %v", resp.Status, resp.Cookies())
	}
	if resp, _ := a.get("/fleet"); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("/fleet after sign-out: %s, want a redirect to sign in", resp.Status)
	}
	if resp, _ := other.get("/fleet"); resp.StatusCode != http.StatusOK {
		t.Fatalf("another session of the same token ended with this one: %s", resp.Status)
	}
}

// TestRevokedTokenEndsItsSessions: once the operator token is revoked,
// the next page load is refused with ctrl's reason and the session is
// gone; a live stream gets a signedout event.
func TestRevokedTokenEndsItsSessions(t *testing.T) {
	env := startCtrl(t)
	tok := env.OperatorToken(t, "bob")
	b := newBrowser(t, env.Server.ConsoleURL())
	b.mustSignIn(tok)
	live := newBrowser(t, env.Server.ConsoleURL())
	live.mustSignIn(tok)
	events := openStream(t, live, "/fleet")
	if ev := events.next(t); ev.name != "live" {
		t.Fatalf("first event %q, want live", ev.name)
	}

	p, _ := auth.Parse(tok)
	if _, err := env.Server.Authenticator().Revoke(context.Background(), p.ID); err != nil {
		t.Fatal(err)
	}
	resp, body := b.get("/fleet")
	if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(body, "revoked") || !strings.Contains(body, "Sign in again") {
		t.Fatalf("/fleet after the token was revoked: %s\n%s", resp.Status, body)
	}
	if resp, _ := b.get("/fleet"); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("/fleet once more: %s, want a redirect to sign in (the session ended)", resp.Status)
	}
	for {
		ev := events.next(t)
		if ev.name == "signedout" {
			if ev.data != "/login" {
				t.Fatalf("signedout event to %q", ev.data)
			}
			break
		}
	}
}

// TestSignOutSendsOpenStreamsToTheSignedOutPage: a page still streaming
// when its session signs out is sent to the page that says so, not to a
// bare sign-in form (the browser test once raced its own sign-out there).
func TestSignOutSendsOpenStreamsToTheSignedOutPage(t *testing.T) {
	env := startCtrl(t)
	b := newBrowser(t, env.Server.ConsoleURL())
	b.mustSignIn(env.OperatorToken(t, "dora"))
	events := openStream(t, b, "/fleet")
	if ev := events.next(t); ev.name != "live" {
		t.Fatalf("first event %q, want live", ev.name)
	}
	if resp, _ := b.post("/logout", url.Values{"csrf": {b.csrf("/fleet")}}); resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/login?signedout=1" {
		t.Fatalf("sign-out: %s to %q", resp.Status, resp.Header.Get("Location"))
	}
	for {
		ev := events.next(t)
		if ev.name == "signedout" {
			if ev.data != "/login?signedout=1" {
				t.Fatalf("signedout event to %q, want the signed-out page", ev.data)
			}
			return
		}
	}
}

// TestLiveStreamSendsTheRegionWhenItChanges: the Fleet stream sends the
// live region at once and again when a cluster's heartbeat changes it.
func TestLiveStreamSendsTheRegionWhenItChanges(t *testing.T) {
	env := startCtrl(t)
	b := newBrowser(t, env.Server.ConsoleURL())
	b.mustSignIn(env.OperatorToken(t, "carol"))
	cluster := env.Cluster(t, env.ClusterToken(t, "eu", "eu-1"))
	events := openStream(t, b, "/fleet")
	first := events.next(t)
	if first.name != "live" || !strings.Contains(first.data, "eu-1") || strings.Contains(first.data, "<html") {
		t.Fatalf("first event: %q\n%s", first.name, first.data)
	}
	begin := time.Now()
	if _, err := cluster.Heartbeat(context.Background(), &clusterv1.HeartbeatRequest{AgentVersion: "live-7"}); err != nil {
		t.Fatal(err)
	}
	for {
		ev := events.next(t)
		if ev.name == "live" && strings.Contains(ev.data, "live-7") {
			t.Logf("a heartbeat showed in the live stream %s after it was recorded", time.Since(begin).Round(time.Millisecond))
			return
		}
	}
}

// TestLiveStreamsAreBoundedAndEndWithTheirClient: one session holds at
// most 16 live streams (the 17th is told to retry later); every stream's
// loop ends when its browser goes away.
func TestLiveStreamsAreBoundedAndEndWithTheirClient(t *testing.T) {
	env := startCtrl(t)
	b := newBrowser(t, env.Server.ConsoleURL())
	b.mustSignIn(env.OperatorToken(t, "gina"))
	metricsURL := "http://" + env.Server.HTTPAddr() + "/metrics"
	ctx, cancel := context.WithCancel(context.Background())
	var bodies []io.Closer
	for i := 0; i < 17; i++ {
		resp := b.stream(ctx, "/fleet")
		bodies = append(bodies, resp.Body)
		want := http.StatusOK
		if i == 16 {
			want = http.StatusTooManyRequests
		}
		if resp.StatusCode != want {
			t.Fatalf("stream %d: %s, want %d", i+1, resp.Status, want)
		}
	}
	if got := gauge(t, metricsURL, "krane_ctrl_console_live_streams"); got != 16 {
		t.Fatalf("krane_ctrl_console_live_streams = %v with 16 open, want 16", got)
	}
	cancel()
	for _, body := range bodies {
		body.Close()
	}
	deadline := time.Now().Add(60 * time.Second)
	for gauge(t, metricsURL, "krane_ctrl_console_live_streams") != 0 {
		if time.Now().After(deadline) {
			t.Fatal("live streams still open on the server 60s after their clients went away")
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The session may open streams again.
	openStream(t, b, "/fleet").next(t)
}

// gauge reads one unlabelled series from a /metrics page.
func gauge(t *testing.T, metricsURL, name string) float64 {
	t.Helper()
	resp, err := http.Get(metricsURL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			return f
		}
	}
	t.Fatalf("no %s on %s", name, metricsURL)
	return 0
}

type event struct{ name, data string }

// stream asks for a page's live stream, as the page's script does; the
// stream lasts until ctx ends.
func (b *browser) stream(ctx context.Context, path string) *http.Response {
	b.t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, b.base+path, nil)
	if err != nil {
		b.t.Fatal(err)
	}
	req.Header.Set("Accept", "text/event-stream")
	client := *b.c
	client.Timeout = 0
	resp, err := client.Do(req)
	if err != nil {
		b.t.Fatal(err)
	}
	return resp
}

type eventStream struct {
	events chan event
}

// openStream opens a page's live stream as the page's script does.
func openStream(t *testing.T, b *browser, path string) *eventStream {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	resp := b.stream(ctx, path)
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("live stream of %s: %s %s", path, resp.Status, resp.Header.Get("Content-Type"))
	}
	es := &eventStream{events: make(chan event, 64)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer close(es.events)
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 1<<22)
		var ev event
		var data []string
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "":
				if ev.name != "" {
					ev.data = strings.Join(data, "\n")
					es.events <- ev
				}
				ev, data = event{}, nil
			case strings.HasPrefix(line, "event: "):
				ev.name = strings.TrimPrefix(line, "event: ")
			case strings.HasPrefix(line, "data: "):
				data = append(data, strings.TrimPrefix(line, "data: "))
			}
		}
	}()
	t.Cleanup(func() { cancel(); resp.Body.Close(); <-done })
	return es
}

// next waits for the stream's next event (generously: the machine may be
// loaded).
func (es *eventStream) next(t *testing.T) event {
	t.Helper()
	select {
	case ev, ok := <-es.events:
		if !ok {
			t.Fatal("the live stream closed")
		}
		return ev
	case <-time.After(60 * time.Second):
		t.Fatal("no event on the live stream within 60s")
	}
	return event{}
}

// TestPagesSayWhatThisCtrlDoesNotServe: without Restate the deploy,
// sentinel and rollout pages say the API needs it.
func TestPagesSayWhatThisCtrlDoesNotServe(t *testing.T) {
	env := startCtrl(t)
	b := newBrowser(t, env.Server.ConsoleURL())
	b.mustSignIn(env.OperatorToken(t, "dave"))
	for _, path := range []string{"/deployments", "/sentinels", "/rollouts"} {
		resp, body := b.get(path)
		if resp.StatusCode != http.StatusOK || !strings.Contains(body, "need Restate") {
			t.Errorf("%s without Restate: %s\n%s", path, resp.Status, body)
		}
	}
}

// TestDeploymentsWithoutAnEnvironmentNameTheFirst: /deployments goes to
// the first environment's address, so that its live stream and a reload
// show the same environment as the page.
func TestDeploymentsWithoutAnEnvironmentNameTheFirst(t *testing.T) {
	env := startCtrlWith(t, ctrltest.Options{Restate: testenv.SharedRestate(t)})
	env.CreateSentinels(t, "eu", "sen", "registry.test/krane/sentinel:1", 2)
	b := newBrowser(t, env.Server.ConsoleURL())
	b.mustSignIn(env.OperatorToken(t, "hana"))
	resp, _ := b.get("/deployments")
	if loc := resp.Header.Get("Location"); resp.StatusCode != http.StatusSeeOther || loc != "/deployments?environment=env-sen-000" {
		t.Fatalf("/deployments: %s to %q, want a redirect to the first environment", resp.Status, loc)
	}
	resp, body := b.get("/deployments?environment=env-sen-001")
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, "Environment env-sen-001") || !strings.Contains(body, `value="env-sen-000"`) {
		t.Fatalf("/deployments of env-sen-001: %s\n%s", resp.Status, body)
	}
	if ev := openStream(t, b, "/deployments?environment=env-sen-001").next(t); !strings.Contains(ev.data, "Environment env-sen-001") {
		t.Fatalf("the live stream shows another environment:\n%s", ev.data)
	}
}

// TestSignInRedirectsOnlyWithinTheConsole: the next parameter cannot send
// a signed-in operator to another site.
func TestSignInRedirectsOnlyWithinTheConsole(t *testing.T) {
	env := startCtrl(t)
	tok := env.OperatorToken(t, "erin")
	for next, want := range map[string]string{
		"/sentinels?region=eu": "/sentinels?region=eu", "//evil.example/x": "/fleet", "https://evil.example": "/fleet",
		"/\\evil.example": "/fleet", "": "/fleet", "/\t/evil.example/": "/fleet", "/\n/evil.example/": "/fleet",
	} {
		b := newBrowser(t, env.Server.ConsoleURL())
		resp, _ := b.post("/login", url.Values{"csrf": {b.csrf("/login")}, "token": {tok}, "next": {next}})
		if got := resp.Header.Get("Location"); resp.StatusCode != http.StatusSeeOther || got != want {
			t.Errorf("sign-in with next=%q: %s to %q, want %q", next, resp.Status, got, want)
		}
	}
	// A signed-in browser is sent on at once; and an action's "back".
	b := newBrowser(t, env.Server.ConsoleURL())
	b.mustSignIn(tok)
	if resp, _ := b.get("/login?next=" + url.QueryEscape("/\t/evil.example/")); resp.Header.Get("Location") != "/fleet" {
		t.Errorf("signed in, next with a tab: %s to %q, want /fleet", resp.Status, resp.Header.Get("Location"))
	}
	resp, _ := b.post("/rollouts/cancel", url.Values{"csrf": {b.csrf("/fleet")}, "confirmed": {"yes"}, "back": {"/\t/evil.example/"}})
	if got := resp.Header.Get("Location"); resp.StatusCode != http.StatusSeeOther || got != "/fleet" {
		t.Errorf("an action with back=/<tab>/evil.example/: %s to %q, want /fleet", resp.Status, got)
	}
}

// TestDeploymentTimelineIsTheRecordedHistory: the deployment page lists
// every entry of the deploy's recorded history with its time, not only its
// creation and the status it is at now.
func TestDeploymentTimelineIsTheRecordedHistory(t *testing.T) {
	env := startCtrlWith(t, ctrltest.Options{Restate: testenv.SharedRestate(t)})
	ctx := context.Background()
	const id = "dep_timeline"
	if _, _, err := env.Store.CreateDeployment(ctx, store.Deployment{Spec: deployspec.Spec{ID: id, WorkspaceID: "ws", ProjectID: "p", EnvironmentID: "env-timeline", AppID: "app", K8sNamespace: "ns", K8sName: "d-timeline", Replicas: 1, Workload: &clusterv1.Workload{Image: "registry.test/app:1", CpuMillicores: 100, MemoryMib: 128}}}, ""); err != nil {
		t.Fatal(err)
	}
	notes := []string{"waiting for sentinel sen_x in local-a", "sentinel sen_x healthy on registry.test/sentinel:1"}
	for _, n := range notes {
		if _, err := env.Store.WriteTx(ctx, func(ctx context.Context, tx *store.Tx) error { return tx.NoteDeployment(ctx, id, n) }); err != nil {
			t.Fatal(err)
		}
	}
	b := newBrowser(t, env.Server.ConsoleURL())
	b.mustSignIn(env.OperatorToken(t, "tina"))
	resp, body := b.get("/deployments/" + id)
	start := strings.Index(body, `id="timeline"`)
	if resp.StatusCode != http.StatusOK || start < 0 {
		t.Fatalf("/deployments/%s: %s, no timeline:\n%s", id, resp.Status, body)
	}
	timeline := body[start:]
	timeline = timeline[:strings.Index(timeline, "</ol>")]
	for _, n := range notes {
		if !strings.Contains(timeline, n) {
			t.Errorf("the timeline does not show the recorded step %q:\n%s", n, timeline)
		}
	}
	if got := strings.Count(timeline, "<time"); got != len(notes)+1 {
		t.Errorf("the timeline has %d entries, want %d (creation and the two notes):\n%s", got, len(notes)+1, timeline)
	}
}

// TestTwoReplicasShareSessions: behind a plain load balancer, a browser's
// requests land on either ctrl; a session signed in on one works on the
// other, a sign-out on either ends it on both (a live page open on the
// other is sent to sign in), and a forged cookie works on neither.
func TestTwoReplicasShareSessions(t *testing.T) {
	one := startCtrl(t)
	two := startCtrlWith(t, ctrltest.Options{DSN: one.DSN})
	b := newBrowser(t, one.Server.ConsoleURL())
	b.mustSignIn(one.OperatorToken(t, "hana"))
	other := &browser{t: t, base: two.Server.ConsoleURL(), c: b.c}
	if resp, body := other.get("/fleet"); resp.StatusCode != http.StatusOK || !strings.Contains(body, "fleet-summary") {
		t.Fatalf("the other replica with the session's cookie: %s to %q", resp.Status, resp.Header.Get("Location"))
	}
	events := openStream(t, b, "/fleet")
	if ev := events.next(t); ev.name != "live" {
		t.Fatalf("first event %q, want live", ev.name)
	}
	// Sign out on the other replica, with the anti-forgery token of a
	// page the first served.
	if resp, _ := other.post("/logout", url.Values{"csrf": {b.csrf("/fleet")}}); resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/login?signedout=1" {
		t.Fatalf("sign-out on the other replica: %s to %q", resp.Status, resp.Header.Get("Location"))
	}
	for ev := events.next(t); ev.name != "signedout"; ev = events.next(t) {
	}
	for _, br := range []*browser{b, other} {
		if resp, _ := br.get("/fleet"); resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(resp.Header.Get("Location"), "/login") {
			t.Errorf("%s after the sign-out: %s to %q, want the sign-in page", br.base, resp.Status, resp.Header.Get("Location"))
		}
	}
	forged := newBrowser(t, two.Server.ConsoleURL())
	u, _ := url.Parse(forged.base)
	forged.c.Jar.SetCookies(u, []*http.Cookie{{Name: "krane_console", Value: strings.Repeat("A", 43)}})
	if resp, _ := forged.get("/fleet"); resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(resp.Header.Get("Location"), "/login") {
		t.Errorf("a forged cookie: %s to %q, want the sign-in page", resp.Status, resp.Header.Get("Location"))
	}
}

// TestLiveStreamsAreBoundedPerToken: one operator token holds at most
// console.live_per_token live streams on a ctrl, across the browsers it
// signed in.
func TestLiveStreamsAreBoundedPerToken(t *testing.T) {
	env := ctrltest.Start(t, ctrltest.Options{Configure: func(c *serve.Config) { c.Console.Addr = "127.0.0.1:0"; c.Console.LivePerToken = 3 }})
	tok := env.OperatorToken(t, "ines")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for i := range 2 {
		b := newBrowser(t, env.Server.ConsoleURL()) // two sessions of the token, two streams each
		b.mustSignIn(tok)
		for j := range 2 {
			resp := b.stream(ctx, "/fleet")
			t.Cleanup(func() { resp.Body.Close() })
			want := http.StatusOK
			if 2*i+j >= 3 {
				want = http.StatusTooManyRequests
			}
			if resp.StatusCode != want {
				t.Fatalf("stream %d of the token: %s, want %d", 2*i+j+1, resp.Status, want)
			}
		}
	}
	// Another token is not held back by this one's.
	b := newBrowser(t, env.Server.ConsoleURL())
	b.mustSignIn(env.OperatorToken(t, "jo"))
	if resp := b.stream(ctx, "/fleet"); resp.StatusCode != http.StatusOK {
		t.Fatalf("another token's stream: %s", resp.Status)
	}
}
