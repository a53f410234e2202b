// Package console is ctrl's web console, for the questions operators ask
// all day: is this rollout healthy, which cluster is behind, why did this
// deploy fail, what is stuck where. Its pages: Fleet (regions, clusters,
// heartbeats, per kind how far each cluster is behind), Deployments (by
// environment, per region status and instances, the deploy's history;
// create, promote, roll back), Sentinels, Rollouts (the waves as a bar,
// each sentinel's state; start, resume, cancel, roll back) and Resources
// (plugin authors' kinds, per region applied version and apply errors).
//
// Every read and every action is a call of ctrl's operator gRPC API
// (krane.ctrl.v1) carrying the signed-in operator's token, made through
// the same server and authentication interceptor as the CLI's calls: what
// a token may do, and what ctrl logs about it, is the same whichever way
// it comes. The console reads no data from the database: only its
// sessions are kept there (SessionStore).
//
// Sign-in exchanges an operator token (a cluster token is refused) for a
// session: a random secret in a cookie that is HttpOnly and
// SameSite=Strict, and Secure when the console serves TLS or sits behind
// a TLS proxy. Sessions live in ctrl's database, shared by every replica
// (so the console works behind a plain Service and survives a restart):
// a row holds the secret's hash and the operator token sealed with a key
// derived from the secret, so neither the table nor the cookie alone
// yields a token. A forged or altered cookie finds no session. Signing
// out deletes the row: every replica refuses the cookie from then on (a
// live page on another replica learns it within a second). A token
// revoked or expired ends its sessions at their next call.
//
// Forgery: every POST must carry the session's anti-forgery token and pass
// net/http's cross-origin check (Sec-Fetch-Site, Origin); the sign-in form
// carries a token bound to a cookie of its own. Destructive actions ask for
// a confirmation first, on a page of their own, so they work without
// script.
//
// Live: a page's script opens a server-sent event stream on the page's own
// URL; the console re-reads the page's data every Options.LiveInterval and
// sends the page's live region when it changed. Without the script the
// pages are plain HTML: links, forms and reloads do everything.
package console

import (
	"bytes"
	"context"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"net/url"
	"strings"
	"time"
	"unicode"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"krane.dev/ctrl/auth"
	"krane.dev/ctrl/store"
	ctrlv1 "krane.dev/proto/krane/ctrl/v1"
	"krane.dev/shared/version"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// Options configure a Console.
type Options struct {
	// Conn reaches ctrl's operator API (in ctrl serve: an in-process
	// connection to its own gRPC server).
	Conn grpc.ClientConnInterface
	// Sessions keeps the signed-in sessions where every ctrl replica
	// reads them (ctrl serve: its database).
	Sessions SessionStore
	// SessionTTL is how long a session lasts after sign-in (default 12h).
	SessionTTL time.Duration
	// SecureCookie marks the cookies Secure (HTTPS only).
	SecureCookie bool
	// LivePerToken bounds the live streams one operator token holds open
	// on this ctrl, across its sessions (default 64; one session holds at
	// most 16, this ctrl at most 512).
	LivePerToken int
	// LiveInterval is how often a live page re-reads its data (default
	// 250ms).
	LiveInterval time.Duration
	// CallTimeout bounds each API call (default 15s).
	CallTimeout time.Duration
	Log         hclog.Logger
	// Registerer receives the console's metrics; nil registers none.
	Registerer prometheus.Registerer
}

// Console serves the web console.
type Console struct {
	o         Options
	log       hclog.Logger
	sessions  *sessions
	pages     map[string]*template.Template
	deploys   ctrlv1.DeploymentServiceClient
	sentinels ctrlv1.SentinelServiceClient
	rollouts  ctrlv1.RolloutServiceClient
	fleet     ctrlv1.FleetServiceClient
	resources resourceAPI
	m         metrics
	live      *liveLimit
}

type metrics struct {
	requests    *prometheus.CounterVec
	actions     *prometheus.CounterVec
	signIns     *prometheus.CounterVec
	liveStreams prometheus.Gauge
}

// New returns a Console.
func New(o Options) (*Console, error) {
	if o.Conn == nil {
		return nil, errors.New("console: no connection to the operator API")
	}
	if o.Sessions == nil {
		return nil, errors.New("console: no session store")
	}
	if o.SessionTTL <= 0 {
		o.SessionTTL = 12 * time.Hour
	}
	if o.LivePerToken <= 0 {
		o.LivePerToken = 64
	}
	if o.LiveInterval <= 0 {
		o.LiveInterval = 250 * time.Millisecond
	}
	if o.CallTimeout <= 0 {
		o.CallTimeout = 15 * time.Second
	}
	if o.Log == nil {
		o.Log = hclog.NewNullLogger()
	}
	pages, err := parseTemplates()
	if err != nil {
		return nil, err
	}
	c := &Console{
		o: o, log: o.Log.Named("console"), sessions: newSessions(o.Sessions, o.SessionTTL, o.SecureCookie), pages: pages,
		deploys: ctrlv1.NewDeploymentServiceClient(o.Conn), sentinels: ctrlv1.NewSentinelServiceClient(o.Conn),
		rollouts: ctrlv1.NewRolloutServiceClient(o.Conn), fleet: ctrlv1.NewFleetServiceClient(o.Conn),
		resources: resourceAPI{ctrlv1.NewResourceServiceClient(o.Conn)},
		live:      newLiveLimit(16, o.LivePerToken, 512),
	}
	c.m.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "krane", Subsystem: "ctrl", Name: "console_requests_total",
		Help: "Console page loads and actions, by route and HTTP status code.",
	}, []string{"route", "code"})
	c.m.actions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "krane", Subsystem: "ctrl", Name: "console_actions_total",
		Help: "Console actions (operator API calls that change something), by action and result (ok, refused, failed).",
	}, []string{"action", "result"})
	c.m.signIns = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "krane", Subsystem: "ctrl", Name: "console_sign_ins_total",
		Help: "Console sign-ins, by result (ok, refused, forged).",
	}, []string{"result"})
	c.m.liveStreams = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: "krane", Subsystem: "ctrl", Name: "console_live_streams",
		Help: "Open live-update streams of console pages.",
	})
	sessionsOpen := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "krane", Subsystem: "ctrl", Name: "console_sessions",
		Help: "Signed-in console sessions (of every ctrl replica: they share them); -1 when the database did not answer.",
	}, func() float64 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		n, err := c.sessions.count(ctx)
		if err != nil {
			return -1
		}
		return float64(n)
	})
	if o.Registerer != nil {
		for _, col := range []prometheus.Collector{c.m.requests, c.m.actions, c.m.signIns, c.m.liveStreams, sessionsOpen} {
			if err := o.Registerer.Register(col); err != nil {
				return nil, fmt.Errorf("console: register metrics: %w", err)
			}
		}
	}
	return c, nil
}

