package console

import (
	"context"
	"net/http"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	ctrlv1 "krane.dev/proto/krane/ctrl/v1"
)

// maxForm bounds a form's body.
const maxForm = 64 << 10

type loginPage struct {
	CSRF    string
	Next    string
	Error   string
	Notice  string
	Refused bool
}

func (c *Console) loginPage(w http.ResponseWriter, r *http.Request) {
	next := localPath(r.URL.Query().Get("next"), "/fleet")
	if s, _ := c.sessions.get(r); s != nil {
		http.Redirect(w, r, next, http.StatusSeeOther)
		return
	}
	p := loginPage{CSRF: c.sessions.loginToken(w, r), Next: next}
	if r.URL.Query().Has("signedout") {
		p.Notice = "You are signed out."
	}
	c.renderLogin(w, r, http.StatusOK, p)
}

func (c *Console) renderLogin(w http.ResponseWriter, r *http.Request, code int, p loginPage) {
	v := c.newView(r, nil, "")
	v.Title = "Sign in"
	v.Page = p
	c.render(w, code, "login", v)
}

// signIn exchanges an operator token for a session. The token is checked
// by a call of the operator API with it, so ctrl's authentication decides,
// exactly as for the CLI.
func (c *Console) signIn(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxForm)
	if err := r.ParseForm(); err != nil {
		http.Error(w, "unreadable form", http.StatusBadRequest)
		return
	}
	next := localPath(r.PostFormValue("next"), "/fleet")
	refuse := func(code int, result, msg string) {
		c.m.signIns.WithLabelValues(result).Inc()
		c.renderLogin(w, r, code, loginPage{CSRF: c.sessions.loginToken(w, r), Next: next, Error: msg, Refused: true})
	}
	if !validLogin(r) {
		c.log.Warn("refused a console sign-in without the form's anti-forgery token", "remote", r.RemoteAddr)
		refuse(http.StatusForbidden, "forged", "The sign-in form was not the one this console served to this browser (or it expired). Sign in again from this page.")
		return
	}
	token := strings.TrimSpace(r.PostFormValue("token"))
	id, operator, ok := tokenKind(token)
	switch {
	case token == "":
		refuse(http.StatusUnauthorized, "refused", "Enter an operator token.")
		return
	case !ok:
		refuse(http.StatusUnauthorized, "refused", "That is not a Krane token: an operator token looks like krane_o_… (`ctrl admin token create-operator --name NAME` prints one).")
		return
	case !operator:
		c.log.Info("refused a console sign-in with a cluster token", "token_id", id, "remote", r.RemoteAddr)
		refuse(http.StatusForbidden, "refused", "That is a cluster token: it may only be used by a cluster's krane, never to sign in. Use an operator token (`ctrl admin token create-operator --name NAME`).")
		return
	}
	ctx, cancel := context.WithTimeout(metadata.NewOutgoingContext(r.Context(), metadata.Pairs("authorization", "Bearer "+token)), c.o.CallTimeout)
	defer cancel()
	if _, err := c.fleet.ListClusters(ctx, &ctrlv1.ListClustersRequest{}); err != nil {
		st := status.Convert(err)
		switch st.Code() {
		case codes.Unauthenticated, codes.PermissionDenied:
			c.log.Info("refused a console sign-in", "token_id", id, "remote", r.RemoteAddr, "reason", st.Message())
			refuse(http.StatusUnauthorized, "refused", "ctrl refused this token: "+st.Message())
		default:
			refuse(http.StatusServiceUnavailable, "failed", "ctrl could not check the token right now ("+st.Message()+"); try again.")
		}
		return
	}
	if err := c.sessions.create(r.Context(), w, token, id); err != nil {
		c.log.Error("storing a console session failed", "token_id", id, "remote", r.RemoteAddr, "error", err)
		refuse(http.StatusServiceUnavailable, "failed", "ctrl could not keep your session (its database did not answer); try again.")
		return
	}
	http.SetCookie(w, c.sessions.cookie(loginCookie, "", time.Time{}))
	c.m.signIns.WithLabelValues("ok").Inc()
	c.log.Info("console sign-in", "token_id", id, "remote", r.RemoteAddr)
	http.Redirect(w, r, next, http.StatusSeeOther)
}

func (c *Console) signOut(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxForm)
	s, err := c.sessions.get(r)
	if err != nil {
		c.message(w, r, http.StatusServiceUnavailable, "Unavailable", storeUnavailable(err))
		return
	}
	if s == nil {
		http.Redirect(w, r, "/login?signedout=1", http.StatusSeeOther)
		return
	}
	if !s.validCSRF(r.PostFormValue("csrf")) {
		c.forged(w, r, s, "sign-out")
		return
	}
	if err := c.sessions.end(r.Context(), w, s); err != nil {
		c.log.Error("ending a console session failed", "token_id", s.tokenID, "error", err)
		c.message(w, r, http.StatusServiceUnavailable, "Unavailable", "ctrl could not end your session (its database did not answer); sign out again.")
		return
	}
	c.log.Info("console sign-out", "token_id", s.tokenID, "remote", r.RemoteAddr)
	http.Redirect(w, r, "/login?signedout=1", http.StatusSeeOther)
}

// forged refuses a form without the session's anti-forgery token.
func (c *Console) forged(w http.ResponseWriter, r *http.Request, s *session, action string) {
	c.log.Warn("refused a console action without the session's anti-forgery token", "action", action, "token_id", s.tokenID, "remote", r.RemoteAddr)
	c.m.actions.WithLabelValues(action, "forged").Inc()
	c.message(w, r, http.StatusForbidden, "Refused",
		"This form did not come from a page of your session (its anti-forgery token is missing or wrong). Nothing was done. Go back, reload the page and try again.")
}
