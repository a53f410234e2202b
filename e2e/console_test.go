package e2e

//lint:file-ignore SA1019 legacy-workload: removed no earlier than v0.3.0 (docs/compatibility.md); this file builds or reads the deprecated top-level workload fields

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"krane.dev/ctrl/auth"
	"krane.dev/internal/testenv"
	ctrlv1 "krane.dev/proto/krane/ctrl/v1"
)

// The browser window's size (and the screenshots' width).
const windowWidth, windowHeight = 1280, 860

// chromiumFlags start a headless Chromium that makes no connection of its
// own: on a closed network it would otherwise stall on refused ones.
func chromiumFlags(bin, userDataDir string) []chromedp.ExecAllocatorOption {
	return []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(bin),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.UserDataDir(userDataDir),
		chromedp.WindowSize(windowWidth, windowHeight),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.Flag("hide-scrollbars", true),
		chromedp.Flag("mute-audio", true),
	}
}

// findChromium is $KRANE_CHROMIUM, or Chromium from the PATH.
func findChromium(t *testing.T) string {
	t.Helper()
	if b := os.Getenv("KRANE_CHROMIUM"); b != "" {
		return b
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatal("no Chromium found for the console's browser test: run `make deps` (it installs the Debian packages chromium and chromium-driver), " +
		"or set KRANE_CHROMIUM to a Chromium or Chrome binary")
	return ""
}

// screenshotDir is $KRANE_SCREENSHOT_DIR (`make screenshots` points it at
// the README's images), else a directory of the test run that is kept when
// a test fails.
func screenshotDir(t *testing.T) string {
	t.Helper()
	if d := os.Getenv("KRANE_SCREENSHOT_DIR"); d != "" {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		return d
	}
	d, err := testenv.SubDir("console-screenshots")
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// page drives one browser tab and records what its scripts threw or
// logged as errors, and what the browser refused to run for the page's
// content security policy.
type page struct {
	t     *testing.T
	ctx   context.Context
	shots string

	mu     sync.Mutex
	errors []string
}

// do is a step of a page.
type do = chromedp.Action[chromedp.Void]

func newPage(t *testing.T, browser context.Context, shots string) *page {
	ctx, cancel := chromedp.NewContext(browser)
	p := &page{t: t, ctx: ctx, shots: shots}
	messages := chromedp.Console(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for m, err := range messages {
			if err != nil {
				return
			}
			// Network errors are the answers the test asks for (a refused
			// sign-in is a 401) and the script it blocks.
			if m.IsException() || m.Type == chromedp.ConsoleType("error") && m.Source != "network" {
				p.record(m.Source + ": " + m.String())
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return p
}

func (p *page) record(s string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.errors = append(p.errors, s)
}

func (p *page) scriptErrors() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.errors)
}

// run runs steps; on failure it saves a screenshot and the page's text
// and fails the test with them.
func (p *page) run(what string, timeout time.Duration, steps ...do) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, timeout)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		p.fail(what, err)
	}
}

// value runs one step that answers a value.
func value[T any](p *page, what string, a chromedp.Action[T]) T {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, time.Minute)
	defer cancel()
	v, err := chromedp.Run(ctx, a)
	if err != nil {
		p.fail(what, err)
	}
	return v
}

