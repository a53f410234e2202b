package clusterapi_test

import (
	"context"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"krane.dev/ctrl/auth"
	"krane.dev/ctrl/clusterapi"
	"krane.dev/ctrl/store"
	"krane.dev/internal/testenv"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
)

// TestBootstrapAdmissionIsBounded: with MaxBootstraps 1 and one bootstrap
// held before its snapshot, a second Watch from version 0 is refused with
// RESOURCE_EXHAUSTED and a RetryInfo of BootstrapRetry to twice it, while
// a Watch resuming from a cursor is served at once; once the held
// bootstrap finishes, the next one is admitted.
// admissionRig is a ClusterService with MaxBootstraps 1 and queue as
// BootstrapQueue whose first snapshot is held (held closes when it is;
// unblock lets it go), with a client for Watch.
type admissionRig struct {
	ctx     context.Context
	st      *store.Store
	reg     *prometheus.Registry
	held    chan struct{}
	unblock func()
	watch   func(after uint64, gen string) clusterv1.ClusterService_WatchClient
	api     *clusterapi.Server
}

func newAdmissionRig(t *testing.T, retry time.Duration, queue int) *admissionRig {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	st, err := store.Open(ctx, testenv.SharedMySQL(t).Database(t, t.Name()), store.PoolOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if _, err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := st.RegisterCluster(ctx, "eu-1", "eu", store.Token{ID: "tok-eu-1", SecretHash: [32]byte{1}}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.WriteTx(ctx, func(ctx context.Context, tx *store.Tx) error {
		return tx.PutResource(ctx, store.Resource{Kind: genericKind, Region: "eu", ID: "o1", Spec: []byte(`{}`)})
	}); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	api, err := clusterapi.New(clusterapi.Options{Store: st, Registerer: reg, MaxBootstraps: 1, BootstrapRetry: retry, BootstrapQueue: queue})
	if err != nil {
		t.Fatal(err)
	}
	held, release := make(chan struct{}), make(chan struct{})
	var calls atomic.Int32
	var releaseOnce sync.Once
	unblock := func() { releaseOnce.Do(func() { close(release) }) }
	clusterapi.SetBeforeSnapshot(api, func() {
		if calls.Add(1) == 1 {
			close(held)
			<-release
		}
	})
	runDone := make(chan struct{})
	go func() { api.Run(ctx); close(runDone) }()
	who := auth.Identity{Kind: store.ClusterToken, Region: "eu", ClusterID: "eu-1"}
	gs := grpc.NewServer(grpc.StreamInterceptor(func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		return h(srv, &identityStream{ss, auth.WithIdentity(ss.Context(), who)})
	}))
	clusterv1.RegisterClusterServiceServer(gs, api)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(l) }()
	t.Cleanup(func() {
		unblock()
		gs.Stop()
		cancel()
		<-runDone
	})
	conn, err := grpc.NewClient(l.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	cli := clusterv1.NewClusterServiceClient(conn)
	watch := func(after uint64, gen string) clusterv1.ClusterService_WatchClient {
		t.Helper()
		w, err := cli.Watch(ctx, &clusterv1.WatchRequest{Kind: genericKind, AfterVersion: after, Generation: gen})
		if err != nil {
			t.Fatal(err)
		}
		return w
	}
	return &admissionRig{ctx: ctx, st: st, reg: reg, held: held, unblock: unblock, watch: watch, api: api}
}

func TestBootstrapAdmissionIsBounded(t *testing.T) {
	const retry = 3 * time.Second
	r := newAdmissionRig(t, retry, -1)
	ctx, st, reg, held, unblock, watch := r.ctx, r.st, r.reg, r.held, r.unblock, r.watch
	var err error

	// One bootstrap, complete, gives the cursor the resuming stream uses.
	unheld := make(chan struct{})
	go func() {
		w := watch(0, "")
		for {
			ev, err := w.Recv()
			if err != nil {
				t.Errorf("the held bootstrap: %v", err)
				close(unheld)
				return
			}
			if ev.GetBootstrapComplete() != nil {
				close(unheld)
				return
			}
		}
	}()
	<-held
	_, err = watch(0, "").Recv()
	s := status.Convert(err)
	var hint *errdetails.RetryInfo
	for _, d := range s.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			hint = ri
		}
	}
	if s.Code() != codes.ResourceExhausted || hint == nil || !strings.Contains(s.Message(), "bootstraps") {
		t.Fatalf("a bootstrap beyond MaxBootstraps: %v (retry info %v), want RESOURCE_EXHAUSTED with a RetryInfo", err, hint)
	}
	if d := hint.GetRetryDelay().AsDuration(); d < retry || d >= 2*retry {
		t.Fatalf("retry hint %s, want in [%s, %s)", d, retry, 2*retry)
	}

	if got := gaugeValue(t, reg, "krane_ctrl_bootstraps_admitted"); got != 1 {
		t.Fatalf("bootstraps admitted: %v, want 1", got)
	}

	// A stream resuming from a cursor needs no admission.
	head, err := st.RegionHead(ctx, "eu")
	if err != nil {
		t.Fatal(err)
	}
	gen, err := st.CheckCursor(ctx, "eu-1", "eu", head, "")
	if err != nil {
		t.Fatal(err)
	}
	ev, err := watch(head, gen).Recv()
	if err != nil || ev.GetKeepAlive() == nil {
		t.Fatalf("a stream resuming from %d while the bootstrap place is taken: %v, %v; want a KeepAlive", head, ev, err)
	}

	unblock()
	<-unheld
	w := watch(0, "")
	for {
		ev, err := w.Recv()
		if err != nil {
			t.Fatalf("a bootstrap after the held one finished: %v", err)
		}
		if ev.GetBootstrapComplete() != nil {
			break
		}
	}
}