// Handler is the console's HTTP handler.
func (c *Console) Handler() http.Handler {
	mux := http.NewServeMux()
	static, _ := fs.Sub(staticFS, "static")
	mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/fleet", http.StatusSeeOther) })
	mux.HandleFunc("GET /login", c.loginPage)
	mux.HandleFunc("POST /login", c.signIn)
	mux.HandleFunc("POST /logout", c.signOut)

	mux.HandleFunc("GET /fleet", c.page("fleet", "fleet", c.loadFleet))
	mux.HandleFunc("GET /deployments", c.deploymentsIndex(c.page("deployments", "deployments", c.loadDeployments)))
	mux.HandleFunc("GET /deployments/{id}", c.page("deployment", "deployments", c.loadDeployment))
	mux.HandleFunc("GET /sentinels", c.page("sentinels", "sentinels", c.loadSentinels))
	mux.HandleFunc("GET /rollouts", c.page("rollouts", "rollouts", c.loadRollouts))
	mux.HandleFunc("GET /resources", c.page("resources", "resources", c.loadResources))

	mux.HandleFunc("POST /deployments", c.action("deploy", nil, c.createDeployment))
	mux.HandleFunc("POST /deployments/{id}/promote", c.action("promote", confirmPromote, c.promote))
	mux.HandleFunc("POST /deployments/rollback", c.action("rollback", confirmRollback, c.rollback))
	mux.HandleFunc("POST /rollouts/start", c.action("rollout-start", confirmRolloutStart, c.startRollout))
	mux.HandleFunc("POST /rollouts/resume", c.action("rollout-resume", confirmResume, c.resumeRollout))
	mux.HandleFunc("POST /rollouts/cancel", c.action("rollout-cancel", confirmCancel, c.cancelRollout))
	mux.HandleFunc("POST /rollouts/rollback", c.action("rollout-rollback", confirmRollbackAll, c.rollbackAll))

	cop := http.NewCrossOriginProtection()
	cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.log.Warn("refused a cross-origin request", "method", r.Method, "path", r.URL.Path, "remote", r.RemoteAddr,
			"origin", r.Header.Get("Origin"), "sec_fetch_site", r.Header.Get("Sec-Fetch-Site"))
		c.message(w, r, http.StatusForbidden, "Refused", "This request came from another site. Use the console's own pages and forms.")
	}))
	return securityHeaders(cop.Handler(mux))
}

