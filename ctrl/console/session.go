package console

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"net/http"
	"sync"
	"time"
)

// Cookie names. The session cookie carries only a random id: the operator
// token stays in this process.
const (
	sessionCookie = "krane_console"
	// loginCookie binds the sign-in form to the browser that loaded it
	// (double-submit: the form's hidden field must equal the cookie).
	loginCookie = "krane_console_login"
)

// maxSessions bounds the sessions kept in memory; past it the oldest ends.
const maxSessions = 10000

// session is one signed-in browser.
type session struct {
	id      string
	token   string // the operator token every API call carries
	tokenID string // its public id, shown and logged
	csrf    string
	created time.Time
	expires time.Time

	mu    sync.Mutex
	flash *flash
	live  int // open live streams
}

// flash is a message shown once, on the next page the session loads.
type flash struct {
	Kind string // ok | error
	Text string
}

func (s *session) setFlash(kind, text string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.flash = &flash{Kind: kind, Text: text}
}

func (s *session) takeFlash() *flash {
	s.mu.Lock()
	defer s.mu.Unlock()
	f := s.flash
	s.flash = nil
	return f
}

// validCSRF reports whether a form's token is the session's.
func (s *session) validCSRF(token string) bool {
	return token != "" && subtle.ConstantTimeCompare([]byte(token), []byte(s.csrf)) == 1
}

// sessions are the signed-in browsers of this process.
type sessions struct {
	ttl    time.Duration
	secure bool
	now    func() time.Time

	mu sync.Mutex
	m  map[string]*session
}

func newSessions(ttl time.Duration, secure bool) *sessions {
	return &sessions{ttl: ttl, secure: secure, now: time.Now, m: map[string]*session{}}
}

// randomToken is 32 random bytes, URL-safe.
func randomToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // never fails (crypto/rand panics rather than return short)
	return base64.RawURLEncoding.EncodeToString(b)
}

// create starts a session for an operator token and sets its cookie.
func (ss *sessions) create(w http.ResponseWriter, token, tokenID string) *session {
	now := ss.now()
	s := &session{id: randomToken(), token: token, tokenID: tokenID, csrf: randomToken(), created: now, expires: now.Add(ss.ttl)}
	ss.mu.Lock()
	ss.dropExpiredLocked(now)
	if len(ss.m) >= maxSessions {
		var oldest *session
		for _, o := range ss.m {
			if oldest == nil || o.created.Before(oldest.created) {
				oldest = o
			}
		}
		delete(ss.m, oldest.id)
	}
	ss.m[s.id] = s
	ss.mu.Unlock()
	http.SetCookie(w, ss.cookie(sessionCookie, s.id, s.expires))
	return s
}

// get returns the request's session; nil when it has none, or it ended.
func (ss *sessions) get(r *http.Request) *session {
	c, err := r.Cookie(sessionCookie)
	if err != nil || c.Value == "" {
		return nil
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	s := ss.m[c.Value]
	if s == nil {
		return nil
	}
	if !ss.now().Before(s.expires) {
		delete(ss.m, s.id)
		return nil
	}
	return s
}

// alive reports whether s is still a session (not ended, not expired).
func (ss *sessions) alive(s *session) bool {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.m[s.id] == s && ss.now().Before(s.expires)
}

// end ends a session and clears its cookie.
func (ss *sessions) end(w http.ResponseWriter, s *session) {
	if s != nil {
		ss.mu.Lock()
		delete(ss.m, s.id)
		ss.mu.Unlock()
	}
	http.SetCookie(w, ss.cookie(sessionCookie, "", time.Unix(0, 0)))
}

// count is how many sessions are open.
func (ss *sessions) count() int {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	ss.dropExpiredLocked(ss.now())
	return len(ss.m)
}

func (ss *sessions) dropExpiredLocked(now time.Time) {
	for id, s := range ss.m {
		if !now.Before(s.expires) {
			delete(ss.m, id)
		}
	}
}

// cookie is a cookie the browser sends back only to this console, never
// to a script, never on a cross-site request; Secure when served over TLS
// (or behind a TLS proxy, console.secure_cookie).
func (ss *sessions) cookie(name, value string, expires time.Time) *http.Cookie {
	c := &http.Cookie{Name: name, Value: value, Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: ss.secure}
	if value == "" {
		c.MaxAge = -1
	} else {
		c.Expires = expires
	}
	return c
}

// loginToken returns the sign-in form's anti-forgery token, setting its
// cookie when the browser has none.
func (ss *sessions) loginToken(w http.ResponseWriter, r *http.Request) string {
	if c, err := r.Cookie(loginCookie); err == nil && len(c.Value) >= 32 {
		return c.Value
	}
	t := randomToken()
	http.SetCookie(w, ss.cookie(loginCookie, t, ss.now().Add(time.Hour)))
	return t
}

// validLogin reports whether a sign-in form came from a page this console
// served to the same browser.
func validLogin(r *http.Request) bool {
	c, err := r.Cookie(loginCookie)
	form := r.PostFormValue("csrf")
	return err == nil && form != "" && subtle.ConstantTimeCompare([]byte(c.Value), []byte(form)) == 1
}
