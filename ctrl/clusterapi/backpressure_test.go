package clusterapi_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"krane.dev/ctrl/auth"
	"krane.dev/ctrl/clusterapi"
	"krane.dev/ctrl/store"
	hoststatus "krane.dev/host/status"
	"krane.dev/internal/testenv"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
	"krane.dev/sdk"
)

// TestReportsUnderAStalledDatabase: with the database stalled, one batch
// of reports is in flight and one waits in the queue; a call that does not
// fit in the queue is refused at once with RESOURCE_EXHAUSTED and a
// RetryInfo instead of piling up in ctrl. krane's reporter, refused the
// same way, pauses for the hint and keeps coalescing; once the database
// is back, every object's newest status is stored: nothing was lost.
//
// ctrl's ClusterService runs here on its own (its store behind the stalled
// proxy, the caller's identity put in by the test) so that only the
// report path depends on the database.
func TestReportsUnderAStalledDatabase(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dsn, proxy := testenv.SharedMySQL(t).DatabaseBehindProxy(t, t.Name())
	st, err := store.Open(ctx, dsn, store.PoolOptions{})
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
	const objects = 150
	if _, err := st.WriteTx(ctx, func(ctx context.Context, tx *store.Tx) error {
		for i := range objects {
			if err := tx.PutResource(ctx, store.Resource{Kind: genericKind, Region: "eu", ID: fmt.Sprintf("o%03d", i), Spec: []byte(`{}`)}); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	api, err := clusterapi.New(clusterapi.Options{Store: st, Registerer: reg, ReportQueue: 100, ReportLinger: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	runDone := make(chan struct{})
	go func() { api.Run(ctx); close(runDone) }()
	who := auth.Identity{Kind: store.ClusterToken, Region: "eu", ClusterID: "eu-1"}
	gs := grpc.NewServer(grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		return h(auth.WithIdentity(ctx, who), req)
	}))
	clusterv1.RegisterClusterServiceServer(gs, api)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(l) }()
	defer func() {
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
	batch := func(from, n, value int) *clusterv1.ReportStatusesRequest {
		req := &clusterv1.ReportStatusesRequest{}
		for i := from; i < from+n; i++ {
			s, _ := structpb.NewStruct(map[string]any{"n": float64(value)})
			req.Reports = append(req.Reports, &clusterv1.ReportStatusRequest{Kind: genericKind, Id: fmt.Sprintf("o%03d", i), ObservedVersion: 1, Status: mustAny(s)})
		}
		return req
	}
	gauge := func(name string) float64 {
		t.Helper()
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == name {
				for _, m := range mf.GetMetric() {
					if m.GetLabel()[0].GetValue() == "reports" {
						return m.GetGauge().GetValue()
					}
				}
			}
		}
		return 0
	}

	proxy.Stall()
	inFlight, queued := make(chan error, 1), make(chan error, 1)
	go func() { _, err := cli.ReportStatuses(ctx, batch(0, 60, 1)); inFlight <- err }()
	waitFor(t, "a batch in flight", func() bool { return gauge("krane_ctrl_ingest_in_flight") == 60 })
	go func() { _, err := cli.ReportStatuses(ctx, batch(60, 60, 1)); queued <- err }()
	waitFor(t, "a batch queued", func() bool { return gauge("krane_ctrl_ingest_queue_depth") == 60 })
	_, err = cli.ReportStatuses(ctx, batch(0, 60, 1)) // 60 + 60 > 100
	s := status.Convert(err)
	var hint *errdetails.RetryInfo
	for _, d := range s.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			hint = ri
		}
	}
	if s.Code() != codes.ResourceExhausted || hint == nil || hint.GetRetryDelay().AsDuration() < time.Second || !strings.Contains(s.Message(), "queue is full") {
		t.Fatalf("a call beyond the queue with the database stalled: %v (retry info %v), want RESOURCE_EXHAUSTED with a RetryInfo of at least 1s", err, hint)
	}

	// krane's reporter, sending five statuses of every object meanwhile.
	hostReg := prometheus.NewRegistry()
	rep := hoststatus.New(cli, hclog.NewNullLogger(), hostReg, 1000)
	rctx, stopReporter := context.WithCancel(ctx)
	reporterDone := make(chan struct{})
	go func() { rep.Run(rctx, 2); close(reporterDone) }()
	defer func() { stopReporter(); <-reporterDone }()
	for n := 1; n <= 5; n++ {
		for i := range objects {
			s, _ := structpb.NewStruct(map[string]any{"n": float64(n)})
			rep.Submit(sdk.StatusReport{Kind: genericKind, ID: fmt.Sprintf("o%03d", i), ObservedVersion: 1, ObservedAt: time.Now(), Status: s})
		}
	}
	waitFor(t, "the reporter to be told to wait", func() bool {
		mfs, _ := hostReg.Gather()
		for _, mf := range mfs {
			if mf.GetName() == "krane_host_report_throttled_total" {
				return mf.GetMetric()[0].GetCounter().GetValue() > 0
			}
		}
		return false
	})
	if d := rep.Depth(); d != objects {
		t.Fatalf("%d reports queued in the reporter, want one per object (%d): coalesced, none dropped", d, objects)
	}
	proxy.Restore()
	if err := <-inFlight; err != nil {
		t.Fatalf("the batch in flight: %v", err)
	}
	if err := <-queued; err != nil {
		t.Fatalf("the queued batch: %v", err)
	}
	waitFor(t, "every object's newest status stored", func() bool {
		var n int
		if err := st.DB().QueryRowContext(ctx, "SELECT COUNT(*) FROM object_reports WHERE JSON_VALUE(status, '$.n') = 5").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == objects
	})
}

// waitFor polls cond until it holds (a minute at most, for a loaded
// machine).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