// securityHeaders keep the pages from being framed, sniffed, cached or
// leaking their address, and allow only the console's own script and
// styles.
func securityHeaders(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "+
			"connect-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'; object-src 'none'")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Referrer-Policy", "no-referrer")
		if !strings.HasPrefix(r.URL.Path, "/static/") {
			h.Set("Cache-Control", "no-store")
		}
		next.ServeHTTP(w, r)
	})
}

// view is what every page template receives.
type view struct {
	Title   string
	Nav     string
	Signed  bool
	TokenID string
	CSRF    string
	Flash   *flash
	Error   string
	// Self is the page's own URL (its reload link and live stream).
	Self    string
	Now     time.Time
	Version string
	Page    any
}

func (c *Console) newView(r *http.Request, s *session, nav string) *view {
	v := &view{Nav: nav, Self: r.URL.RequestURI(), Now: time.Now(), Version: version.Version}
	if s != nil {
		v.Signed, v.TokenID, v.CSRF = true, s.tokenID, s.csrf
	}
	return v
}

// render writes a whole page.
func (c *Console) render(w http.ResponseWriter, code int, name string, v *view) {
	t := c.pages[name]
	var buf bytes.Buffer
	if err := t.ExecuteTemplate(&buf, "layout", v); err != nil {
		c.log.Error("rendering a console page failed", "page", name, "error", err)
		http.Error(w, "the console could not render this page; ctrl's log has the details", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(code)
	_, _ = w.Write(buf.Bytes())
}

// message renders a page with a title and a message.
func (c *Console) message(w http.ResponseWriter, r *http.Request, code int, title, text string) {
	s, _ := c.sessions.get(r) // without a session when the store fails: the message is shown all the same
	v := c.newView(r, s, "")
	v.Title = title
	v.Page = messagePage{Text: text}
	c.render(w, code, "message", v)
}

type messagePage struct {
	Text     string
	SignInTo string // a "sign in again" link when set
}

// callCtx carries the session's token to the operator API and bounds the
// call.
func (c *Console) callCtx(ctx context.Context, s *session) (context.Context, context.CancelFunc) {
	ctx = metadata.NewOutgoingContext(ctx, metadata.Pairs("authorization", "Bearer "+s.token))
	return context.WithTimeout(ctx, c.o.CallTimeout)
}

// requireSession returns the request's session, or sends the browser to
// sign in (or says that the session store did not answer) and returns
// nil.
func (c *Console) requireSession(w http.ResponseWriter, r *http.Request) *session {
	s, err := c.sessions.get(r)
	if err != nil {
		c.log.Error("reading a console session failed", "remote", r.RemoteAddr, "error", err)
		c.message(w, r, http.StatusServiceUnavailable, "Unavailable", storeUnavailable(err))
		return nil
	}
	if s != nil {
		return s
	}
	http.Redirect(w, r, "/login?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
	return nil
}

// refused ends the session whose token ctrl no longer accepts and says why.
func (c *Console) refused(w http.ResponseWriter, r *http.Request, s *session, msg string) {
	c.log.Info("console session ended: ctrl refused its token", "token_id", s.tokenID, "remote", r.RemoteAddr, "reason", msg)
	if err := c.sessions.end(r.Context(), w, s); err != nil {
		c.log.Warn("ending a console session failed", "token_id", s.tokenID, "error", err)
	}
	v := c.newView(r, nil, "")
	v.Title = "Signed out"
	v.Page = messagePage{Text: "ctrl refused your operator token: " + msg, SignInTo: "/login"}
	c.render(w, http.StatusUnauthorized, "message", v)
}

// localPath accepts only a path of this console (for redirects): p parsed
// as a URL has no scheme, no host and a path starting with a single '/',
// and holds no control character (browsers drop tabs and newlines, so
// "/\t/x" would become "//x", another host) and no backslash (which
// browsers read as '/'). Anything else is def.
func localPath(p, def string) string {
	if !strings.HasPrefix(p, "/") || strings.HasPrefix(p, "//") || strings.ContainsFunc(p, func(r rune) bool { return r == '\\' || unicode.IsControl(r) }) {
		return def
	}
	u, err := url.Parse(p)
	if err != nil || u.Scheme != "" || u.Host != "" || u.User != nil || u.Opaque != "" || !strings.HasPrefix(u.Path, "/") || strings.HasPrefix(u.Path, "//") {
		return def
	}
	return p
}

// tokenKind tells an operator token from a cluster token without
// revealing either; ok is false for something that is no token.
func tokenKind(token string) (id string, operator bool, ok bool) {
	p, err := auth.Parse(token)
	if err != nil {
		return "", false, false
	}
	return p.ID, p.Kind == store.OperatorToken, true
}
