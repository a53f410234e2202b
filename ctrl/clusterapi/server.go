// Package clusterapi serves krane.cluster.v1.ClusterService: the streams
// through which every cluster's krane agent receives desired state, and the
// calls through which it reports actual state.
//
// Streams read the store page by page, ordered by version, and never hold a
// whole region in memory. Idle streams wait on the process's single head
// poller (poller.go), which reads the tiny change_heads table every
// PollInterval and wakes only the streams whose (region, kind) advanced. The
// streams of one (region, kind) share its feed (feed.go): one read of the
// new rows per wake, kept in a bounded window that every stream at the head
// sends from; a stream behind the window reads the database itself. Idle
// streams send a KeepAlive every KeepAlive interval, and the feed re-reads
// the database at most once per interval in case a head was missed. A
// stream resumed from a cursor also sends a KeepAlive as soon as it has
// caught up.
//
// A row that cannot be converted to its payload (corrupt JSON in a column)
// is skipped: the stream and its cursor move on, the row is logged at error
// level with its kind, region, id and version, and counted in
// krane_ctrl_watch_rows_skipped_total. Sending it with an empty payload
// would make agents apply garbage, and stopping would block every other
// object; the next write of the row gives it a new version that is streamed
// normally.
//
// What clusters send back is stored in shared batches (ingest.go): the
// status reports of every calling cluster in one transaction per
// ReportLinger, their heartbeats apart from them (heartbeats.go), one
// write per HeartbeatLinger that never waits for a report batch and is
// never refused for reports queueing.
// Each caller is answered once its batch committed; a call that does not
// fit in the bounded queue is refused with RESOURCE_EXHAUSTED and a
// RetryInfo, and krane's reporter waits that long.
//
// Every call must carry an authenticated cluster identity (ctrl/auth puts it
// in the context); requests naming another region than the token's are
// refused with PERMISSION_DENIED.
package clusterapi

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"krane.dev/ctrl/auth"
	"krane.dev/ctrl/store"
	"krane.dev/ctrl/vault"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
)

// StatusListener is told about accepted status reports and recorded apply
// errors after they commit (the Restate layer uses it to wake waiting
// workflows). Calls happen on the report's RPC, so they must return
// quickly.
type StatusListener interface {
	DeploymentReported(ctx context.Context, deploymentID, region string)
	SentinelReported(ctx context.Context, sentinelID string)
}

// Options configure a Server. Zero values take the defaults.
type Options struct {
	Store  *store.Store
	Logger hclog.Logger
	// Registerer receives the metrics; nil registers none.
	Registerer prometheus.Registerer
	// PageSize is how many rows one query reads. Default 500.
	PageSize int
	// KeepAlive is how often an idle stream re-checks the database and
	// sends a KeepAlive. Default 15s.
	KeepAlive time.Duration
	// PollInterval is how often the head poller reads change_heads. Default
	// 50ms.
	PollInterval time.Duration
	// FeedWindow is how many of the latest changes of each (region, kind)
	// are kept for its streams to share (feed.go). Default 1024.
	FeedWindow int
	// UnsharedReads turns the feeds off: every stream reads the database
	// itself on every wake (the design before feeds, kept to compare with).
	UnsharedReads bool
	// Listener, when set, is told about accepted reports.
	Listener StatusListener
	// Vault opens sealed environments for DecryptEnv; nil when ctrl has no
	// keyring (DecryptEnv then fails with FAILED_PRECONDITION).
	Vault *vault.Source
	// DecryptPerMinute bounds the DecryptEnv calls one cluster makes of
	// this ctrl per minute (each is audited); past it, RESOURCE_EXHAUSTED.
	// Default 1000.
	DecryptPerMinute int
	// ReportLinger is how long status reports gather before one
	// transaction stores those of every cluster (at most one transaction
	// per linger; a report after a quiet spell goes at once). Default
	// 100ms.
	ReportLinger time.Duration
	// ReportQueue bounds the reports waiting for their transaction;
	// beyond it a report call is refused with RESOURCE_EXHAUSTED and a
	// retry hint. Default 20000.
	ReportQueue int
	// ReportQueueShare bounds what one cluster may hold of that queue, so
	// one cluster sending many calls while the database is slow cannot
	// refuse every other cluster's reports. Default a tenth of
	// ReportQueue, at least one call's worth (500).
	ReportQueueShare int
	// HeartbeatLinger is the same for heartbeats (one multi-row write per
	// linger for every cluster that sent one). Default 1s.
	HeartbeatLinger time.Duration
	// UnbatchedReports stores every report call in a transaction of its
	// own (the reference platform's path, kept to compare with).
	UnbatchedReports bool
	// MaxBootstraps bounds the streams sending a full snapshot at once
	// (Watch from version 0, ListDesired): each holds a database
	// connection and reads a whole region's kind, so when every host
	// reconnects at once (a ctrl restart) the rest are refused with
	// RESOURCE_EXHAUSTED and a RetryInfo instead of queueing on the pool
	// behind each other and the operators' calls. Streams resuming from a
	// cursor are not bounded. Default 16; negative: unbounded.
	MaxBootstraps int
	// BootstrapRetry is the least wait a refused bootstrap is told; each
	// refusal adds up to as much again at random, so the refused hosts
	// come back spread out. Default 2s.
	BootstrapRetry time.Duration
	// BootstrapQueue is how many bootstraps may wait for a place (in
	// arrival order, holding no connection) before the rest are refused.
	// A refused host comes back, and every attempt costs ctrl a stream
	// set-up and an authentication: at 30,000 streams refusing at once
	// (no queue) made the attempts, not the snapshots, the work, and
	// bootstraps crawled at a few a second. Default 50,000; negative:
	// none wait.
	BootstrapQueue int
}

