package ctrltest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"krane.dev/ctrl/deployspec"
	"krane.dev/ctrl/store"
	"krane.dev/internal/testenv"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
	ctrlv1 "krane.dev/proto/krane/ctrl/v1"
	"krane.dev/shared/kinds"
)

// Sentinels is a SentinelService client with an operator token.
func (e *Env) Sentinels(t testing.TB) ctrlv1.SentinelServiceClient {
	t.Helper()
	return ctrlv1.NewSentinelServiceClient(e.Dial(t, e.OperatorToken(t, "test operator")))
}

// Rollouts is a RolloutService client with an operator token.
func (e *Env) Rollouts(t testing.TB) ctrlv1.RolloutServiceClient {
	t.Helper()
	return ctrlv1.NewRolloutServiceClient(e.Dial(t, e.OperatorToken(t, "test operator")))
}

// SentinelCluster plays one cluster's sentinel plugin: it watches the
// region's sentinel desired state through the real ClusterService (with a
// cluster token) and answers every change with a status report, observed
// at the change's version: healthy on its image, unless the test holds the
// sentinel (no report until Release) or breaks it (unhealthy, mid-rollout).
type SentinelCluster struct {
	Region, ID string
	Client     clusterv1.ClusterServiceClient
	// Heartbeats are the cluster's heartbeats.
	Heartbeats *Heartbeater

	mu      sync.Mutex
	latest  map[string]sentinelChange
	held    map[string]bool
	holdAll bool
	broken  map[string]breakage
	seen    chan string
}

type breakage struct{ image, reason string }

type sentinelChange struct {
	version uint64
	spec    *clusterv1.Sentinel
}

// SentinelCluster registers a cluster in region and starts its fake
// sentinel plugin; it stops when the test ends.
func (e *Env) SentinelCluster(t testing.TB, region, clusterID string) *SentinelCluster {
	t.Helper()
	return e.sentinelCluster(t, region, clusterID, false)
}

// HeldSentinelCluster is a SentinelCluster that reports nothing until
// Release.
func (e *Env) HeldSentinelCluster(t testing.TB, region, clusterID string) *SentinelCluster {
	t.Helper()
	return e.sentinelCluster(t, region, clusterID, true)
}

func (e *Env) sentinelCluster(t testing.TB, region, clusterID string, held bool) *SentinelCluster {
	return startSentinelCluster(t, region, clusterID, e.Cluster(t, e.ClusterToken(t, region, clusterID)), held)
}

func startSentinelCluster(t testing.TB, region, clusterID string, client clusterv1.ClusterServiceClient, held bool) *SentinelCluster {
	c := &SentinelCluster{Region: region, ID: clusterID, Client: client, holdAll: held,
		latest: map[string]sentinelChange{}, held: map[string]bool{}, broken: map[string]breakage{}, seen: make(chan string, 10000)}
	c.Heartbeats = KeepHeartbeating(t, c.Client)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); c.watch(ctx, t) }()
	t.Cleanup(func() { cancel(); <-done })
	return c
}

// Hold stops reports on the sentinels (all of them with no ids) until
// Release.
func (c *SentinelCluster) Hold(ids ...string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(ids) == 0 {
		c.holdAll = true
	}
	for _, id := range ids {
		c.held[id] = true
	}
}

// Release ends a Hold and reports the sentinels' latest desired state.
func (c *SentinelCluster) Release(t testing.TB, ids ...string) {
	t.Helper()
	c.mu.Lock()
	if len(ids) == 0 {
		c.holdAll = false
		for id := range c.latest {
			ids = append(ids, id)
		}
		clear(c.held)
	}
	for _, id := range ids {
		delete(c.held, id)
	}
	var todo []sentinelChange
	for _, id := range ids {
		if ch, ok := c.latest[id]; ok {
			todo = append(todo, ch)
		}
	}
	c.mu.Unlock()
	for _, ch := range todo {
		if err := c.report(context.Background(), ch); err != nil {
			t.Errorf("cluster %s: report on sentinel %s: %v", c.ID, ch.spec.GetId(), err)
		}
	}
}

// Break makes every later report on the sentinel while its desired image
// is image ("" for any) say it cannot roll out: unhealthy with reason, no
// running image (a bad image; the previous one still works).
func (c *SentinelCluster) Break(id, image, reason string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.broken[id] = breakage{image: image, reason: reason}
}

// Fix undoes Break.
func (c *SentinelCluster) Fix(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.broken, id)
}

// Seen returns the ids of sentinel changes as the cluster receives them.
func (c *SentinelCluster) Seen() <-chan string { return c.seen }

// Latest is the last desired state the cluster received for a sentinel.
func (c *SentinelCluster) Latest(id string) (version uint64, spec *clusterv1.Sentinel, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch, ok := c.latest[id]
	return ch.version, ch.spec, ok
}

