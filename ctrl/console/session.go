package console

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"krane.dev/ctrl/store"
)

// Cookie names. The session cookie carries a random secret: the database
// keeps its hash and the operator token sealed with a key derived from it.
const (
	sessionCookie = "krane_console"
	// loginCookie binds the sign-in form to the browser that loaded it
	// (double-submit: the form's hidden field must equal the cookie).
	loginCookie = "krane_console_login"
)

// maxSessions bounds the sessions kept; past it the oldest ends.
// maxSessionsPerToken bounds one operator token's; past it that token's
// oldest ends, so no one token signing in over and over ends the others'.
const (
	maxSessions         = 10000
	maxSessionsPerToken = 20
)

// sessionRecheck is how long a replica trusts a session it read: a
// sign-out on another replica ends this replica's live streams of it
// within this time (on this replica, at once).
const sessionRecheck = time.Second

// SessionStore keeps the console's sessions where every ctrl replica
// reads them (in ctrl serve: the database, *store.Store).
type SessionStore interface {
	CreateConsoleSession(ctx context.Context, cs store.ConsoleSession, max, perToken int) error
	// GetConsoleSession returns store.ErrNotFound for no session, or an
	// expired one.
	GetConsoleSession(ctx context.Context, idHash []byte) (store.ConsoleSession, error)
	EndConsoleSession(ctx context.Context, idHash []byte) error
	SetConsoleFlash(ctx context.Context, idHash []byte, kind, text string) error
	ClearConsoleFlash(ctx context.Context, idHash []byte) error
	CountConsoleSessions(ctx context.Context) (int, error)
}

// session is one signed-in browser, as this request sees it.
type session struct {
	key     string // the hash of the cookie's secret (the database's key)
	token   string // the operator token every API call carries
	tokenID string // its public id, shown and logged
	csrf    string
	expires time.Time
	flash   *flash
}

// flash is a message shown once, on the next page the session loads.
type flash struct {
	Kind string // ok | error
	Text string
}

// validCSRF reports whether a form's token is the session's.
func (s *session) validCSRF(token string) bool {
	return token != "" && subtle.ConstantTimeCompare([]byte(token), []byte(s.csrf)) == 1
}

// sessions are the signed-in browsers, kept in a SessionStore.
type sessions struct {
	store  SessionStore
	ttl    time.Duration
	secure bool
	max    int // sessions kept; past it the oldest ends

	mu sync.Mutex
	// checked holds when each session (by key) was last found alive, for
	// live streams, which check every tick.
	checked map[string]time.Time
}

func newSessions(st SessionStore, ttl time.Duration, secure bool) *sessions {
	return &sessions{store: st, ttl: ttl, secure: secure, max: maxSessions, checked: map[string]time.Time{}}
}

// randomToken is 32 random bytes, URL-safe.
func randomToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // never fails (crypto/rand panics rather than return short)
	return base64.RawURLEncoding.EncodeToString(b)
}

// keys derives from a cookie's secret what the session stores and checks:
// the database key (a hash), the key the token is sealed with, and the
// anti-forgery token of its forms.
type keys struct {
	idHash []byte
	seal   []byte
	csrf   string
}

func derive(secret []byte) keys {
	h := sha256.Sum256(append([]byte("krane console session id\x00"), secret...))
	k := keys{idHash: h[:]}
	k.seal, _ = hkdf.Key(sha256.New, secret, nil, "krane console session token", 32) // sha256 and 32 bytes: never fails
	csrf, _ := hkdf.Key(sha256.New, secret, nil, "krane console session csrf", 24)
	k.csrf = base64.RawURLEncoding.EncodeToString(csrf)
	return k
}

func seal(key []byte, plain, aad []byte) []byte {
	block, _ := aes.NewCipher(key) // 32 bytes: never fails
	gcm, _ := cipher.NewGCM(block)
	nonce := make([]byte, gcm.NonceSize())
	_, _ = rand.Read(nonce)
	return gcm.Seal(nonce, nonce, plain, aad)
}

func unseal(key, sealed, aad []byte) ([]byte, error) {
	block, _ := aes.NewCipher(key)
	gcm, _ := cipher.NewGCM(block)
	if len(sealed) < gcm.NonceSize() {
		return nil, errors.New("sealed token too short")
	}
	return gcm.Open(nil, sealed[:gcm.NonceSize()], sealed[gcm.NonceSize():], aad)
}