// maxIngestBatch bounds the items of one batch transaction;
// maxQueueBytes what a queue holds (reports carry statuses of up to
// MaxGenericStatusBytes each).
const (
	maxIngestBatch = 2000
	maxQueueBytes  = 256 << 20
)

// reportBytes weighs a queued report.
func reportBytes(r store.Report) int {
	n := len(r.Status) + 256
	for _, in := range r.Instances {
		n += proto.Size(in)
	}
	return n
}

// Server implements clusterv1.ClusterServiceServer.
type Server struct {
	clusterv1.UnimplementedClusterServiceServer

	store     *store.Store
	log       hclog.Logger
	m         *metrics
	pageSize  int
	keepAlive time.Duration
	listener  StatusListener
	vault     *vault.Source
	decrypts  *perCluster
	poller    *headPoller
	feeds     feeds
	stopping  chan struct{}

	// bootstraps holds a token per snapshot being sent (nil: unbounded);
	// bootstrapRetry is the least retry hint of a refused one.
	bootstraps     chan struct{}
	bootstrapRetry time.Duration
	// bootstrapWaiting counts bootstraps waiting for a place, at most
	// bootstrapQueue.
	bootstrapWaiting atomic.Int64
	bootstrapQueue   int64
	// beforeSnapshot, set by tests only, runs once a bootstrap is admitted.
	beforeSnapshot func()

	reports      *batcher[store.Report, store.ReportResult]
	heartbeats   *beatWriter
	reportLinger time.Duration
	maxBatch     int
	unbatched    bool
	running      atomic.Bool // Run started the batchers

	labelsMu sync.Mutex
	labels   map[string]bool
}

