package clusterapi_test

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"krane.dev/ctrl/auth"
	"krane.dev/ctrl/clusterapi"
	"krane.dev/ctrl/store"
	"krane.dev/internal/testenv"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
)

// TestHeartbeatsWhileTheReportQueueIsFull: with a batch of cluster
// eu-1's reports held inside its transaction (so its cluster row is
// locked in share mode) and the report queue full behind it, heartbeats
// of eu-1 and eu-2 still succeed: eu-2's is stored at once, and eu-1's,
// whose row its own reports hold, is answered and stored once they
// commit. Neither waits behind the reports nor is refused for them.
//
// ctrl's ClusterService runs on its own here (the caller's identity put
// in by the test from the x-test-cluster header), as in
// TestReportsUnderAStalledDatabase.
func TestHeartbeatsWhileTheReportQueueIsFull(t *testing.T) {
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
	for i, id := range []string{"eu-1", "eu-2"} {
		if err := st.RegisterCluster(ctx, id, "eu", store.Token{ID: "tok-" + id, SecretHash: [32]byte{byte(i + 1)}}); err != nil {
			t.Fatal(err)
		}
	}
	const objects = 120
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
	// The report batch in flight stops before its commit until released.
	held, release := make(chan struct{}, 8), make(chan struct{})
	var releaseOnce sync.Once
	unblock := func() { releaseOnce.Do(func() { close(release) }) }
	defer unblock()
	st.SetTestHooks(store.TestHooks{BeforeReportCommit: func(ctx context.Context, _ int) {
		held <- struct{}{}
		<-release
	}})

	reg := prometheus.NewRegistry()
	api, err := clusterapi.New(clusterapi.Options{Store: st, Registerer: reg, ReportQueue: 100,
		ReportLinger: 10 * time.Millisecond, HeartbeatLinger: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	runDone := make(chan struct{})
	go func() { api.Run(ctx); close(runDone) }()
	gs := grpc.NewServer(grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		who := auth.Identity{Kind: store.ClusterToken, Region: "eu", ClusterID: md.Get("x-test-cluster")[0]}
		return h(auth.WithIdentity(ctx, who), req)
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
	as := func(ctx context.Context, cluster string) context.Context {
		return metadata.AppendToOutgoingContext(ctx, "x-test-cluster", cluster)
	}
	batch := func(from, n int) *clusterv1.ReportStatusesRequest {
		req := &clusterv1.ReportStatusesRequest{}
		for i := from; i < from+n; i++ {
			s, _ := structpb.NewStruct(map[string]any{"n": 1.0})
			req.Reports = append(req.Reports, &clusterv1.ReportStatusRequest{Kind: genericKind, Id: fmt.Sprintf("o%03d", i), ObservedVersion: 1, Status: mustAny(s)})
		}
		return req
	}

	inFlight, queued := make(chan error, 1), make(chan error, 1)
	go func() { _, err := cli.ReportStatuses(as(ctx, "eu-1"), batch(0, 60)); inFlight <- err }()
	<-held
	go func() { _, err := cli.ReportStatuses(as(ctx, "eu-1"), batch(60, 60)); queued <- err }()
	waitFor(t, "a batch queued", func() bool { return gaugeOf(t, reg, "krane_ctrl_ingest_queue_depth", "reports") == 60 })
	if _, err := cli.ReportStatuses(as(ctx, "eu-1"), batch(0, 60)); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a report call beyond the full queue: %v, want RESOURCE_EXHAUSTED", err)
	}

	// The heartbeats, while the queue is full and eu-1's row is held. The
	// deadline only bounds a failing test.
	hctx, hcancel := context.WithTimeout(ctx, 30*time.Second)
	defer hcancel()
	var wg sync.WaitGroup
	errs := map[string]error{}
	var mu sync.Mutex
	for _, id := range []string{"eu-1", "eu-2"} {
		wg.Go(func() {
			_, err := cli.Heartbeat(as(hctx, id), &clusterv1.HeartbeatRequest{AgentVersion: "beat-1"})
			mu.Lock()
			errs[id] = err
			mu.Unlock()
		})
	}
	wg.Wait()
	for id, err := range errs {
		if err != nil {
			t.Fatalf("the heartbeat of %s with the report queue full: %v, want it recorded", id, err)
		}
	}
	agent := func(id string) string {
		t.Helper()
		list, err := st.ListClusters(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range list {
			if c.ID == id {
				if c.LastHeartbeatAt.IsZero() {
					return ""
				}
				return c.AgentVersion
			}
		}
		t.Fatalf("cluster %s not listed", id)
		return ""
	}
	if got := agent("eu-2"); got != "beat-1" {
		t.Fatalf("eu-2's stored heartbeat while eu-1's reports wait: agent version %q, want beat-1", got)
	}

	unblock()
	if err := <-inFlight; err != nil {
		t.Fatalf("the batch in flight: %v", err)
	}
	if err := <-queued; err != nil {
		t.Fatalf("the queued batch: %v", err)
	}
	waitFor(t, "eu-1's deferred heartbeat stored", func() bool { return agent("eu-1") == "beat-1" })
}

// gaugeOf reads the gauge name's series labelled what.
func gaugeOf(t *testing.T, reg *prometheus.Registry, name, what string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				if m.GetLabel()[0].GetValue() == what {
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	return 0
}
