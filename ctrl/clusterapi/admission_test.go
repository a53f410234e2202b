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
func TestBootstrapAdmissionIsBounded(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
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
	const retry = 3 * time.Second
	reg := prometheus.NewRegistry()
	api, err := clusterapi.New(clusterapi.Options{Store: st, Registerer: reg, MaxBootstraps: 1, BootstrapRetry: retry})
	if err != nil {
		t.Fatal(err)
	}
	held, release := make(chan struct{}), make(chan struct{})
	var calls atomic.Int32
	var releaseOnce sync.Once
	unblock := func() { releaseOnce.Do(func() { close(release) }) }
	defer unblock()
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
	defer func() {
		unblock()
		gs.Stop()
		cancel()
		<-runDone
	}()
	conn, err := grpc.NewClient(l.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	cli := clusterv1.NewClusterServiceClient(conn)
	watch := func(after uint64, gen string) clusterv1.ClusterService_WatchClient {
		t.Helper()
		w, err := cli.Watch(ctx, &clusterv1.WatchRequest{Kind: genericKind, AfterVersion: after, Generation: gen})
		if err != nil {
			t.Fatal(err)
		}
		return w
	}

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
