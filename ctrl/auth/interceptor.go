package auth

import (
	"context"
	"errors"
	"strings"
	"sync"
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
	ClusterID string // cluster tokens
	Region    string // cluster tokens
	Name      string // operator tokens
}

type identityKey struct{}

// FromContext returns the caller's identity set by the interceptors.
func FromContext(ctx context.Context) (Identity, bool) {
	id, ok := ctx.Value(identityKey{}).(Identity)
	return id, ok
}

// WithIdentity returns ctx carrying id (for tests of handlers).
func WithIdentity(ctx context.Context, id Identity) context.Context {
	return context.WithValue(ctx, identityKey{}, id)
}

// TokenStore is where tokens are looked up.
type TokenStore interface {
	LookupToken(ctx context.Context, id string) (store.Token, error)
}

// Options tune an Authenticator. Zero values take the defaults.
type Options struct {
	// CacheTTL is how long a looked-up token is trusted before it is read
	// again (so a revocation takes effect within it). Default and maximum 2s.
	CacheTTL time.Duration
	// RecheckInterval is how often an open stream's token is checked again;
	// a revoked token ends its streams. Default 2s.
	RecheckInterval time.Duration
	Logger          hclog.Logger
	// Registerer receives the auth metrics; nil registers none.
	Registerer prometheus.Registerer
}

// Authenticator checks the bearer token of every call.
type Authenticator struct {
	tokens  TokenStore
	ttl     time.Duration
	recheck time.Duration
	log     hclog.Logger
	denied  *prometheus.CounterVec

	mu    sync.Mutex
	cache map[string]cachedToken
}

type cachedToken struct {
	tok     store.Token
	fetched time.Time
}

// New returns an Authenticator reading tokens from tokens.
func New(tokens TokenStore, o Options) *Authenticator {
	if o.CacheTTL <= 0 || o.CacheTTL > 2*time.Second {
		o.CacheTTL = 2 * time.Second
	}
	if o.RecheckInterval <= 0 {
		o.RecheckInterval = 2 * time.Second
	}
	if o.Logger == nil {
		o.Logger = hclog.NewNullLogger()
	}
	a := &Authenticator{
		tokens: tokens, ttl: o.CacheTTL, recheck: o.RecheckInterval, log: o.Logger.Named("auth"),
		cache: map[string]cachedToken{},
		denied: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "krane", Subsystem: "ctrl", Name: "auth_denied_total",
			Help: "Calls refused by authentication, by gRPC code.",
		}, []string{"code"}),
	}
	if o.Registerer != nil {
		o.Registerer.MustRegister(a.denied)
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

// StreamInterceptor authenticates streams and re-checks their token every
// RecheckInterval, ending the stream with UNAUTHENTICATED once it is revoked.
func (a *Authenticator) StreamInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		ctx, parsed, err := a.authenticate(ss.Context(), info.FullMethod)
		if err != nil {
			return err
		}
		if parsed == nil { // public method
			return handler(srv, ss)
		}
		ctx, cancel := context.WithCancelCause(ctx)
		defer cancel(nil)
		stop := make(chan struct{})
		defer close(stop)
		go a.watchRevocation(ctx, *parsed, cancel, stop)
		err = handler(srv, &identityStream{ServerStream: ss, ctx: ctx})
		if cause := context.Cause(ctx); errors.Is(cause, errRevoked) {
			return status.Error(codes.Unauthenticated, "the token was revoked or is no longer valid; the stream was closed (obtain a new token)")
		}
		return err
	}
}

var errRevoked = errors.New("token revoked")

func (a *Authenticator) watchRevocation(ctx context.Context, p Parsed, cancel context.CancelCauseFunc, stop <-chan struct{}) {
	t := time.NewTicker(a.recheck)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-ctx.Done():
			return
		case <-t.C:
		}
		_, err := a.verify(ctx, p)
		if st, ok := status.FromError(err); ok && st.Code() == codes.Unauthenticated {
			id, _ := FromContext(ctx)
			a.log.Info("closing stream: its token is no longer valid", "token_id", p.ID, "cluster_id", id.ClusterID, "region", id.Region)
			cancel(errRevoked)
			return
		}
		// Any other error (database unreachable) keeps the stream: it fails
		// on its own database access if the outage is real.
	}
}

type identityStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *identityStream) Context() context.Context { return s.ctx }

// authenticate checks the call's token against the method's scope and
// returns a context carrying the identity. Errors never contain the token.
func (a *Authenticator) authenticate(ctx context.Context, method string) (context.Context, *Parsed, error) {
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
		return nil, nil, a.deny(ctx, method, codes.PermissionDenied, tok.ID, "the ClusterService needs a cluster token (`ctrl cluster register`); this is an operator token")
	case sc == scopeOperator && tok.Kind != store.OperatorToken:
		return nil, nil, a.deny(ctx, method, codes.PermissionDenied, tok.ID, "this API needs an operator token (`ctrl token create-operator`); cluster tokens may only call the ClusterService")
	}
	if tok.Kind == store.ClusterToken {
		if r := first(md, RegionHeader); r != "" && r != tok.Region {
			return nil, nil, a.deny(ctx, method, codes.PermissionDenied, tok.ID, "the "+RegionHeader+" metadata ("+r+") is not the region this token is bound to")
		}
		if c := first(md, ClusterIDHeader); c != "" && c != tok.ClusterID {
			return nil, nil, a.deny(ctx, method, codes.PermissionDenied, tok.ID, "the "+ClusterIDHeader+" metadata ("+c+") is not the cluster this token is bound to")
		}
	}
	id := Identity{Kind: tok.Kind, TokenID: tok.ID, ClusterID: tok.ClusterID, Region: tok.Region, Name: tok.Name}
	return WithIdentity(ctx, id), &parsed, nil
}

// verify checks a parsed token against the stored hash, through the cache.
// The cache holds the stored record, not the verdict, so a wrong secret for
// a cached id is still refused.
func (a *Authenticator) verify(ctx context.Context, p Parsed) (store.Token, error) {
	tok, err := a.lookup(ctx, p.ID)
	if errors.Is(err, store.ErrNotFound) {
		return store.Token{}, status.Error(codes.Unauthenticated, "unknown or revoked token")
	}
	if err != nil {
		a.log.Error("cannot read token; refusing the call", "token_id", p.ID, "error", err)
		return store.Token{}, status.Error(codes.Unavailable, "ctrl cannot check tokens right now (database unreachable); retry with backoff")
	}
	if tok.Kind != p.Kind || !Matches(p.Secret, tok.SecretHash) || tok.Revoked() {
		return store.Token{}, status.Error(codes.Unauthenticated, "unknown or revoked token")
	}
	return tok, nil
}

func (a *Authenticator) lookup(ctx context.Context, id string) (store.Token, error) {
	now := time.Now()
	a.mu.Lock()
	c, ok := a.cache[id]
	a.mu.Unlock()
	if ok && now.Sub(c.fetched) < a.ttl {
		return c.tok, nil
	}
	tok, err := a.tokens.LookupToken(ctx, id)
	if err != nil {
		return store.Token{}, err
	}
	a.mu.Lock()
	if len(a.cache) > 10000 { // ids are attacker-chosen: keep the map bounded
		clear(a.cache)
	}
	a.cache[id] = cachedToken{tok: tok, fetched: now}
	a.mu.Unlock()
	return tok, nil
}

func (a *Authenticator) deny(ctx context.Context, method string, code codes.Code, tokenID, msg string) error {
	a.denied.WithLabelValues(code.String()).Inc()
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
