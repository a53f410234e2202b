package clusterapi

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"krane.dev/ctrl/auth"
	"krane.dev/ctrl/store"
	"krane.dev/ctrl/vault"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
	"krane.dev/shared/kinds"
)

// decision is the outcome of one decryption request, as audited.
type decision struct {
	outcome string // store.VaultAllowed, VaultDenied or VaultFailed
	reason  string // for the audit and the caller; never secret material
	keyID   string
	code    codes.Code
}

func denied(code codes.Code, format string, args ...any) decision {
	return decision{outcome: store.VaultDenied, code: code, reason: fmt.Sprintf(format, args...)}
}

func failed(code codes.Code, format string, args ...any) decision {
	return decision{outcome: store.VaultFailed, code: code, reason: fmt.Sprintf(format, args...)}
}

// DecryptEnv opens a deployment's sealed environment for a cluster that
// runs it: only a cluster token of a region where the deployment is
// scheduled, only for the blob ctrl stored for it. A sentinel id (sen_...)
// opens the sentinel's sealed credentials under the same rules: only a
// cluster of the sentinel's region, only while it is desired running, only
// the blob ctrl stored for it. Every call that reaches this handler is
// audited, and nothing is returned unless its audit entry was written.
func (s *Server) DecryptEnv(ctx context.Context, req *clusterv1.DecryptEnvRequest) (*clusterv1.DecryptEnvResponse, error) {
	who, err := caller(ctx)
	if err != nil {
		return nil, err
	}
	id := req.GetDeploymentId()
	subject := kinds.SecretsKind(id)
	// Before the audit: a cluster looping DecryptEnv must not grow the
	// audit table without limit (its rows also expire, vault.audit_retention).
	if !s.decrypts.allow(who.ClusterID) {
		s.m.decrypts.WithLabelValues("limited").Inc()
		return nil, status.Errorf(codes.ResourceExhausted, "cluster %s asked to open secrets more than %d times in a minute (vault.decrypt_per_minute); retry later",
			who.ClusterID, s.decrypts.perMinute)
	}
	env, d := s.decrypt(ctx, who, id, req.GetEncryptedEnv())
	entry := store.VaultAuditEntry{DeploymentID: id, ClusterID: who.ClusterID, Region: who.Region, TokenID: who.TokenID,
		Outcome: d.outcome, Reason: d.reason, KeyID: d.keyID}
	if err := s.store.RecordVaultAudit(context.WithoutCancel(ctx), entry); err != nil {
		clear(env)
		s.m.decrypts.WithLabelValues(store.VaultFailed).Inc()
		s.log.Error("cannot audit a decryption request; refusing it", subject, id, "cluster", who.ClusterID, "region", who.Region, "error", err)
		return nil, status.Errorf(codes.Unavailable, "ctrl cannot record the audit of this decryption (database unavailable); retry with backoff")
	}
	markAudited(ctx)
	s.m.decrypts.WithLabelValues(d.outcome).Inc()
	if d.outcome != store.VaultAllowed {
		s.log.Warn("decryption refused", subject, id, "cluster", who.ClusterID, "region", who.Region, "outcome", d.outcome, "reason", d.reason)
		return nil, status.Error(d.code, d.reason)
	}
	s.log.Info("secret environment opened", subject, id, "cluster", who.ClusterID, "region", who.Region, "key", d.keyID, "variables", len(env))
	return &clusterv1.DecryptEnvResponse{Env: env}, nil
}

