package e2e

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// TestConsoleScriptFollowsOnlyItsOwnPaths runs the console's script in
// Chromium against a page whose live stream sends a "signedout" event
// naming where to go (as a compromised or confused server might): the
// browser goes there only when it is a path of the page's own origin, and
// to the sign-in page otherwise. Before, it followed any URL, so one
// injected event sent every operator to a phishing copy of the sign-in
// page.
func TestConsoleScriptFollowsOnlyItsOwnPaths(t *testing.T) {
	script, err := os.ReadFile("../ctrl/console/static/console.js")
	if err != nil {
		t.Fatal(err)
	}
	elsewhere := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("elsewhere")) }))
	t.Cleanup(elsewhere.Close)
	other, _ := url.Parse(elsewhere.URL)
	mux := http.NewServeMux()
	mux.HandleFunc("/static/console.js", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/javascript")
		_, _ = w.Write(script)
	})
	mux.HandleFunc("/page", func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.Header.Get("Accept"), "text/event-stream") {
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprintf(w, "event: signedout\ndata: %s\n\n", r.URL.Query().Get("to"))
			return
		}
		_, _ = w.Write([]byte(`<!doctype html><html lang="en"><title>t</title><div id="live">x</div><script src="/static/console.js"></script></html>`))
	})
	mux.HandleFunc("/login", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("sign in")) })
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)

	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), chromiumFlags(findChromium(t), t.TempDir())...)
	t.Cleanup(cancelAlloc)
	browser, cancelBrowser := chromedp.NewContext(alloc)
	t.Cleanup(cancelBrowser)
	p := newPage(t, browser, t.TempDir())
	for to, want := range map[string]string{
		"/login?signedout=1":                "/login?signedout=1",
		"//" + other.Host + "/phish":        "/login",
		elsewhere.URL + "/phish":            "/login",
		"/\t/" + other.Host + "/phish":      "/login",
		"/\\" + other.Host + "/phish":       "/login",
		"javascript:document.title='owned'": "/login",
	} {
		p.run("a signedout event to "+to, time.Minute,
			chromedp.Navigate(srv.URL+"/page?"+url.Values{"to": {to}}.Encode()),
			waitTrue(`location.pathname === "/login"`, "the page never went to a sign-in page", 20*time.Millisecond),
		)
		got := value(p, "location", chromedp.Evaluate[string](`location.origin + "|" + location.pathname + location.search`))
		if got != srv.URL+"|"+want {
			t.Errorf("a signedout event to %q: the browser went to %s, want %s%s", to, got, srv.URL, want)
		}
	}
}