func (p *page) fail(what string, err error) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, 20*time.Second)
	defer cancel()
	url, _ := chromedp.Run(ctx, chromedp.Location())
	text, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body ? document.body.innerText : ""`))
	shot, _ := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	name := filepath.Join(p.shots, "failed-"+strings.NewReplacer(" ", "-", "/", "-").Replace(what)+".png")
	if len(shot) > 0 {
		_ = os.WriteFile(name, shot, 0o644)
	}
	p.t.Fatalf("%s: %v\nat %s (screenshot %s)\npage text:\n%s\nscript errors: %v", what, err, url, name, text, p.scriptErrors())
}

// waitText waits until the element sel exists and its text contains want,
// checking every interval (or as fast as the browser answers). It outlives
// navigations, which a page script's own polling does not.
func waitText(sel, want string, interval time.Duration) do {
	js := fmt.Sprintf(`(() => { const e = document.querySelector(%q); return !!e && e.textContent.includes(%q); })()`, sel, want)
	return waitTrue(js, fmt.Sprintf("%q never showed %q", sel, want), interval)
}

// waitTrue polls the page until the script js evaluates to true.
func waitTrue(js, never string, interval time.Duration) do {
	check := chromedp.Evaluate[bool](js)
	return func(ctx context.Context, t *chromedp.Target) (chromedp.Void, error) {
		for {
			ok, err := check(ctx, t)
			if ok && err == nil {
				return chromedp.Void{}, nil
			}
			if ctx.Err() != nil {
				return chromedp.Void{}, fmt.Errorf("%s: %w", never, ctx.Err())
			}
			select {
			case <-ctx.Done():
			case <-time.After(interval):
			}
		}
	}
}

// press clicks the element sel once it is shown. The click runs in the
// page's own event loop, which finds the element and clicks it in one
// step: a live region may replace its elements between a CDP query and a
// mouse click on the node it found ("Could not find node with given id"),
// and a page just navigated to may still answer for the old document.
func press(sel string) do {
	js := fmt.Sprintf(`(() => {
		const e = document.querySelector(%q);
		if (!e || !e.getClientRects().length || getComputedStyle(e).visibility === "hidden") return false;
		e.click();
		return true;
	})()`, sel)
	return waitTrue(js, fmt.Sprintf("%q was never shown to click", sel), 50*time.Millisecond)
}

// confirmed clicks an action's button, checks its confirmation page asks
// the question, confirms, and waits for the outcome's message.
func confirmed(button, question, outcome string) do {
	return chromedp.Steps(
		press(button),
		waitText("#confirm-q", question, 0),
		press("#confirm"),
		waitText("#flash", outcome, 0),
	)
}

// eval runs a script for its effect.
func eval(js string) do {
	return func(ctx context.Context, t *chromedp.Target) (chromedp.Void, error) {
		_, err := chromedp.Evaluate[any](js)(ctx, t)
		return chromedp.Void{}, err
	}
}

func (p *page) screenshot(name string) {
	p.t.Helper()
	// The whole page (up to a bound), then the window's size again.
	height := value(p, "page height", chromedp.Evaluate[int64](`document.documentElement.scrollHeight`))
	p.run("fit the page", time.Minute, chromedp.EmulateViewport(windowWidth, min(max(height, 300), 2400)))
	buf := value(p, "screenshot "+name, chromedp.CaptureScreenshot())
	p.run("restore the window", time.Minute, chromedp.EmulateViewport(windowWidth, windowHeight))
	path := filepath.Join(p.shots, name)
	if err := os.WriteFile(path, buf, 0o644); err != nil {
		p.t.Fatal(err)
	}
	p.t.Logf("screenshot %s (%d KiB)", path, len(buf)>>10)
}

// unlabelled lists the form controls of the page that have no label.
func (p *page) unlabelled() []string {
	return value(p, "find unlabelled controls", chromedp.Evaluate[[]string](`[...document.querySelectorAll('input:not([type=hidden]), select, textarea')]
		.filter(e => !e.labels || e.labels.length === 0).map(e => e.id || e.name)`))
}

// lowContrast lists the page's texts whose contrast with their background
// is below WCAG AA's 4.5:1, with the ratio.
func (p *page) lowContrast() []string {
	return value(p, "measure contrast", chromedp.Evaluate[[]string](`(() => {
		const parse = c => {
			const m = c.match(/[\d.]+/g).map(Number);
			const [r, g, b] = m.slice(0, 3).map(v => { v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); });
			return { l: 0.2126 * r + 0.7152 * g + 0.0722 * b, a: m.length > 3 ? m[3] : 1 };
		};
		const background = e => {
			for (; e; e = e.parentElement) {
				const c = parse(getComputedStyle(e).backgroundColor);
				if (c.a > 0) return c.l;
			}
			return 1;
		};
		const low = [];
		for (const e of document.querySelectorAll('body *')) {
			if (![...e.childNodes].some(n => n.nodeType === 3 && n.textContent.trim())) continue;
			const fg = parse(getComputedStyle(e).color).l, bg = background(e);
			const ratio = (Math.max(fg, bg) + 0.05) / (Math.min(fg, bg) + 0.05);
			if (ratio < 4.5) low.push((e.id || e.className || e.tagName) + ' "' + e.textContent.trim().slice(0, 30) + '": ' + ratio.toFixed(2));
		}
		return low;
	})()`))
}

// checkAccessible fails the test for form controls without a label and
// for text of low contrast on the current page.
func (p *page) checkAccessible(name string) {
	p.t.Helper()
	if u := p.unlabelled(); len(u) > 0 {
		p.t.Errorf("%s has form controls without a label: %v", name, u)
	}
	if low := p.lowContrast(); len(low) > 0 {
		p.t.Errorf("%s has text below 4.5:1 contrast: %v", name, low)
	}
}

// operatorClient calls ctrl's operator API at addr with token.
func operatorClient(t *testing.T, addr, token string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			return invoker(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token), method, req, reply, cc, opts...)
		}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// alternating is a load balancer that sends each request to the next of
// its backends in turn, as a plain Service may, and counts what each
// served.
type alternating struct {
	URL    string
	next   atomic.Uint64
	served []atomic.Int64
}

func newAlternating(t *testing.T, backends ...string) *alternating {
	a := &alternating{served: make([]atomic.Int64, len(backends))}
	proxies := make([]*httputil.ReverseProxy, len(backends))
	for i, b := range backends {
		u, err := url.Parse(b)
		if err != nil {
			t.Fatal(err)
		}
		// The browser's Host stays, as behind a Service: the console's
		// same-origin checks see the address the browser used.
		proxies[i] = &httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) { pr.SetURL(u); pr.Out.Host = pr.In.Host }, FlushInterval: -1}
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		i := int((a.next.Add(1) - 1) % uint64(len(proxies)))
		a.served[i].Add(1)
		proxies[i].ServeHTTP(w, r)
	}))
	t.Cleanup(func() { srv.CloseClientConnections(); srv.Close() })
	a.URL = srv.URL
	return a
}

// setCookie sets a cookie in the browser, as a forger would.
func setCookie(name, value, url string) do {
	return func(ctx context.Context, tg *chromedp.Target) (chromedp.Void, error) {
		httpOnly := true
		_, err := cdp.Call(ctx, tg, network.SetCookie, network.SetCookieParams{Name: name, Value: value, URL: url, Path: "/", HTTPOnly: &httpOnly})
		return chromedp.Void{}, err
	}
}

// TestConsoleInBrowser drives ctrl's web console in headless Chromium
// against the whole stack, through two ctrl replicas behind an address
// that alternates between them (sessions are shared): a forged cookie and
// refused sign-ins, both clusters on Fleet, a deploy made with the
// console's form followed to ready without a reload, the Sentinels and
// Resources pages, an expired session, a rollout whose wave fails, paused,
// resumed, cancelled and rolled back, an earlier deployment promoted, an
// action refused once the token is revoked, and the pages without their
// script; every page passes the accessibility check. It saves screenshots
// of the pages as they show the stack's real data.
func TestConsoleInBrowser(t *testing.T) {
	st := sharedStack(t)
	chromium := findChromium(t)
	shots := screenshotDir(t)
	ctx := context.Background()
	rollouts := ctrlv1.NewRolloutServiceClient(operatorClient(t, st.CtrlAddr, st.OperatorToken))
	if cur, err := rollouts.GetRolloutStatus(ctx, &ctrlv1.GetRolloutStatusRequest{}); err != nil {
		t.Fatal(err)
	} else if s := cur.GetState(); s == "in_progress" || s == "paused" || s == "rolling_back" {
		t.Fatalf("a rollout is already %s on the stack", s)
	}

	// Two ctrls behind one address, every request to the other one than
	// the last.
	replica, err := st.StartCtrlReplica("ctrl-console-2")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(replica.Stop)
	lb := newAlternating(t, st.ConsoleURL, replica.ConsoleURL)

	alloc, cancelAlloc := chromedp.NewExecAllocator(ctx, chromiumFlags(chromium, t.TempDir())...)
	t.Cleanup(cancelAlloc)
	browser, cancelBrowser := chromedp.NewContext(alloc)
	t.Cleanup(cancelBrowser)
	begin := time.Now()
	if err := chromedp.Do(browser); err != nil {
		t.Fatalf("start Chromium (%s): %v", chromium, err)
	}
	t.Logf("Chromium started in %s", time.Since(begin).Round(10*time.Millisecond))
	p := newPage(t, browser, shots)
	base := lb.URL
	const step = 3 * time.Minute

	// A forged session cookie signs nobody in.
	p.run("a forged cookie", step,
		setCookie("krane_console", strings.Repeat("A", 43), base),
		chromedp.Navigate(base+"/fleet"),
		chromedp.WaitVisible(chromedp.CSS("#token")),
	)

	// Refused sign-ins: a made-up token, a cluster token.
	for _, tc := range []struct{ token, says string }{
		{"krane_o_aaaaaaaaaaaa_" + strings.Repeat("A", 43), "unknown or revoked"},
		{st.ClusterTokens["local-a"], "cluster token"},
	} {
		p.run("refused sign-in", step,
			chromedp.Navigate(base+"/fleet"),
			chromedp.WaitVisible(chromedp.CSS("#token")),
			chromedp.SendKeys(chromedp.CSS("#token"), tc.token),
			press("#signin"),
			waitText("#signin-error", tc.says, 0),
		)
	}
	p.checkAccessible("Sign-in")
	p.screenshot("signin-refused.png")

	// Sign in with the keyboard: the token field, then Enter.
	p.run("sign in", step,
		chromedp.SendKeys(chromedp.CSS("#token"), st.OperatorToken+kb.Enter),
		chromedp.WaitVisible(chromedp.CSS("#fleet-summary")),
	)
	if path := value(p, "location", chromedp.Evaluate[string](`location.pathname`)); path != "/fleet" {
		t.Fatalf("after sign-in at %s, want /fleet", path)
	}

	// Fleet: both clusters, each with a heartbeat.
	p.run("both clusters on Fleet", step,
		waitText("#cluster-local-a-1 .badge", "up", 200*time.Millisecond),
		waitText("#cluster-local-b-1 .badge", "up", 200*time.Millisecond),
		waitText("#fleet-summary", "in 2 regions", 0),
	)
	p.checkAccessible("Fleet")

	// A deploy through the console's form, followed to ready on its page.
	const env = "console-e2e"
	p.run("create a deployment", step,
		chromedp.Navigate(base+"/deployments"),
		chromedp.WaitVisible(chromedp.CSS("#new-deployment")),
		eval(`document.getElementById('new-deployment').open = true`),
		chromedp.SetValue(chromedp.CSS("#d-workspace"), "acme"),
		chromedp.SetValue(chromedp.CSS("#d-project"), "shop"),
		chromedp.SetValue(chromedp.CSS("#d-app"), "web"),
		chromedp.SetValue(chromedp.CSS("#d-environment"), env),
		chromedp.SetValue(chromedp.CSS("#d-image"), "registry.local/acme/web:console-1"),
		chromedp.SetValue(chromedp.CSS("#d-replicas"), "1"),
		press("#deploy"),
		chromedp.WaitVisible(chromedp.CSS("#timeline")),
	)
	path := value(p, "location", chromedp.Evaluate[string](`location.pathname`))
	if !strings.HasPrefix(path, "/deployments/dep_") {
		t.Fatalf("after the deploy form at %s, want the new deployment's page", path)
	}
	depID := strings.TrimPrefix(path, "/deployments/")
	firstStatus := value(p, "status", chromedp.Text(chromedp.CSS("h1 .badge")))
	p.run("mark the page", step, eval(`window.kraneNoReload = true`))
	p.run("the deployment reaches ready", step,
		waitText("h1 .badge", "ready", 100*time.Millisecond),
		waitText("#region-local-a-count", "1/1 running", 100*time.Millisecond),
		waitText("#region-local-b-count", "1/1 running", 100*time.Millisecond),
	)
	if !value(p, "check no reload", chromedp.Evaluate[bool](`window.kraneNoReload === true`)) {
		t.Fatal("the deployment page reloaded; it should update in place")
	}
	t.Logf("deployment %s: page opened at %q, reached ready in place (no reload)", depID, firstStatus)
	p.checkAccessible("Deployment")
	p.screenshot("deployment.png")
	p.run("the deployments of the environment", step,
		chromedp.Navigate(base+"/deployments?environment="+env),
		chromedp.WaitVisible(chromedp.CSS("#dep-"+depID)),
	)
	p.checkAccessible("Deployments")

	// A second deployment of the environment (through the API) gets ready
	// while the rollout below runs; the first stays live until the second
	// is promoted.
	deploys := ctrlv1.NewDeploymentServiceClient(operatorClient(t, st.CtrlAddr, st.OperatorToken))
	later, err := deploys.CreateDeployment(ctx, &ctrlv1.CreateDeploymentRequest{WorkspaceId: "acme", ProjectId: "shop", AppId: "web",
		EnvironmentId: env, Image: "registry.local/acme/web:console-2", Regions: []string{"local-a", "local-b"}, Replicas: 1})
	if err != nil {
		t.Fatal(err)
	}

	// Sentinels (the deploy started one per region) and Resources.
	p.run("Sentinels", step,
		chromedp.Navigate(base+"/sentinels"),
		chromedp.WaitVisible(chromedp.CSS("#sr-local-a")),
		chromedp.WaitVisible(chromedp.CSS("#sr-local-b")),
	)
	p.checkAccessible("Sentinels")
	p.run("Resources", step,
		chromedp.Navigate(base+"/resources"),
		chromedp.WaitVisible(chromedp.CSS("#live")),
	)
	p.checkAccessible("Resources")

	// An expired session: the next page asks to sign in, and after it
	// goes where the operator was going.
	sessions := ctrlStore(t, st)
	if _, err := sessions.DB().ExecContext(ctx, "UPDATE console_sessions SET expires_at = 0"); err != nil {
		t.Fatal(err)
	}
	p.run("an expired session", step,
		chromedp.Navigate(base+"/sentinels"),
		chromedp.WaitVisible(chromedp.CSS("#token")),
		chromedp.SendKeys(chromedp.CSS("#token"), st.OperatorToken+kb.Enter),
		chromedp.WaitVisible(chromedp.CSS("#sr-local-a")),
	)

	// How long a change takes to show: scale the deployment through the
	// API and time from the call's return to the page showing it, polled
	// every animation frame.
	p.run("back to the deployment", step, chromedp.Navigate(base+"/deployments/"+depID), chromedp.WaitVisible(chromedp.CSS("#timeline")))
	var delays []time.Duration
	for i, replicas := range []int32{2, 3, 2, 3, 2, 3, 2, 1} {
		if _, err := deploys.ScaleDeployment(ctx, &ctrlv1.ScaleDeploymentRequest{DeploymentId: depID, Replicas: replicas}); err != nil {
			t.Fatalf("scale %s to %d: %v", depID, replicas, err)
		}
		changed := time.Now()
		p.run(fmt.Sprintf("scale %d shows", i), step, waitText("#region-local-a-count", fmt.Sprintf("/%d running", replicas), 0))
		delays = append(delays, time.Since(changed))
	}
	slices.Sort(delays)
	t.Logf("live update: a committed change shows in the page p50 %s, max %s over %d changes (API call returned -> page text changed; server re-reads every 250ms)",
		delays[len(delays)/2].Round(time.Millisecond), delays[len(delays)-1].Round(time.Millisecond), len(delays))

	// A rollout whose first wave fails: paused; resumed, its second wave
	// fails too; rolled back, every sentinel returns.
	const failing = "registry.local/krane/sentinel:kwok-crash-loop"
	p.run("start a rollout", step,
		chromedp.Navigate(base+"/rollouts"),
		chromedp.WaitVisible(chromedp.CSS("#new-rollout")),
		eval(`document.getElementById('new-rollout').open = true`),
		chromedp.SetValue(chromedp.CSS("#r-image"), failing),
		chromedp.SetValue(chromedp.CSS("#r-waves"), "50,100"),
		chromedp.SetValue(chromedp.CSS("#r-timeout"), "20"),
		confirmed("#start-rollout", failing, "started"),
	)
	p.checkAccessible("Rollouts")
	begin = time.Now()
	p.run("the rollout pauses", step, waitText("#rollout-state", "paused", 200*time.Millisecond), waitText("#rollout-message", "wave 1/2", 0))
	t.Logf("rollout paused at its failing first wave %s after it started", time.Since(begin).Round(100*time.Millisecond))
	p.checkAccessible("Rollouts, paused")
	p.screenshot("rollouts.png")
	p.run("resume", step, confirmed("#resume", "Resume", "resumed"),
		waitText("#rollout-state", "paused", 200*time.Millisecond),
		waitText("#rollout-message", "wave 2/2", 200*time.Millisecond),
	)
	p.run("cancel", step,
		press("#cancel"),
		waitText("#confirm-q", "Cancel the rollout", 0),
	)
	p.checkAccessible("Confirm")
	p.run("cancelled", step,
		press("#confirm"),
		waitText("#flash", "cancelled", 0),
		waitText("#rollout-state", "cancelled", 200*time.Millisecond),
	)
	p.run("roll back", step, confirmed("#rollback", "Roll back", "back"),
		waitText("#rollout-state", "cancelled", 200*time.Millisecond),
	)
	// Fleet once both clusters' heartbeats (every 30s) report they caught
	// up with the rollout's and the rollback's versions: the page follows.
	// Only the built-in kinds are waited for: other tests on this stack
	// publish kinds whose plugins have stopped, which stay behind.
	p.run("the fleet catches up", step, chromedp.Navigate(base+"/fleet"),
		waitText("#fleet-summary", "0 silent", 200*time.Millisecond),
		waitTrue(`(() => {
			const rows = [...document.querySelectorAll("table.kinds tbody tr")]
				.filter(r => ["deployment", "sentinel", "ciliumnetworkpolicy"].includes(r.querySelector("th")?.textContent.trim()));
			return rows.length >= 6 && rows.every(r => r.textContent.includes("caught up"));
		})()`, "the built-in kinds of both clusters never all showed caught up", 200*time.Millisecond))
	p.screenshot("fleet.png")

	// The second deployment is ready by now: promote it.
	laterID := later.GetDeploymentId()
	waitFor(t, step, "the second deployment is ready", func() error {
		d, err := deploys.GetDeployment(ctx, &ctrlv1.GetDeploymentRequest{DeploymentId: laterID})
		if err != nil || d.GetStatus() != ctrlv1.DeploymentStatus_DEPLOYMENT_STATUS_READY {
			return fmt.Errorf("%v %v", d.GetStatus(), err)
		}
		return nil
	})
	p.run("promote the second deployment", step,
		chromedp.Navigate(base+"/deployments/"+laterID),
		confirmed("#promote-"+laterID, "Make deployment "+laterID, "now live"),
	)
	if d, err := deploys.GetDeployment(ctx, &ctrlv1.GetDeploymentRequest{DeploymentId: laterID}); err != nil || !d.GetLive() {
		t.Fatalf("deployment %s after Promote: live=%v %v", laterID, d.GetLive(), err)
	}

	// Without the script: pages are plain HTML and forms still post.
	noJS := newPage(t, browser, shots)
	noJS.run("block the script", step, func(ctx context.Context, tg *chromedp.Target) (chromedp.Void, error) {
		if _, err := cdp.Call(ctx, tg, network.Enable, network.EnableParams{}); err != nil {
			return chromedp.Void{}, err
		}
		_, err := cdp.Call(ctx, tg, network.SetBlockedURLs, network.SetBlockedURLsParams{
			URLPatterns: []*network.BlockPattern{{URLPattern: "*://*:*/static/console.js", Block: true}}})
		return chromedp.Void{}, err
	})
	noJS.run("a page without its script", step,
		chromedp.Navigate(base+"/deployments?environment="+env),
		chromedp.WaitVisible(chromedp.CSS("#dep-"+depID)),
	)
	live := value(noJS, "script ran?", chromedp.Evaluate[bool](`document.documentElement.classList.contains('live')`))
	noJS.run("a form without the script", step,
		press("#rollback-env"),
		waitText("#confirm-q", "Roll environment "+env+" back", 0),
		press(".confirm a.secondary"),
		chromedp.WaitVisible(chromedp.CSS("#dep-"+depID)),
	)
	if live {
		t.Fatal("the script ran although it was blocked")
	}

	// A refused action: a second operator signs in, opens a confirmation,
	// loses their token, then confirms.
	out, err := st.Ctrl(ctx, "token", "create-operator", "--name", "console-e2e")
	if err != nil {
		t.Fatal(err)
	}
	second := strings.TrimSpace(string(out))
	p.run("sign out and in again", step,
		press("form.signout button"),
		waitText("main", "You are signed out", 0),
		chromedp.SendKeys(chromedp.CSS("#token"), second),
		press("#signin"),
		chromedp.WaitVisible(chromedp.CSS("#fleet-summary")),
		chromedp.Navigate(base+"/deployments?environment="+env),
		press("#rollback-env"),
		waitText("#confirm-q", "Roll environment", 0),
	)
	parsed, err := auth.Parse(second)
	if err != nil {
		t.Fatal(err)
	}
	// The revoke returns once every replica refuses the token: the
	// console's next action is refused on whichever replica it reaches.
	if _, err := st.Ctrl(ctx, "token", "revoke", parsed.ID); err != nil {
		t.Fatal(err)
	}
	for _, addr := range []string{st.CtrlAddr, replica.Addr} {
		_, err := ctrlv1.NewFleetServiceClient(operatorClient(t, addr, second)).ListClusters(ctx, &ctrlv1.ListClustersRequest{})
		if status.Code(err) != codes.Unauthenticated {
			t.Fatalf("ctrl at %s right after the revoke returned: %v; want UNAUTHENTICATED", addr, err)
		}
	}
	p.run("the confirmed action is refused", step,
		press("#confirm"),
		waitText("#message", "revoked", 0),
	)
	p.checkAccessible("Refused")
	p.screenshot("action-refused.png")
	if !value(p, "signed out", chromedp.Evaluate[bool](`!!document.querySelector('a.button[href="/login"]')`)) {
		t.Error("the refused page offers no way to sign in again")
	}
	deps, err := deploys.ListDeployments(ctx, &ctrlv1.ListDeploymentsRequest{EnvironmentId: env})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(deps.GetDeployments()); n != 2 {
		t.Fatalf("%s has %d deployments after the refused rollback, want the console's and the API's", env, n)
	}
	for i := range lb.served {
		if n := lb.served[i].Load(); n == 0 {
			t.Errorf("ctrl %d of 2 served no request of the console", i+1)
		}
	}
	t.Logf("the console's requests alternated between two ctrls: %d and %d", lb.served[0].Load(), lb.served[1].Load())

	for _, pg := range []*page{p, noJS} {
		if errs := pg.scriptErrors(); len(errs) > 0 {
			t.Errorf("the pages' scripts reported errors: %v", errs)
		}
	}
}