func (s *Server) decrypt(ctx context.Context, who auth.Identity, id string, blob []byte) (map[string]string, decision) {
	switch {
	case id == "" || len(id) > 64:
		return nil, denied(codes.InvalidArgument, "deployment_id: a deployment id (dep_...) or a sentinel id (sen_...) is required")
	case len(blob) == 0:
		return nil, denied(codes.InvalidArgument, "encrypted_env: the sealed environment to open is required")
	case len(blob) > vault.MaxBlobSize:
		return nil, denied(codes.InvalidArgument, "encrypted_env: %d bytes; no sealed environment is larger than %d", len(blob), vault.MaxBlobSize)
	}
	var (
		stored []byte
		d      *decision
	)
	if kinds.SecretsKind(id) == kinds.Sentinel {
		stored, d = s.sentinelCredentials(ctx, who, id)
	} else {
		stored, d = s.deploymentEnv(ctx, who, id)
	}
	if d != nil {
		return nil, *d
	}
	if len(stored) != len(blob) || subtle.ConstantTimeCompare(stored, blob) != 1 {
		return nil, denied(codes.PermissionDenied, "encrypted_env is not the sealed environment ctrl stored for %s %s", kinds.SecretsKind(id), id)
	}
	if s.vault == nil {
		return nil, failed(codes.FailedPrecondition, "ctrl has no vault keyring (vault.keyring_file), so it cannot open sealed environments")
	}
	env, keyID, err := s.vault.Open(id, blob)
	var unknown *vault.UnknownKeyError
	switch {
	case errors.As(err, &unknown):
		d := failed(codes.FailedPrecondition, "%v; put the key back in ctrl's keyring", err)
		d.keyID = keyID
		return nil, d
	case err != nil:
		d := failed(codes.Internal, "the sealed environment stored for %s %s does not open with ctrl's keyring (%v); an operator must look at it", kinds.SecretsKind(id), id, err)
		d.keyID = keyID
		return nil, d
	}
	return env, decision{outcome: store.VaultAllowed, reason: "opened with key " + keyID, keyID: keyID, code: codes.OK}
}

// storeFailure is the decision when the database could not be read.
func storeFailure(ctx context.Context, what string) *decision {
	if ctx.Err() != nil {
		d := failed(status.FromContextError(ctx.Err()).Code(), "the request was cancelled")
		return &d
	}
	d := failed(codes.Unavailable, "ctrl cannot read the %s (database unavailable); retry with backoff", what)
	return &d
}

// deploymentEnv is the blob stored for a deployment the caller's region
// runs, or the decision refusing the request.
func (s *Server) deploymentEnv(ctx context.Context, who auth.Identity, id string) ([]byte, *decision) {
	stored, regions, err := s.store.SealedEnv(ctx, id)
	// An unknown deployment is refused like another region's, so the answer
	// tells nobody which ids exist elsewhere.
	if errors.Is(err, store.ErrNotFound) || (err == nil && !slices.Contains(regions, who.Region)) {
		d := denied(codes.PermissionDenied, "deployment %s is not scheduled to run in region %s: a cluster may open only the secrets of deployments it runs", id, who.Region)
		return nil, &d
	}
	if err != nil {
		return nil, storeFailure(ctx, "deployment")
	}
	if len(stored) == 0 {
		d := denied(codes.PermissionDenied, "deployment %s has no secret environment", id)
		return nil, &d
	}
	return stored, nil
}

// sentinelCredentials is the blob stored for a running sentinel of the
// caller's region, or the decision refusing the request.
func (s *Server) sentinelCredentials(ctx context.Context, who auth.Identity, id string) ([]byte, *decision) {
	c, err := s.store.SentinelSealedCredentials(ctx, id)
	// Unknown, another region's and stopped are one answer: a cluster
	// learns nothing about sentinels it does not run.
	if errors.Is(err, store.ErrNotFound) || (err == nil && (c.Region != who.Region || !c.Running)) {
		d := denied(codes.PermissionDenied, "sentinel %s is not running in region %s: a cluster may open only the credentials of sentinels it runs", id, who.Region)
		return nil, &d
	}
	if err != nil {
		return nil, storeFailure(ctx, "sentinel")
	}
	if len(c.Blob) == 0 {
		d := denied(codes.PermissionDenied, "sentinel %s has no credentials", id)
		return nil, &d
	}
	return c.Blob, nil
}

// auditedKey marks, in a call's context, that the handler wrote the call's
// audit entry.
type auditedKey struct{}

func markAudited(ctx context.Context) {
	if f, ok := ctx.Value(auditedKey{}).(*atomic.Bool); ok {
		f.Store(true)
	}
}

// decryptMethod is the full gRPC method name of ClusterService.DecryptEnv.
const decryptMethod = "/krane.cluster.v1.ClusterService/DecryptEnv"