// create starts a session for an operator token and sets its cookie.
func (ss *sessions) create(ctx context.Context, w http.ResponseWriter, token, tokenID string) error {
	secret := make([]byte, 32)
	_, _ = rand.Read(secret)
	k := derive(secret)
	now := time.Now()
	cs := store.ConsoleSession{IDHash: k.idHash, TokenID: tokenID, SealedToken: seal(k.seal, []byte(token), k.idHash), CreatedAt: now, ExpiresAt: now.Add(ss.ttl)}
	if err := ss.store.CreateConsoleSession(ctx, cs, ss.max, maxSessionsPerToken); err != nil {
		return err
	}
	http.SetCookie(w, ss.cookie(sessionCookie, base64.RawURLEncoding.EncodeToString(secret), cs.ExpiresAt))
	return nil
}

// get returns the request's session; nil when it has none (no cookie, a
// forged one, signed out, expired). An error is the store's.
func (ss *sessions) get(r *http.Request) (*session, error) {
	c, err := r.Cookie(sessionCookie)
	if err != nil || c.Value == "" {
		return nil, nil
	}
	secret, err := base64.RawURLEncoding.DecodeString(c.Value)
	if err != nil || len(secret) != 32 {
		return nil, nil
	}
	k := derive(secret)
	cs, err := ss.store.GetConsoleSession(r.Context(), k.idHash)
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	token, err := unseal(k.seal, cs.SealedToken, k.idHash)
	if err != nil {
		return nil, nil // not sealed for this secret: no session of this cookie
	}
	s := &session{key: string(k.idHash), token: string(token), tokenID: cs.TokenID, csrf: k.csrf, expires: cs.ExpiresAt}
	if cs.FlashText != "" {
		s.flash = &flash{Kind: cs.FlashKind, Text: cs.FlashText}
	}
	ss.touch(s.key)
	return s, nil
}

// alive reports whether s is still a session (not ended, not expired),
// asking the store at most every sessionRecheck.
func (ss *sessions) alive(ctx context.Context, s *session) bool {
	if !time.Now().Before(s.expires) {
		return false
	}
	ss.mu.Lock()
	at, ok := ss.checked[s.key]
	ss.mu.Unlock()
	if ok && time.Since(at) < sessionRecheck {
		return true
	}
	_, err := ss.store.GetConsoleSession(ctx, []byte(s.key))
	if errors.Is(err, store.ErrNotFound) {
		ss.forget(s)
		return false
	}
	// A store that cannot answer keeps the session: the page's next call
	// shows the error.
	ss.touch(s.key)
	return true
}

// touch notes that the session keyed key was found alive now. The notes
// are bounded: past maxSessions they start over (streams then ask the
// store once more).
func (ss *sessions) touch(key string) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if len(ss.checked) >= maxSessions {
		clear(ss.checked)
	}
	ss.checked[key] = time.Now()
}

func (ss *sessions) forget(s *session) {
	ss.mu.Lock()
	delete(ss.checked, s.key)
	ss.mu.Unlock()
}

// end ends a session and clears its cookie.
func (ss *sessions) end(ctx context.Context, w http.ResponseWriter, s *session) error {
	http.SetCookie(w, ss.cookie(sessionCookie, "", time.Unix(0, 0)))
	if s == nil {
		return nil
	}
	ss.forget(s)
	return ss.store.EndConsoleSession(context.WithoutCancel(ctx), []byte(s.key))
}

// setFlash sets the message the session's next page shows.
func (ss *sessions) setFlash(ctx context.Context, s *session, kind, text string) error {
	return ss.store.SetConsoleFlash(ctx, []byte(s.key), kind, text)
}

// takeFlash returns the session's message and clears it.
func (ss *sessions) takeFlash(ctx context.Context, s *session) *flash {
	f := s.flash
	if f != nil {
		if err := ss.store.ClearConsoleFlash(ctx, []byte(s.key)); err != nil {
			// Shown again on the next page; better than lost.
			return f
		}
		s.flash = nil
	}
	return f
}

// count is how many sessions are open (on every replica).
func (ss *sessions) count(ctx context.Context) (int, error) {
	return ss.store.CountConsoleSessions(ctx)
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
	http.SetCookie(w, ss.cookie(loginCookie, t, time.Now().Add(time.Hour)))
	return t
}

// validLogin reports whether a sign-in form came from a page this console
// served to the same browser.
func validLogin(r *http.Request) bool {
	c, err := r.Cookie(loginCookie)
	form := r.PostFormValue("csrf")
	return err == nil && form != "" && subtle.ConstantTimeCompare([]byte(c.Value), []byte(form)) == 1
}

// storeUnavailable is the message of a page the session store could not
// answer for.
func storeUnavailable(err error) string {
	return fmt.Sprintf("ctrl could not read your session (its database did not answer: %v); reload to try again.", err)
}
