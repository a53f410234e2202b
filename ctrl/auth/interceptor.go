package auth

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"krane.dev/ctrl/store"
)

// Metadata keys a cluster may send; when present they must match its token.
const (
	RegionHeader    = "x-krane-region"
	ClusterIDHeader = "x-krane-cluster-id"
)

// Identity is the authenticated caller, put in the call's context.
type Identity struct {
	Kind      store.TokenKind
	TokenID   string
	ClusterID string    // cluster tokens
	Region    string    // cluster tokens
	Name      string    // operator tokens
	ExpiresAt time.Time // zero: the token never expires
}

type identityKey struct{}

// FromContext returns the caller's identity set by the interceptors.
func FromContext(ctx context.Context) (Identity, bool) {
	id, ok := ctx.Value(identityKey{}).(Identity)
	return id, ok
}

// CallerName names an operator call's caller for logs: the operator
// token's name, or "an operator".
func CallerName(ctx context.Context) string {
	if id, ok := FromContext(ctx); ok && id.Name != "" {
		return id.Name
	}
	return "an operator"
}

// WithIdentity returns ctx carrying id (for tests of handlers).
func WithIdentity(ctx context.Context, id Identity) context.Context {
	return context.WithValue(ctx, identityKey{}, id)
}

// TokenStore is where tokens are looked up and revoked (*store.Store).
type TokenStore interface {
	LookupToken(ctx context.Context, id string) (store.Token, error)
	LookupTokens(ctx context.Context, ids []string) ([]store.Token, error)
	// RevokedTokensRead is the tokens revoked since since, with the
	// database's time just before the read.
	RevokedTokensRead(ctx context.Context, since time.Time) ([]store.Token, time.Time, error)
	// RecordRevocationsRead says that this replica has read the
	// revocations committed before readAt (the database's time): a revoke
	// waits for every replica to say so.
	RecordRevocationsRead(ctx context.Context, replica, version string, startedAt, readAt time.Time) error
	RevokeToken(ctx context.Context, id string) (store.Token, bool, error)
}

// Options tune an Authenticator. Zero values take the defaults.
type Options struct {
	// CacheTTL is how long a looked-up token is trusted before it is read
	// again. A revocation seen by this ctrl (Revoke, WatchRevocations)
	// drops the token from the cache at once; the TTL bounds staleness only
	// when the revocation poll cannot read the database. Default and
	// maximum 2s.
	CacheTTL time.Duration
	// RevocationPollInterval is how often WatchRevocations reads the
	// tokens revoked recently (by the CLI or another ctrl) and closes their
	// open streams. Default 250ms.
	RevocationPollInterval time.Duration
	// RecheckInterval is how often WatchRevocations checks the tokens of
	// all open streams again, in one query: the safety net for a
	// revocation the poll cannot see (a revoked_at stamped by a clock more
	// than a minute behind, a row changed by hand). Default 1m.
	RecheckInterval time.Duration
	Logger          hclog.Logger
	// Registerer receives the auth metrics; nil registers none.
	Registerer prometheus.Registerer
	// Replica names this ctrl among the replicas sharing the database,
	// Version its release: WatchRevocations records, after each read of
	// the revoked tokens, how far it read (the revoking command waits for
	// every replica). Empty: nothing is recorded.
	Replica, Version string
}

// Authenticator checks the bearer token of every call, and keeps a
// registry of the open streams by token, so that revoking a token (or its
// expiry) closes them at once.
type Authenticator struct {
	tokens    TokenStore
	replica   string
	version   string
	started   time.Time
	ttl       time.Duration
	pollEvery time.Duration
	recheck   time.Duration
	log       hclog.Logger
	m         metrics

	mu    sync.Mutex
	cache map[string]cachedToken
	// streams are the open streams by token id.
	streams map[string]map[*openStream]struct{}
	// revoked are the token ids this ctrl saw revoked, with when it did.
	// A token in it opens no stream and passes no call even if a lookup
	// that started before the revocation put it back in the cache.
	revoked map[string]time.Time
}

type cachedToken struct {
	tok     store.Token
	fetched time.Time
	used    time.Time // the last call that read it
}

// refreshIdle is how long a cached token stays refreshed in the
// background after its last use (WatchRevocations re-reads the tokens in
// use, many in one query, before their cache time runs out, so a fleet's
// calls do not each read their token again every CacheTTL).
const refreshIdle = time.Minute

