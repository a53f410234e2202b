package clusterapi

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"krane.dev/ctrl/auth"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
	"krane.dev/shared/version"
)

// Skew holds ctrl's side of the version skew policy (docs/compatibility.md,
// shared/version.HostSkew): a krane host older than the window is
// refused on every ClusterService call with FAILED_PRECONDITION and words
// that say which versions ctrl serves and what to do, before any bound is
// checked, so an old host never meets a bound it cannot understand. The
// host's version is its gRPC user agent ("krane/VERSION ...", which every
// krane release sends on every call), so a stream is judged when it opens.
// A host newer than ctrl, or of no known version, is served.
//
// A refused host's version is still recorded (at most once a minute per
// cluster and ctrl), so `ctrl admin cluster list`, the fleet API and the
// console show what it runs and why nothing reaches it.
type Skew struct {
	ctrl    string
	record  func(ctx context.Context, clusterID, region, version string) error
	log     hclog.Logger
	refused *prometheus.CounterVec

	mu       sync.Mutex
	recorded map[string]time.Time // cluster -> when its version was last recorded
}

// recordEvery bounds how often one cluster's refused version is written.
const recordEvery = time.Minute

// NewSkew returns the check for a ctrl of version ctrlVersion; record
// stores a refused host's version (store.RecordAgentVersion).
func NewSkew(ctrlVersion string, record func(ctx context.Context, clusterID, region, version string) error, log hclog.Logger, reg prometheus.Registerer) *Skew {
	if log == nil {
		log = hclog.NewNullLogger()
	}
	k := &Skew{ctrl: ctrlVersion, record: record, log: log.Named("skew"), recorded: map[string]time.Time{},
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "krane_ctrl_agent_skew_refused_total",
			Help: "ClusterService calls refused because the krane host is older than this ctrl's skew window (docs/compatibility.md), by region.",
		}, []string{"region"})}
	if reg != nil {
		reg.MustRegister(k.refused)
	}
	return k
}

// AgentVersion is the krane version a call's user agent names ("" when it
// names none: not a krane host, or a krane that sends no version).
func AgentVersion(ctx context.Context) string {
	md, _ := metadata.FromIncomingContext(ctx)
	for _, ua := range md.Get("user-agent") {
		for _, f := range strings.Fields(ua) {
			if v, ok := strings.CutPrefix(f, "krane/"); ok {
				return v
			}
		}
	}
	return ""
}

// check refuses a call of a cluster whose host is too old.
func (k *Skew) check(ctx context.Context, method string) error {
	if !strings.HasPrefix(method, "/"+clusterv1.ClusterService_ServiceDesc.ServiceName+"/") {
		return nil
	}
	id, ok := auth.FromContext(ctx)
	if !ok || id.ClusterID == "" {
		return nil
	}
	host := AgentVersion(ctx)
	if version.HostSkew(k.ctrl, host) != version.TooOld {
		return nil
	}
	k.refused.WithLabelValues(id.Region).Inc()
	k.mu.Lock()
	due := time.Since(k.recorded[id.ClusterID]) >= recordEvery
	if due {
		k.recorded[id.ClusterID] = time.Now()
	}
	k.mu.Unlock()
	if due {
		k.log.Warn("refusing a krane host older than the skew window", "cluster", id.ClusterID, "region", id.Region,
			"krane_version", host, "ctrl_version", k.ctrl, "oldest_served", version.OldestHostLine(k.ctrl))
		if k.record != nil {
			if err := k.record(context.WithoutCancel(ctx), id.ClusterID, id.Region, host); err != nil {
				k.log.Warn("could not record a refused host's version", "cluster", id.ClusterID, "error", err)
			}
		}
	}
	return status.Error(codes.FailedPrecondition, version.HostSkewMessage(k.ctrl, host))
}

// UnaryInterceptor applies the check to unary calls; it runs after
// authentication and before the bounds.
func (k *Skew) UnaryInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if err := k.check(ctx, info.FullMethod); err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}
}

// StreamInterceptor applies the check when a stream opens.
func (k *Skew) StreamInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if err := k.check(ss.Context(), info.FullMethod); err != nil {
			return err
		}
		return handler(srv, ss)
	}
}
