package status

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/structpb"

	"krane.dev/internal/clustertest"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
	"krane.dev/sdk"
)

type bearer struct{}

func (bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer tok"}, nil
}
func (bearer) RequireTransportSecurity() bool { return false }

func client(t *testing.T, srv *clustertest.Server, opts ...grpc.DialOption) clusterv1.ClusterServiceClient {
	opts = append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithPerRPCCredentials(bearer{}))
	conn, err := grpc.NewClient(srv.URL()[len("http://"):], opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return clusterv1.NewClusterServiceClient(conn)
}

func report(id string, n int) sdk.StatusReport {
	st, _ := structpb.NewStruct(map[string]any{"n": float64(n)})
	return sdk.StatusReport{Kind: "k", ID: id, ObservedVersion: uint64(n), ObservedAt: time.Now(), Status: st}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestCoalescesAndSurvivesAnOutage: while ctrl refuses reports, many
// reports per object collapse into the latest one, which arrives once ctrl
// is back; nothing blocks the caller meanwhile.
func TestCoalescesAndSurvivesAnOutage(t *testing.T) {
	srv := clustertest.Start(t, "r", "tok")
	r := New(client(t, srv), hclog.NewNullLogger(), prometheus.NewRegistry(), 1000)
	r.breaker.minOpen = 50 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go r.Run(ctx, 2)

	srv.RefuseReports(true)
	start := time.Now()
	for n := 1; n <= 50; n++ {
		for o := range 10 {
			r.Submit(report(fmt.Sprintf("o%d", o), n))
		}
	}
	r.ApplyFailed("k", "o3", 7, sdk.InvalidField("image", "bad reference"))
	if took := time.Since(start); took > time.Second {
		t.Errorf("submitting 500 reports during an outage took %s: reporting must not block", took)
	}
	waitFor(t, "refusals", func() bool { return srv.Refused() >= 5 })
	refusedAtOpen := srv.Refused()
	time.Sleep(30 * time.Millisecond)
	if r.Depth() > 10 {
		t.Errorf("queue depth %d: reports for 10 objects must coalesce", r.Depth())
	}
	srv.RefuseReports(false)
	waitFor(t, "all objects reported", func() bool {
		for o := range 10 {
			if srv.LatestReport("k", fmt.Sprintf("o%d", o)) == nil {
				return false
			}
		}
		return true
	})
	for o := range 10 {
		reps := srv.Reports("k", fmt.Sprintf("o%d", o))
		if len(reps) != 1 || reps[0].GetObservedVersion() != 50 {
			t.Errorf("o%d: %d reports, last version %d; want exactly the latest (50)", o, len(reps), reps[len(reps)-1].GetObservedVersion())
		}
	}
	if ae := srv.LatestReport("k", "o3").GetApplyError(); ae == nil || ae.GetField() != "image" || !ae.GetPermanent() {
		t.Errorf("apply error lost while coalescing: %v", ae)
	}
	// The breaker kept the sender from hammering a ctrl that was down.
	if srv.Refused()-refusedAtOpen > 20 {
		t.Errorf("%d more refused calls after the breaker opened", srv.Refused()-refusedAtOpen)
	}
}

func TestBoundedBufferDropsOldest(t *testing.T) {
	srv := clustertest.Start(t, "r", "tok")
	r := New(client(t, srv), hclog.NewNullLogger(), prometheus.NewRegistry(), 3)
	for o := range 5 {
		r.Submit(report(fmt.Sprintf("o%d", o), 1))
	}
	if r.Depth() != 3 {
		t.Fatalf("depth %d, want 3", r.Depth())
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go r.Run(ctx, 1)
	waitFor(t, "sent", func() bool { return srv.LatestReport("k", "o4") != nil })
	if srv.LatestReport("k", "o0") != nil || srv.LatestReport("k", "o2") == nil {
		t.Errorf("the oldest reports should go first when the buffer is full")
	}
}

func TestRecoveredOnlyAfterFailure(t *testing.T) {
	srv := clustertest.Start(t, "r", "tok")
	r := New(client(t, srv), hclog.NewNullLogger(), prometheus.NewRegistry(), 10)
	r.ApplyRecovered("k", "never-failed", 3)
	if r.Depth() != 0 {
		t.Fatalf("a recovery without a prior failure was queued")
	}
	r.ApplyFailed("k", "x", 4, errors.New("quota exceeded"))
	r.ApplyRecovered("k", "x", 5)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go r.Run(ctx, 1)
	waitFor(t, "sent", func() bool { return srv.LatestReport("k", "x") != nil })
	if ae := srv.LatestReport("k", "x").GetApplyError(); ae == nil || ae.GetMessage() != "" || ae.GetVersion() != 5 {
		t.Errorf("want a cleared error at version 5, got %v", ae)
	}
}

// TestResumesWhenTheProbeFindsNothingDue: after an outage opened the
// breaker, the half-open probe may find no report due (the failed ones are
// still backing off). Reports submitted later must still go out.
func TestResumesWhenTheProbeFindsNothingDue(t *testing.T) {
	srv := clustertest.Start(t, "r", "tok")
	r := New(client(t, srv), hclog.NewNullLogger(), prometheus.NewRegistry(), 100)
	r.breaker.minOpen = 20 * time.Millisecond
	r.breaker.maxOpen = 20 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go r.Run(ctx, 1)

	srv.RefuseReports(true)
	r.Submit(report("early", 1))
	waitFor(t, "the breaker to open", func() bool { return srv.Refused() >= r.breaker.threshold })
	// Drop the failed entry so the next probe finds the queue empty.
	r.mu.Lock()
	for k := range r.pending {
		delete(r.pending, k)
	}
	r.order = nil
	r.mu.Unlock()
	time.Sleep(200 * time.Millisecond)

	srv.RefuseReports(false)
	r.Submit(report("late", 2))
	waitFor(t, "the report submitted after the outage", func() bool { return srv.LatestReport("k", "late") != nil })
}

// TestBatchesWhatQueuedUp: 500 reports queued at once go out in a few
// ReportStatuses calls of at most maxBatch, each object exactly once.
func TestBatchesWhatQueuedUp(t *testing.T) {
	srv := clustertest.Start(t, "r", "tok")
	r := New(client(t, srv), hclog.NewNullLogger(), prometheus.NewRegistry(), 1000)
	for o := range 500 {
		r.Submit(report(fmt.Sprintf("o%d", o), 1))
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go r.Run(ctx, 4)
	waitFor(t, "every report", func() bool { return r.Depth() == 0 && srv.LatestReport("k", "o499") != nil })
	time.Sleep(2 * linger)
	for o := range 500 {
		if n := len(srv.Reports("k", fmt.Sprintf("o%d", o))); n != 1 {
			t.Fatalf("o%d reported %d times, want once", o, n)
		}
	}
	if b := srv.Batches(); b < 3 || b > 5 {
		t.Errorf("%d calls for 500 reports; want 3 (batches of at most %d), 5 at worst", b, maxBatch)
	}
}

// TestSendsOneByOneToAnOlderCtrl: a ctrl without ReportStatuses still gets
// every report, through ReportStatus.
func TestSendsOneByOneToAnOlderCtrl(t *testing.T) {
	srv := clustertest.Start(t, "r", "tok")
	srv.ActLikeOlderCtrl()
	r := New(client(t, srv), hclog.NewNullLogger(), prometheus.NewRegistry(), 100)
	for o := range 20 {
		r.Submit(report(fmt.Sprintf("o%d", o), 1))
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go r.Run(ctx, 2)
	waitFor(t, "every report", func() bool {
		for o := range 20 {
			if srv.LatestReport("k", fmt.Sprintf("o%d", o)) == nil {
				return false
			}
		}
		return true
	})
	if srv.Batches() != 0 {
		t.Errorf("%d batches reached a ctrl that has no ReportStatuses", srv.Batches())
	}
}

// TestDropsAReportCtrlRefuses: a report on an object ctrl does not know is
// refused once and dropped, not retried, and does not hold back the
// others or open the breaker, batched or not.
func TestDropsAReportCtrlRefuses(t *testing.T) {
	for _, older := range []bool{false, true} {
		t.Run(fmt.Sprintf("older_ctrl=%v", older), func(t *testing.T) {
			srv := clustertest.Start(t, "r", "tok")
			if older {
				srv.ActLikeOlderCtrl()
			}
			srv.Forget("gone")
			r := New(client(t, srv), hclog.NewNullLogger(), prometheus.NewRegistry(), 100)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			go r.Run(ctx, 1)
			for round := range 8 {
				r.Submit(report("gone", round+1))
				r.Submit(report(fmt.Sprintf("ok%d", round), round+1))
				waitFor(t, "the good report", func() bool { return srv.LatestReport("k", fmt.Sprintf("ok%d", round)) != nil })
			}
			waitFor(t, "an empty queue", func() bool { return r.Depth() == 0 })
			time.Sleep(500 * time.Millisecond) // a retry would come within 200 ms
			if got := srv.Rejected(); got != 8 {
				t.Errorf("ctrl refused %d reports, want 8 (one per submit, none retried)", got)
			}
			r.breaker.mu.Lock()
			failures := r.breaker.failures
			r.breaker.mu.Unlock()
			if failures != 0 {
				t.Errorf("refused reports counted as %d failures of ctrl", failures)
			}
		})
	}
}

// TestStaleRecoveryKeepsTheFailure: a recovery older than the reported
// failure (the object failed again at a newer version since) does not
// clear it.
func TestStaleRecoveryKeepsTheFailure(t *testing.T) {
	srv := clustertest.Start(t, "r", "tok")
	r := New(client(t, srv), hclog.NewNullLogger(), prometheus.NewRegistry(), 10)
	r.ApplyFailed("k", "x", 7, sdk.Permanent(errors.New("quota exceeded")))
	r.ApplyRecovered("k", "x", 5)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go r.Run(ctx, 1)
	waitFor(t, "sent", func() bool { return srv.LatestReport("k", "x") != nil })
	if ae := srv.LatestReport("k", "x").GetApplyError(); ae.GetMessage() == "" || ae.GetVersion() != 7 {
		t.Errorf("want the failure at version 7 reported, got %v", ae)
	}
	r.ApplyRecovered("k", "x", 7)
	waitFor(t, "the failure cleared by a recovery at its version", func() bool {
		ae := srv.LatestReport("k", "x").GetApplyError()
		return ae != nil && ae.GetMessage() == "" && ae.GetVersion() == 7
	})
}

// TestKeepsTheInFlightBatchOnStop: reports in a call that the reporter's
// stop cuts short go back in the queue (a reload keeps the reporter and
// sends them on the new connection); they are not lost.
func TestKeepsTheInFlightBatchOnStop(t *testing.T) {
	srv := clustertest.Start(t, "r", "tok")
	inCall := make(chan struct{}, 1)
	hang := grpc.WithUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		select {
		case inCall <- struct{}{}:
		default:
		}
		<-ctx.Done() // ctrl does not answer
		return ctx.Err()
	})
	r := New(client(t, srv, hang), hclog.NewNullLogger(), prometheus.NewRegistry(), 1000)
	for o := range 50 {
		r.Submit(report(fmt.Sprintf("o%d", o), 1))
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.Run(ctx, 1) }()
	<-inCall
	cancel()
	<-done
	if d := r.Depth(); d != 50 {
		t.Fatalf("%d reports queued after a stop cut the call short, want all 50", d)
	}
	// The next run (a reload's new connection) sends them.
	r.SetClient(client(t, srv))
	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	go r.Run(ctx, 1)
	waitFor(t, "every report", func() bool { return srv.LatestReport("k", "o49") != nil && r.Depth() == 0 })
}

// TestFlushSendsWhatIsQueued: at a graceful shutdown every queued report
// goes out at once (no linger, no backoff); a ctrl that refuses them makes
// Flush give up with what is left, within its deadline.
func TestFlushSendsWhatIsQueued(t *testing.T) {
	srv := clustertest.Start(t, "r", "tok")
	r := New(client(t, srv), hclog.NewNullLogger(), prometheus.NewRegistry(), 1000)
	for o := range 450 {
		r.Submit(report(fmt.Sprintf("o%d", o), 1))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if left, err := r.Flush(ctx); err != nil || left != 0 {
		t.Fatalf("flush: %d left, %v", left, err)
	}
	if srv.LatestReport("k", "o449") == nil || srv.Batches() != 3 {
		t.Errorf("%d calls for 450 reports, want 3", srv.Batches())
	}
	srv.RefuseReports(true)
	r.Submit(report("late", 2))
	if left, err := r.Flush(ctx); err == nil || left != 1 {
		t.Errorf("flush to a ctrl that refuses: %d left, %v; want 1 left and an error", left, err)
	}
}