type metrics struct {
	denied      *prometheus.CounterVec
	ended       *prometheus.CounterVec
	open        prometheus.Gauge
	pollErrors  prometheus.Counter
	lastPollAge prometheus.GaugeFunc
	lastPoll    atomic.Int64 // unix nanoseconds of the last successful poll
}

// Reasons a stream is ended by the authenticator (label of
// krane_ctrl_auth_streams_ended_total).
const (
	EndRevoked = "revoked"
	EndExpired = "expired"
)

// maxCachedTokens bounds the token cache.
const maxCachedTokens = 1 << 20

// revokedMemory is how long a revocation is remembered in memory (see
// Authenticator.revoked); after it, the database answers alone.
const revokedMemory = 10 * time.Minute

// revocationLookback is how far before its last successful poll
// WatchRevocations looks for revocations: it covers the time between a
// revocation's timestamp and its commit, and clocks of ctrl replicas and
// CLI hosts that differ by up to this much. Further skew is caught by the
// recheck of open streams.
const revocationLookback = time.Minute

// New returns an Authenticator reading tokens from tokens.
func New(tokens TokenStore, o Options) *Authenticator {
	if o.CacheTTL <= 0 || o.CacheTTL > 2*time.Second {
		o.CacheTTL = 2 * time.Second
	}
	if o.RevocationPollInterval <= 0 {
		o.RevocationPollInterval = 250 * time.Millisecond
	}
	if o.RecheckInterval <= 0 {
		o.RecheckInterval = time.Minute
	}
	if o.Logger == nil {
		o.Logger = hclog.NewNullLogger()
	}
	a := &Authenticator{
		tokens: tokens, replica: o.Replica, version: o.Version, started: time.Now(), ttl: o.CacheTTL, pollEvery: o.RevocationPollInterval, recheck: o.RecheckInterval, log: o.Logger.Named("auth"),
		cache: map[string]cachedToken{}, streams: map[string]map[*openStream]struct{}{}, revoked: map[string]time.Time{},
	}
	a.m.denied = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "krane", Subsystem: "ctrl", Name: "auth_denied_total",
		Help: "Calls refused by authentication, by gRPC code.",
	}, []string{"code"})
	a.m.ended = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "krane", Subsystem: "ctrl", Name: "auth_streams_ended_total",
		Help: "Open streams closed with UNAUTHENTICATED because their token was revoked or expired, by reason.",
	}, []string{"reason"})
	a.m.open = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: "krane", Subsystem: "ctrl", Name: "auth_open_streams",
		Help: "Authenticated streams open on this ctrl (each is closed when its token is revoked or expires).",
	})
	a.m.pollErrors = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: "krane", Subsystem: "ctrl", Name: "auth_revocation_poll_errors_total",
		Help: "Failed reads of revoked tokens (while they fail, a revocation made elsewhere does not close this ctrl's streams).",
	})
	a.m.lastPollAge = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "krane", Subsystem: "ctrl", Name: "auth_revocation_poll_age_seconds",
		Help: "Seconds since revoked tokens were last read successfully (-1 before the first read).",
	}, func() float64 {
		last := a.m.lastPoll.Load()
		if last == 0 {
			return -1
		}
		return time.Since(time.Unix(0, last)).Seconds()
	})
	for _, l := range []string{EndRevoked, EndExpired} {
		a.m.ended.WithLabelValues(l)
	}
	if o.Registerer != nil {
		o.Registerer.MustRegister(a.m.denied, a.m.ended, a.m.open, a.m.pollErrors, a.m.lastPollAge)
	}
	return a
}

// scope is which token kind a method needs.
type scope int

const (
	scopeOperator scope = iota
	scopeCluster
	scopePublic
)

func scopeOf(fullMethod string) scope {
	switch {
	case strings.HasPrefix(fullMethod, "/krane.cluster.v1.ClusterService/"):
		return scopeCluster
	case strings.HasPrefix(fullMethod, "/grpc.health.v1.Health/"):
		return scopePublic
	default:
		// krane.ctrl.v1.* and anything else: operators only, so a service
		// added later is closed to clusters until someone decides otherwise.
		return scopeOperator
	}
}

// UnaryInterceptor authenticates unary calls.
func (a *Authenticator) UnaryInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		ctx, _, err := a.authenticate(ctx, info.FullMethod)
		if err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}
}