// identityStream gives a server stream the test's caller identity.
type identityStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *identityStream) Context() context.Context { return s.ctx }

// gaugeValue reads an unlabelled gauge.
func gaugeValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	return 0
}

// TestBootstrapsWaitInLineBeforeBeingRefused: with a queue of 1, a second
// bootstrap while the place is taken waits (it is not refused) and runs
// once the place is free; a third, with the queue full, is refused with
// the hint. Without the queue, the second would be refused: at 30,000
// streams the refused attempts coming back were the work, and bootstraps
// crawled at a few a second.
func TestBootstrapsWaitInLineBeforeBeingRefused(t *testing.T) {
	r := newAdmissionRig(t, time.Second, 1)
	first := make(chan error, 1)
	go func() {
		_, err := r.watch(0, "").Recv()
		first <- err
	}()
	<-r.held
	waiting := make(chan error, 1)
	go func() {
		w := r.watch(0, "")
		for {
			ev, err := w.Recv()
			if err != nil || ev.GetBootstrapComplete() != nil {
				waiting <- err
				return
			}
		}
	}()
	// The third is refused once the second waits in the queue.
	for clusterapi.BootstrapsWaiting(r.api) < 1 {
		select {
		case err := <-waiting:
			t.Fatalf("the second bootstrap ended instead of waiting in line: %v", err)
		case <-time.After(10 * time.Millisecond):
		}
	}
	if _, err := r.watch(0, "").Recv(); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a bootstrap beyond the place and the queue: %v, want RESOURCE_EXHAUSTED", err)
	}
	select {
	case err := <-waiting:
		t.Fatalf("the waiting bootstrap ended before the place was free: %v", err)
	default:
	}
	r.unblock()
	if err := <-waiting; err != nil {
		t.Fatalf("the bootstrap that waited in line: %v, want it served", err)
	}
	if err := <-first; err != nil {
		t.Fatalf("the held bootstrap: %v", err)
	}
}