// DecryptAuditInterceptor completes the vault audit: DecryptEnv calls that
// authentication refused before the handler ran with PERMISSION_DENIED (a
// valid token of the wrong kind, such as an operator's, or a cluster token
// claiming another region) are recorded too, with the token's public id.
// Calls without a valid token (UNAUTHENTICATED) are only logged and
// counted by ctrl/auth: they identify nobody, and recording them would let
// anyone grow the table. The refused calls of one token are recorded at
// most perMinute a minute (vault.decrypt_per_minute, the limit a cluster's
// own calls have), checked before anything is written: a token looping on
// refused calls adds rows no faster than an honest cluster could; the rest
// are counted (krane_ctrl_vault_audit_suppressed_total) and logged once a
// minute per token. Install it outside (before) the authentication
// interceptor.
func DecryptAuditInterceptor(st *store.Store, log hclog.Logger, perMinute int, reg prometheus.Registerer) grpc.UnaryServerInterceptor {
	if log == nil {
		log = hclog.NewNullLogger()
	}
	log = log.Named("clusterapi")
	if perMinute <= 0 {
		perMinute = 1000
	}
	limits := newPerCluster(perMinute)
	told := newPerCluster(1)
	suppressed := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "krane_ctrl_vault_audit_suppressed_total",
		Help: "DecryptEnv calls refused at authentication that were not recorded in the vault audit: their token had been recorded vault.decrypt_per_minute times that minute already.",
	})
	if reg != nil {
		reg.MustRegister(suppressed)
	}
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if info.FullMethod != decryptMethod {
			return handler(ctx, req)
		}
		audited := &atomic.Bool{}
		resp, err := handler(context.WithValue(ctx, auditedKey{}, audited), req)
		if audited.Load() || status.Code(err) != codes.PermissionDenied {
			return resp, err
		}
		entry := store.VaultAuditEntry{Outcome: store.VaultDenied, Reason: status.Convert(err).Message(), TokenID: tokenID(ctx)}
		if !limits.allow("token:" + entry.TokenID) {
			suppressed.Inc()
			if told.allow(entry.TokenID) {
				log.Warn("a token keeps calling DecryptEnv and being refused; its refusals beyond vault.decrypt_per_minute are counted, not recorded", "token_id", entry.TokenID)
			}
			return resp, err
		}
		if r, ok := req.(*clusterv1.DecryptEnvRequest); ok {
			entry.DeploymentID = r.GetDeploymentId()
		}
		if md, ok := metadata.FromIncomingContext(ctx); ok {
			// What the caller claimed; unverified, hence the prefix.
			if v := md.Get(auth.RegionHeader); len(v) > 0 {
				entry.Region = "claimed:" + v[0]
			}
		}
		if aerr := st.RecordVaultAudit(context.WithoutCancel(ctx), entry); aerr != nil {
			log.Error("cannot audit a refused decryption request", "deployment", entry.DeploymentID, "token_id", entry.TokenID, "error", aerr)
		}
		return resp, err
	}
}

// tokenID is the public id of the call's bearer token, "" when it has
// none. The secret part never leaves auth.Parse.
func tokenID(ctx context.Context) string {
	md, _ := metadata.FromIncomingContext(ctx)
	v := md.Get("authorization")
	if len(v) == 0 {
		return ""
	}
	scheme, token, ok := strings.Cut(v[0], " ")
	if !ok || !strings.EqualFold(scheme, "bearer") {
		return ""
	}
	p, err := auth.Parse(strings.TrimSpace(token))
	if err != nil {
		return ""
	}
	return p.ID
}

// perCluster is a rate limit per cluster: perMinute calls a minute, in
// bursts of up to perMinute (a host bootstrapping opens every secret of
// its region at once). Keys are authenticated cluster ids, so the map is
// as large as the fleet.
type perCluster struct {
	perMinute int
	mu        sync.Mutex
	limits    map[string]*rate.Limiter
}

func newPerCluster(perMinute int) *perCluster {
	return &perCluster{perMinute: perMinute, limits: map[string]*rate.Limiter{}}
}

func (p *perCluster) allow(cluster string) bool {
	p.mu.Lock()
	l, ok := p.limits[cluster]
	if !ok {
		l = rate.NewLimiter(rate.Limit(float64(p.perMinute)/60), p.perMinute)
		p.limits[cluster] = l
	}
	p.mu.Unlock()
	return l.Allow()
}