// New returns a Server. Call Run to start its head poller; without it,
// streams only notice new changes at KeepAlive intervals.
func New(o Options) (*Server, error) {
	if o.Store == nil {
		return nil, errors.New("clusterapi: a store is required")
	}
	if o.Logger == nil {
		o.Logger = hclog.NewNullLogger()
	}
	if o.PageSize <= 0 {
		o.PageSize = 500
	}
	if o.KeepAlive <= 0 {
		o.KeepAlive = 15 * time.Second
	}
	if o.PollInterval <= 0 {
		o.PollInterval = 50 * time.Millisecond
	}
	if o.FeedWindow <= 0 {
		o.FeedWindow = 1024
	}
	if o.DecryptPerMinute <= 0 {
		o.DecryptPerMinute = 1000
	}
	if o.ReportLinger <= 0 {
		o.ReportLinger = 100 * time.Millisecond
	}
	if o.ReportQueue <= 0 {
		o.ReportQueue = 20000
	}
	if o.ReportQueueShare <= 0 {
		o.ReportQueueShare = max(o.ReportQueue/10, 500) // ReportStatusesRequest.reports: max_items 500
	}
	if o.HeartbeatLinger <= 0 {
		o.HeartbeatLinger = time.Second
	}
	if o.MaxBootstraps == 0 {
		o.MaxBootstraps = 16
	}
	if o.BootstrapQueue == 0 {
		o.BootstrapQueue = 50000
	}
	if o.BootstrapRetry <= 0 {
		o.BootstrapRetry = 2 * time.Second
	}
	var bootstraps chan struct{}
	if o.MaxBootstraps > 0 {
		bootstraps = make(chan struct{}, o.MaxBootstraps)
	}
	log := o.Logger.Named("clusterapi")
	m := newMetrics(o.Registerer)
	st := o.Store
	return &Server{
		store: o.Store, log: log, m: m, pageSize: o.PageSize, keepAlive: o.KeepAlive, listener: o.Listener, vault: o.Vault,
		decrypts:   newPerCluster(o.DecryptPerMinute),
		poller:     newHeadPoller(o.Store, o.PollInterval, log.Named("heads"), m),
		feeds:      feeds{window: o.FeedWindow, off: o.UnsharedReads},
		stopping:   make(chan struct{}),
		bootstraps: bootstraps, bootstrapRetry: o.BootstrapRetry, bootstrapQueue: int64(max(0, o.BootstrapQueue)),
		labels: map[string]bool{},
		reports: newBatcher(st.Ingest, o.ReportLinger, maxIngestBatch, o.ReportQueue, o.ReportQueueShare, reportBytes, maxQueueBytes,
			m.observeBatch("reports"), m.gaugeBatch("reports")),
		heartbeats: newBeatWriter(st.HeartbeatsUnlessBusy, o.HeartbeatLinger, maxIngestBatch,
			m.observeBatch("heartbeats"), m.gaugeBatch("heartbeats"), func(n int) { m.beatsDeferred.Add(float64(n)) }),
		reportLinger: o.ReportLinger, maxBatch: maxIngestBatch, unbatched: o.UnbatchedReports,
	}, nil
}

// Run polls the change heads and stores the reports and heartbeats
// clusters send until ctx is done, then ends every open stream with
// UNAVAILABLE (so a graceful gRPC stop does not wait on them).
func (s *Server) Run(ctx context.Context) {
	var wg sync.WaitGroup
	s.running.Store(true)
	wg.Go(func() { s.reports.run(ctx) })
	wg.Go(func() { s.heartbeats.run(ctx) })
	s.poller.run(ctx)
	s.running.Store(false)
	wg.Wait()
	close(s.stopping)
}

// caller returns the authenticated cluster.
func caller(ctx context.Context) (auth.Identity, error) {
	id, ok := auth.FromContext(ctx)
	if !ok || id.Kind != store.ClusterToken || id.Region == "" {
		return auth.Identity{}, status.Error(codes.Unauthenticated, "no cluster identity on this call: send `authorization: Bearer <cluster token>`")
	}
	return id, nil
}

// regionFor checks that a request's region is the caller's own.
func regionFor(id auth.Identity, requested string) (string, error) {
	if requested == "" || requested == id.Region {
		return id.Region, nil
	}
	return "", status.Errorf(codes.PermissionDenied, "this token is bound to region %q; it cannot read region %q", id.Region, requested)
}

func checkKind(kind string) error {
	if !store.ValidKind(kind) {
		return status.Errorf(codes.InvalidArgument, "kind %q is not a valid kind name (lowercase letters, digits, '.' and '-', e.g. \"deployment\")", kind)
	}
	return nil
}

// maxKindLabels bounds the kind label values of the metrics: kind names
// come from callers, and an unbounded label set would grow the metrics
// without limit. Beyond it, kinds are counted as "other".
const maxKindLabels = 64

// kindLabel is the metric label value for kind.
func (s *Server) kindLabel(kind string) string {
	s.labelsMu.Lock()
	defer s.labelsMu.Unlock()
	if s.labels[kind] {
		return kind
	}
	if len(s.labels) >= maxKindLabels {
		return "other"
	}
	s.labels[kind] = true
	return kind
}

func errorf(code codes.Code, format string, args ...any) error {
	return status.Error(code, fmt.Sprintf(format, args...))
}
