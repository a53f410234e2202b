package console

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// loader reads a page's data through the operator API. A partial answer
// comes with an error: the page shows what it has and says what failed.
type loader func(ctx context.Context, r *http.Request) (any, error)

// page serves a page: whole on a plain GET, as a stream of its live region
// when the page's script asks for events.
func (c *Console) page(name, nav string, load loader) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		s := c.requireSession(w, r)
		if s == nil {
			c.m.requests.WithLabelValues(name, "303").Inc()
			return
		}
		if strings.Contains(r.Header.Get("Accept"), "text/event-stream") {
			c.stream(w, r, s, name, nav, load)
			return
		}
		ctx, cancel := c.callCtx(r.Context(), s)
		defer cancel()
		data, err := load(ctx, r)
		if msg, ok := authRefusal(err); ok {
			c.m.requests.WithLabelValues(name, "401").Inc()
			c.refused(w, r, s, msg)
			return
		}
		v := c.newView(r, s, nav)
		v.Flash = c.sessions.takeFlash(ctx, s)
		v.Page = data
		if err != nil {
			v.Error = describe(err)
		}
		c.m.requests.WithLabelValues(name, "200").Inc()
		c.render(w, http.StatusOK, name, v)
	}
}

// liveLimit bounds the open live streams of this ctrl: per session, per
// operator token (one token may sign in many browsers) and in all.
type liveLimit struct {
	perSession, perToken, total int

	mu        sync.Mutex
	open      int
	bySession map[string]int
	byToken   map[string]int
}

func newLiveLimit(perSession, perToken, total int) *liveLimit {
	return &liveLimit{perSession: perSession, perToken: perToken, total: total, bySession: map[string]int{}, byToken: map[string]int{}}
}

// acquire takes a stream for s; the reason names the bound when it
// cannot.
func (l *liveLimit) acquire(s *session) (string, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.open >= l.total:
		return "this ctrl has too many live pages open", false
	case l.bySession[s.key] >= l.perSession:
		return "too many live pages open in this browser; close some tabs", false
	case l.byToken[s.tokenID] >= l.perToken:
		return "too many live pages open with this operator token; close some", false
	}
	l.open++
	l.bySession[s.key]++
	l.byToken[s.tokenID]++
	return "", true
}

func (l *liveLimit) release(s *session) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.open--
	if l.bySession[s.key]--; l.bySession[s.key] == 0 {
		delete(l.bySession, s.key)
	}
	if l.byToken[s.tokenID]--; l.byToken[s.tokenID] == 0 {
		delete(l.byToken, s.tokenID)
	}
}

// streamKeepAlive is how often an idle stream sends a comment, so proxies
// keep it open.
const streamKeepAlive = 15 * time.Second