// openStream is an authenticated stream in the registry.
type openStream struct {
	id     Identity
	method string
	cancel context.CancelCauseFunc
	ended  atomic.Bool
}

// streamEnded is the cause of a stream's context when the authenticator
// closed it.
type streamEnded struct {
	reason string
	id     Identity
}

func (e *streamEnded) Error() string { return "token " + e.reason }

// status is what the client receives.
func (e *streamEnded) status() error {
	if e.reason == EndExpired {
		return status.Errorf(codes.Unauthenticated, "token %s expired at %s; the stream was closed: %s",
			e.id.TokenID, e.id.ExpiresAt.UTC().Format(time.RFC3339), renewHint(e.id))
	}
	return status.Errorf(codes.Unauthenticated, "token %s was revoked; the stream was closed: %s", e.id.TokenID, renewHint(e.id))
}

// renewHint says how the holder of a refused token gets a valid one.
func renewHint(id Identity) string {
	if id.Kind == store.ClusterToken {
		return fmt.Sprintf("this cluster needs a new token (an operator runs `ctrl admin cluster register --region %s --cluster %s` and puts it in krane's configuration)", id.Region, id.ClusterID)
	}
	return "ask an operator for a new token (`ctrl admin token create-operator --name NAME`)"
}

// StreamInterceptor authenticates streams and keeps them in the registry
// while they are open. A stream ends with UNAUTHENTICATED when its token is
// revoked (Revoke, WatchRevocations) or expires (a timer per stream); after
// that it sends nothing more.
func (a *Authenticator) StreamInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		ctx, id, err := a.authenticate(ss.Context(), info.FullMethod)
		if err != nil {
			return err
		}
		if id == nil { // public method
			return handler(srv, ss)
		}
		ctx, cancel := context.WithCancelCause(ctx)
		defer cancel(nil)
		s := &openStream{id: *id, method: info.FullMethod, cancel: cancel}
		if !a.register(s) {
			// Revoked between the check and now.
			return a.deny(ctx, info.FullMethod, codes.Unauthenticated, id.TokenID, fmt.Sprintf("token %s was revoked: %s", id.TokenID, renewHint(*id)))
		}
		defer a.unregister(s)
		if !id.ExpiresAt.IsZero() {
			timer := time.AfterFunc(time.Until(id.ExpiresAt), func() { a.end(s, EndExpired) })
			defer timer.Stop()
		}
		err = handler(srv, &identityStream{ServerStream: ss, ctx: ctx})
		var ended *streamEnded
		if errors.As(context.Cause(ctx), &ended) {
			return ended.status()
		}
		return err
	}
}

// register adds s to the registry, unless its token is known revoked.
func (a *Authenticator) register(s *openStream) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, gone := a.revoked[s.id.TokenID]; gone {
		return false
	}
	set := a.streams[s.id.TokenID]
	if set == nil {
		set = map[*openStream]struct{}{}
		a.streams[s.id.TokenID] = set
	}
	set[s] = struct{}{}
	a.m.open.Inc()
	return true
}

func (a *Authenticator) unregister(s *openStream) {
	a.mu.Lock()
	defer a.mu.Unlock()
	set := a.streams[s.id.TokenID]
	if _, ok := set[s]; !ok {
		return
	}
	delete(set, s)
	if len(set) == 0 {
		delete(a.streams, s.id.TokenID)
	}
	a.m.open.Dec()
}

// end closes one stream for reason (once).
func (a *Authenticator) end(s *openStream, reason string) {
	if !s.ended.CompareAndSwap(false, true) {
		return
	}
	a.m.ended.WithLabelValues(reason).Inc()
	msg := "closing stream: its token was revoked"
	if reason == EndExpired {
		msg = "closing stream: its token expired"
	}
	a.log.Info(msg, "token_id", s.id.TokenID, "method", s.method, "cluster_id", s.id.ClusterID, "region", s.id.Region, "name", s.id.Name)
	s.cancel(&streamEnded{reason: reason, id: s.id})
}

// endToken closes every open stream of token id for reason.
func (a *Authenticator) endToken(id, reason string) {
	a.mu.Lock()
	ending := make([]*openStream, 0, len(a.streams[id]))
	for s := range a.streams[id] {
		ending = append(ending, s)
	}
	a.mu.Unlock()
	for _, s := range ending {
		a.end(s, reason)
	}
}