func (c *SentinelCluster) watch(ctx context.Context, t testing.TB) {
	var cursor uint64
	for ctx.Err() == nil {
		stream, err := c.Client.Watch(ctx, &clusterv1.WatchRequest{Kind: "sentinel", AfterVersion: cursor})
		if err == nil {
			for {
				ev, rerr := stream.Recv()
				if rerr != nil {
					err = rerr
					break
				}
				ch := ev.GetChange()
				if ch == nil || ch.GetDeleted() {
					continue
				}
				cursor = ch.GetVersion()
				spec := &clusterv1.Sentinel{}
				if uerr := ch.GetSpec().UnmarshalTo(spec); uerr != nil {
					t.Errorf("cluster %s: sentinel change %s: %v", c.ID, ch.GetId(), uerr)
					continue
				}
				sc := sentinelChange{version: ch.GetVersion(), spec: spec}
				c.mu.Lock()
				c.latest[spec.GetId()] = sc
				hold := c.holdAll || c.held[spec.GetId()]
				c.mu.Unlock()
				select {
				case c.seen <- spec.GetId():
				default:
				}
				if !hold {
					if rerr := c.report(ctx, sc); rerr != nil && ctx.Err() == nil {
						t.Errorf("cluster %s: report on sentinel %s: %v", c.ID, spec.GetId(), rerr)
					}
				}
			}
		}
		if ctx.Err() != nil || status.Code(err) == codes.Canceled || errors.Is(err, context.Canceled) {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (c *SentinelCluster) report(ctx context.Context, ch sentinelChange) error {
	c.mu.Lock()
	b, broken := c.broken[ch.spec.GetId()]
	c.mu.Unlock()
	broken = broken && (b.image == "" || b.image == ch.spec.GetImage())
	n := ch.spec.GetReplicas()
	st := &clusterv1.SentinelStatus{SentinelId: ch.spec.GetId(), K8SName: ch.spec.GetK8SName(), DesiredReplicas: n,
		AvailableReplicas: n, UpdatedReplicas: n, ReadyReplicas: n, RunningImage: ch.spec.GetImage(), Health: clusterv1.Health_HEALTH_HEALTHY}
	switch {
	case broken:
		st.RunningImage, st.UpdatedReplicas, st.Health, st.Reason = "", 0, clusterv1.Health_HEALTH_UNHEALTHY, b.reason
	case n == 0:
		st.RunningImage, st.Health = "", clusterv1.Health_HEALTH_PAUSED
	}
	doc, err := anypb.New(st)
	if err != nil {
		return err
	}
	_, err = c.Client.ReportStatus(ctx, &clusterv1.ReportStatusRequest{Kind: kinds.Sentinel, Id: st.GetSentinelId(), Status: doc,
		ObservedVersion: ch.version, ObservedAt: timestamppb.Now()})
	return err
}

// ReportApplyError reports that the cluster cannot apply the sentinel's
// latest desired state.
func (c *SentinelCluster) ReportApplyError(t testing.TB, id, field, message string, permanent bool) {
	t.Helper()
	v, _, ok := c.Latest(id)
	if !ok {
		t.Fatalf("cluster %s has not received sentinel %s", c.ID, id)
	}
	_, err := c.Client.ReportStatus(context.Background(), &clusterv1.ReportStatusRequest{
		Kind: "sentinel", Id: id, ObservedVersion: v, ObservedAt: timestamppb.Now(),
		ApplyError: &clusterv1.ApplyError{Version: v, Message: message, Field: field, Permanent: permanent},
	})
	if err != nil {
		t.Fatalf("cluster %s: report apply error on %s: %v", c.ID, id, err)
	}
}

// CreateSentinels writes n running sentinels in region (ids
// "<prefix>-000".., one environment each) on image, each with its own
// version, and returns their ids in order.
func (e *Env) CreateSentinels(t testing.TB, region, prefix, image string, n int) []string {
	t.Helper()
	ids := make([]string, n)
	_, err := e.Store.WriteTx(context.Background(), func(ctx context.Context, tx *store.Tx) error {
		for i := range n {
			id := fmt.Sprintf("%s-%03d", prefix, i)
			ids[i] = id
			if err := tx.PutSentinel(ctx, store.Sentinel{
				ID: id, Region: region, WorkspaceID: "ws1", ProjectID: "p1", AppID: "a1", EnvironmentID: "env-" + id,
				K8sName: deployspec.K8sName(id), Image: image, Replicas: 2, CPUMillicores: 250, MemoryMiB: 256,
			}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// FreshRestate starts a Restate server of the test's own, stopped when the
// test ends: for tests of the rollout singleton, whose state would
// otherwise carry over between tests sharing the package's server.
func FreshRestate(t testing.TB) *testenv.Restate {
	t.Helper()
	r, err := testenv.StartRestate()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Stop)
	return r
}