// stream sends the page's live region as server-sent events: at once, then
// whenever a re-read renders it differently. A session that ends (signed
// out, expired, its token refused) gets a "signedout" event naming where
// to sign in again, and the stream closes.
func (c *Console) stream(w http.ResponseWriter, r *http.Request, s *session, name, nav string, load loader) {
	flusher, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming is not supported here", http.StatusNotImplemented)
		return
	}
	if why, ok := c.live.acquire(s); !ok {
		c.m.requests.WithLabelValues(name+"-live", "429").Inc()
		w.Header().Set("Retry-After", "5")
		http.Error(w, why, http.StatusTooManyRequests)
		return
	}
	defer c.live.release(s)
	c.m.liveStreams.Inc()
	defer c.m.liveStreams.Dec()
	c.m.requests.WithLabelValues(name+"-live", "200").Inc()

	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("X-Accel-Buffering", "no") // nginx: do not buffer the stream
	w.WriteHeader(http.StatusOK)
	flusher.Flush()

	tick := time.NewTicker(c.o.LiveInterval)
	defer tick.Stop()
	var last string
	lastSent := time.Now()
	for seq := 1; ; seq++ {
		if !c.sessions.alive(r.Context(), s) {
			// Signed out (in this tab or another) or expired: the sign-in
			// page says so, as the sign-out's own redirect does.
			sendEvent(w, "signedout", "/login?signedout=1", seq)
			flusher.Flush()
			return
		}
		ctx, cancel := c.callCtx(r.Context(), s)
		data, err := load(ctx, r)
		cancel()
		if r.Context().Err() != nil {
			return
		}
		if msg, refused := authRefusal(err); refused {
			c.log.Info("console session ended: ctrl refused its token", "token_id", s.tokenID, "reason", msg)
			if err := c.sessions.end(r.Context(), nopCookies{}, s); err != nil {
				c.log.Warn("ending a console session failed", "token_id", s.tokenID, "error", err)
			}
			sendEvent(w, "signedout", "/login", seq)
			flusher.Flush()
			return
		}
		v := c.newView(r, s, nav)
		v.Page = data
		if err != nil {
			v.Error = describe(err)
		}
		html, rerr := c.renderLive(name, v)
		if rerr != nil {
			c.log.Error("rendering a live region failed", "page", name, "error", rerr)
			return
		}
		switch {
		case html != last:
			sendEvent(w, "live", html, seq)
			last, lastSent = html, time.Now()
			flusher.Flush()
		case time.Since(lastSent) >= streamKeepAlive:
			fmt.Fprint(w, ": keep-alive\n\n")
			lastSent = time.Now()
			flusher.Flush()
		}
		select {
		case <-r.Context().Done():
			return
		case <-tick.C:
		}
	}
}

// sendEvent writes one server-sent event; each line of data is a data
// field (the browser joins them with newlines). The event-stream format
// ends a line at CRLF, LF or a lone CR, so data is split at all three: a
// value a page shows (an agent version, an apply error, all sent by
// clusters) can never end the event, start a field or an event of its
// own (FuzzLiveEventEncoding checks it with a parser that follows the
// HTML standard).
func sendEvent(w http.ResponseWriter, event, data string, id int) {
	var b strings.Builder
	b.WriteString("event: " + event + "\nid: " + strconv.Itoa(id) + "\n")
	data = strings.ReplaceAll(strings.ReplaceAll(data, "\r\n", "\n"), "\r", "\n")
	for _, line := range strings.Split(data, "\n") {
		b.WriteString("data: ")
		b.WriteString(line)
		b.WriteString("\n")
	}
	b.WriteString("\n")
	_, _ = w.Write([]byte(b.String()))
}

// renderLive renders a page's live region: what the page shows inside
// <div id="live">.
func (c *Console) renderLive(name string, v *view) (string, error) {
	var buf bytes.Buffer
	if err := c.pages[name].ExecuteTemplate(&buf, "live", v); err != nil {
		return "", err
	}
	return buf.String(), nil
}

// nopCookies is a ResponseWriter stand-in for ending a session from a
// stream, whose headers are already sent: the browser's cookie is cleared
// by the sign-in page it goes to.
type nopCookies struct{}

func (nopCookies) Header() http.Header         { return http.Header{} }
func (nopCookies) Write(b []byte) (int, error) { return len(b), nil }
func (nopCookies) WriteHeader(int)             {}

// authRefusal reports whether ctrl refused the session's token (revoked,
// expired, unknown), with its explanation. PERMISSION_DENIED is not: the
// token is valid, only this call is not allowed, and the session goes on.
func authRefusal(err error) (string, bool) {
	if err == nil {
		return "", false
	}
	st, ok := status.FromError(err)
	if !ok {
		return "", false
	}
	return st.Message(), st.Code() == codes.Unauthenticated
}

// describe turns an API error into a sentence for the page.
func describe(err error) string {
	st := status.Convert(err)
	switch st.Code() {
	case codes.Unimplemented:
		return "This ctrl does not serve that API: the deploy, sentinel and rollout APIs need Restate (restate.ingress_url)."
	case codes.Unavailable:
		return "ctrl could not answer: " + st.Message()
	case codes.DeadlineExceeded:
		return "ctrl did not answer in time; reload to try again."
	case codes.Canceled:
		return "The request was cancelled."
	}
	return st.Message()
}