// tokensRevoked records that the tokens ids are revoked: they leave the
// cache, open no more streams, and their open streams are closed.
func (a *Authenticator) tokensRevoked(ids ...string) {
	now := time.Now()
	var ending []*openStream
	a.mu.Lock()
	for _, id := range ids {
		if _, seen := a.revoked[id]; seen {
			continue // its streams were closed and no new one could open
		}
		a.revoked[id] = now
		delete(a.cache, id)
		for s := range a.streams[id] {
			ending = append(ending, s)
		}
	}
	a.mu.Unlock()
	for _, s := range ending {
		a.end(s, EndRevoked)
	}
}

func (a *Authenticator) knownRevoked(id string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	_, ok := a.revoked[id]
	return ok
}

// Revoke revokes token id in the database and closes its open streams on
// this ctrl at once; other ctrls close theirs within their revocation poll
// interval. It returns the token as stored; store.ErrNotFound if there is
// none. Revoking a revoked token again is not an error.
func (a *Authenticator) Revoke(ctx context.Context, id string) (store.Token, error) {
	tok, _, err := a.tokens.RevokeToken(ctx, id)
	if err != nil {
		return store.Token{}, err
	}
	a.tokensRevoked(id)
	return tok, nil
}

// OpenStreams is how many authenticated streams token id has open here.
func (a *Authenticator) OpenStreams(id string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.streams[id])
}

// WatchRevocations closes the open streams of tokens revoked anywhere (by
// `ctrl admin token revoke`, `ctrl admin cluster revoke`, another ctrl) until ctx ends:
// every RevocationPollInterval it reads the tokens revoked since shortly
// before its last successful read (one indexed range scan, usually empty),
// and every RecheckInterval it checks the tokens of all open streams again.
// ctrl serve runs it; without it, only Revoke on this Authenticator and
// expiry close streams.
func (a *Authenticator) WatchRevocations(ctx context.Context) {
	poll := time.NewTicker(a.pollEvery)
	defer poll.Stop()
	lastOK := time.Now()
	lastRecheck, lastRefresh := lastOK, lastOK
	failing := false
	// The first read at once: the replica is known to a revoking command
	// (RecordRevocationsRead) from its start.
	for first := true; ; first = false {
		if !first {
			select {
			case <-ctx.Done():
				return
			case <-poll.C:
			}
		}
		start := time.Now()
		if toks, readAt, err := a.tokens.RevokedTokensRead(ctx, lastOK.Add(-revocationLookback)); err != nil {
			if ctx.Err() != nil {
				return
			}
			a.m.pollErrors.Inc()
			if !failing {
				a.log.Warn("cannot read revoked tokens; retrying every poll interval (meanwhile a token revoked elsewhere keeps its streams on this ctrl)", "error", err)
				failing = true
			}
		} else {
			if failing {
				a.log.Info("reading revoked tokens again")
				failing = false
			}
			lastOK = start
			a.m.lastPoll.Store(start.UnixNano())
			ids := make([]string, len(toks))
			for i, t := range toks {
				ids[i] = t.ID
			}
			a.tokensRevoked(ids...)
			// Only now, with their streams closed and the cache rid of
			// them, are these revocations read.
			if a.replica != "" {
				if err := a.tokens.RecordRevocationsRead(ctx, a.replica, a.version, a.started, readAt); err != nil && ctx.Err() == nil {
					a.log.Warn("cannot record how far this ctrl read the revoked tokens; `ctrl admin token revoke` waits for it meanwhile", "error", err)
				}
			}
		}
		// Independent of the poll: it also covers a poll that keeps failing
		// while single-token reads work.
		if start.Sub(lastRecheck) >= a.recheck {
			lastRecheck = start
			if err := a.recheckOpen(ctx); err != nil && ctx.Err() == nil {
				a.log.Warn("cannot recheck the tokens of open streams; trying again in a recheck interval", "error", err)
			}
		}
		if start.Sub(lastRefresh) >= a.ttl/2 {
			lastRefresh = start
			if err := a.refresh(ctx, start); err != nil && ctx.Err() == nil {
				a.log.Warn("cannot re-read the cached tokens in use; calls read their own until it works again", "error", err)
			}
		}
		a.forgetRevoked(start)
	}
}

// refresh re-reads, in one query per 500, the cached tokens used within
// refreshIdle whose cache time is half gone, and drops those unused for
// longer: the tokens of a fleet's calls stay cached without a read per
// call and CacheTTL. A token found revoked or gone leaves the cache (a
// call reads it again, and is refused).
func (a *Authenticator) refresh(ctx context.Context, now time.Time) error {
	a.mu.Lock()
	var ids []string
	for id, c := range a.cache {
		switch {
		case now.Sub(c.used) > refreshIdle:
			delete(a.cache, id)
		case now.Sub(c.fetched) >= a.ttl/2:
			ids = append(ids, id)
		}
	}
	a.mu.Unlock()
	if len(ids) == 0 {
		return nil
	}
	toks, err := a.tokens.LookupTokens(ctx, ids)
	if err != nil {
		return err
	}
	found := make(map[string]store.Token, len(toks))
	for _, t := range toks {
		found[t.ID] = t
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, id := range ids {
		c, ok := a.cache[id]
		if !ok || c.fetched.After(now) {
			continue // dropped, or read again by a call meanwhile
		}
		t, exists := found[id]
		if !exists || t.Revoked() {
			delete(a.cache, id)
			continue
		}
		// LookupTokens reads no hashes; a token's hash never changes.
		t.SecretHash = c.tok.SecretHash
		c.tok, c.fetched = t, now
		a.cache[id] = c
	}
	return nil
}

// recheckOpen reads the tokens of every open stream and closes the streams
// of those revoked, expired or gone.
func (a *Authenticator) recheckOpen(ctx context.Context) error {
	a.mu.Lock()
	ids := make([]string, 0, len(a.streams))
	for id := range a.streams {
		ids = append(ids, id)
	}
	a.mu.Unlock()
	if len(ids) == 0 {
		return nil
	}
	toks, err := a.tokens.LookupTokens(ctx, ids)
	if err != nil {
		return err
	}
	now := time.Now()
	found := make(map[string]store.Token, len(toks))
	for _, t := range toks {
		found[t.ID] = t
	}
	var gone []string
	for _, id := range ids {
		t, ok := found[id]
		switch {
		case !ok || t.Revoked():
			gone = append(gone, id)
		case t.Expired(now):
			a.endToken(id, EndExpired)
		}
	}
	a.tokensRevoked(gone...)
	return nil
}

// forgetRevoked drops revocations older than revokedMemory.
func (a *Authenticator) forgetRevoked(now time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for id, at := range a.revoked {
		if now.Sub(at) > revokedMemory {
			delete(a.revoked, id)
		}
	}
}

// identityStream is a stream whose context carries the identity and ends
// with the token; it sends nothing once the authenticator closed it.
type identityStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *identityStream) Context() context.Context { return s.ctx }

func (s *identityStream) SendMsg(m any) error {
	var ended *streamEnded
	if errors.As(context.Cause(s.ctx), &ended) {
		return ended.status()
	}
	return s.ServerStream.SendMsg(m)
}

// authenticate checks the call's token against the method's scope and
// returns a context carrying the identity (nil for a public method).
// Errors never contain the token.
func (a *Authenticator) authenticate(ctx context.Context, method string) (context.Context, *Identity, error) {
	sc := scopeOf(method)
	if sc == scopePublic {
		return ctx, nil, nil
	}
	md, _ := metadata.FromIncomingContext(ctx)
	raw := first(md, "authorization")
	if raw == "" {
		return nil, nil, a.deny(ctx, method, codes.Unauthenticated, "", "missing bearer token: send the metadata `authorization: Bearer <token>`")
	}
	scheme, token, ok := strings.Cut(raw, " ")
	if !ok || !strings.EqualFold(scheme, "bearer") {
		return nil, nil, a.deny(ctx, method, codes.Unauthenticated, "", "the authorization metadata must be `Bearer <token>`")
	}
	parsed, err := Parse(strings.TrimSpace(token))
	if err != nil {
		return nil, nil, a.deny(ctx, method, codes.Unauthenticated, "", err.Error())
	}
	tok, err := a.verify(ctx, parsed)
	if err != nil {
		st, _ := status.FromError(err)
		return nil, nil, a.deny(ctx, method, st.Code(), parsed.ID, st.Message())
	}
	switch {
	case sc == scopeCluster && tok.Kind != store.ClusterToken:
		return nil, nil, a.deny(ctx, method, codes.PermissionDenied, tok.ID, "the ClusterService needs a cluster token (`ctrl admin cluster register`); this is an operator token")
	case sc == scopeOperator && tok.Kind != store.OperatorToken:
		return nil, nil, a.deny(ctx, method, codes.PermissionDenied, tok.ID, "this API needs an operator token (`ctrl admin token create-operator`); cluster tokens may only call the ClusterService")
	}
	if tok.Kind == store.ClusterToken {
		if r := first(md, RegionHeader); r != "" && r != tok.Region {
			return nil, nil, a.deny(ctx, method, codes.PermissionDenied, tok.ID, "the "+RegionHeader+" metadata ("+r+") is not the region this token is bound to")
		}
		if c := first(md, ClusterIDHeader); c != "" && c != tok.ClusterID {
			return nil, nil, a.deny(ctx, method, codes.PermissionDenied, tok.ID, "the "+ClusterIDHeader+" metadata ("+c+") is not the cluster this token is bound to")
		}
	}
	id := identityOf(tok)
	return WithIdentity(ctx, id), &id, nil
}

func identityOf(t store.Token) Identity {
	return Identity{Kind: t.Kind, TokenID: t.ID, ClusterID: t.ClusterID, Region: t.Region, Name: t.Name, ExpiresAt: t.ExpiresAt}
}

// verify checks a parsed token against the stored hash, through the cache.
// The cache holds the stored record, not the verdict, so a wrong secret for
// a cached id is still refused. Only a caller holding the right secret
// learns that its token was revoked or expired.
func (a *Authenticator) verify(ctx context.Context, p Parsed) (store.Token, error) {
	tok, err := a.lookup(ctx, p.ID)
	if errors.Is(err, store.ErrNotFound) {
		return store.Token{}, status.Error(codes.Unauthenticated, "unknown or revoked token")
	}
	if err != nil {
		a.log.Error("cannot read token; refusing the call", "token_id", p.ID, "error", err)
		return store.Token{}, status.Error(codes.Unavailable, "ctrl cannot check tokens right now (database unreachable); retry with backoff")
	}
	if tok.Kind != p.Kind || !Matches(p.Secret, tok.SecretHash) {
		return store.Token{}, status.Error(codes.Unauthenticated, "unknown or revoked token")
	}
	if tok.Revoked() || a.knownRevoked(tok.ID) {
		return store.Token{}, status.Errorf(codes.Unauthenticated, "token %s was revoked: %s", tok.ID, renewHint(identityOf(tok)))
	}
	if tok.Expired(time.Now()) {
		return store.Token{}, status.Errorf(codes.Unauthenticated, "token %s expired at %s: %s", tok.ID, tok.ExpiresAt.UTC().Format(time.RFC3339), renewHint(identityOf(tok)))
	}
	return tok, nil
}

func (a *Authenticator) lookup(ctx context.Context, id string) (store.Token, error) {
	now := time.Now()
	a.mu.Lock()
	c, ok := a.cache[id]
	if ok && now.Sub(c.fetched) < a.ttl {
		c.used = now
		a.cache[id] = c
		a.mu.Unlock()
		return c.tok, nil
	}
	a.mu.Unlock()
	tok, err := a.tokens.LookupToken(ctx, id)
	if err != nil {
		return store.Token{}, err
	}
	a.mu.Lock()
	// Only tokens that exist are cached, so the map is bounded by the
	// tokens in the database; this bound is a safety net above any fleet.
	if len(a.cache) > maxCachedTokens {
		clear(a.cache)
	}
	a.cache[id] = cachedToken{tok: tok, fetched: now, used: now}
	a.mu.Unlock()
	return tok, nil
}

func (a *Authenticator) deny(ctx context.Context, method string, code codes.Code, tokenID, msg string) error {
	a.m.denied.WithLabelValues(code.String()).Inc()
	addr := ""
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		addr = p.Addr.String()
	}
	// Log the token's id (public) at most, never the token or the header.
	a.log.Info("call refused", "method", method, "peer", addr, "code", code.String(), "token_id", tokenID, "reason", msg)
	return status.Error(code, msg)
}

func first(md metadata.MD, key string) string {
	if v := md.Get(key); len(v) > 0 {
		return v[0]
	}
	return ""
}
