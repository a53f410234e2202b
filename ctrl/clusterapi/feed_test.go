package clusterapi_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"krane.dev/ctrl/internal/ctrltest"
	"krane.dev/ctrl/serve"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
	"krane.dev/shared/kinds"
)

// reads is how many change queries the server has run after bootstraps:
// each stream's own, and the ones shared by a (region, kind).
func reads(t *testing.T, env *ctrltest.Env) (own, shared uint64) {
	t.Helper()
	reg := env.Server.Registry()
	own, _ = histogram(t, reg, "krane_ctrl_watch_query_seconds", map[string]string{"kind": kinds.Deployment, "phase": "stream"})
	shared, _ = histogram(t, reg, "krane_ctrl_watch_query_seconds", map[string]string{"kind": kinds.Deployment, "phase": "feed"})
	return own, shared
}

// A commit wakes every stream of its (region, kind); they must share one
// read of the new rows, not run one query each (unless watch.shared_reads
// is off).
func TestStreamsOfARegionShareOneReadPerCommit(t *testing.T) {
	t.Run("shared", func(t *testing.T) { testReadsPerCommit(t, true) })
	t.Run("unshared", func(t *testing.T) { testReadsPerCommit(t, false) })
}

func testReadsPerCommit(t *testing.T, shared bool) {
	const streams, writes = 20, 10
	env := ctrltest.Start(t, ctrltest.Options{Configure: func(c *serve.Config) {
		fastConfig(c)
		c.Watch.KeepAlive = time.Hour // no re-checks in this test
		c.Watch.SharedReads = shared
	}})
	putDeployment(t, env.Store, "d0", "eu", "app:0", 1, "running")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	var mu sync.Mutex
	got := make([]map[uint64]bool, streams) // versions each stream received
	bootstrapped := make(chan struct{}, streams)
	for i := range streams {
		got[i] = map[uint64]bool{}
		cli := env.Cluster(t, env.ClusterToken(t, "eu", fmt.Sprintf("eu-%d", i)))
		st, err := cli.Watch(ctx, &clusterv1.WatchRequest{Kind: kinds.Deployment})
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			for {
				ev, err := st.Recv()
				if err != nil {
					return
				}
				if ev.GetBootstrapComplete() != nil {
					bootstrapped <- struct{}{}
				}
				if c := ev.GetChange(); c != nil {
					mu.Lock()
					got[i][c.GetVersion()] = true
					mu.Unlock()
				}
			}
		}()
	}
	for range streams {
		select {
		case <-bootstrapped:
		case <-time.After(time.Minute):
			t.Fatal("bootstraps did not complete within a minute")
		}
	}
	own0, shared0 := reads(t, env)
	for i := range writes {
		v := putDeployment(t, env.Store, "d0", "eu", fmt.Sprintf("app:%d", i+1), 1, "running")
		// Wait until every stream has it (one commit per wake).
		deadline := time.Now().Add(time.Minute)
		for {
			mu.Lock()
			n := 0
			for _, g := range got {
				if g[v] {
					n++
				}
			}
			mu.Unlock()
			if n == streams {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("version %d reached %d of %d streams within a minute", v, n, streams)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	own1, shared1 := reads(t, env)
	own, sharedReads := own1-own0, shared1-shared0
	t.Logf("%d commits, %d streams: %d shared reads, %d reads by single streams", writes, streams, sharedReads, own)
	if !shared {
		if own < streams*writes || sharedReads != 0 {
			t.Fatalf("unshared: %d commits to %d streams took %d reads of their own and %d shared; want one per stream and commit", writes, streams, own, sharedReads)
		}
		return
	}
	// One shared read per commit, give or take a stream that took its
	// first live read alone; never one per stream.
	if own+sharedReads > 2*writes+streams {
		t.Fatalf("%d commits to %d streams took %d reads (%d shared, %d own); want about one per commit", writes, streams, own+sharedReads, sharedReads, own)
	}
}

// A client resuming from a cursor learns when it has caught up: a
// KeepAlive follows the catch-up at once, not after the keep-alive
// interval. (A reconnect-polling client closes the stream on it.)
func TestResumedWatchAnnouncesCatchUp(t *testing.T) {
	env := ctrltest.Start(t, ctrltest.Options{Configure: func(c *serve.Config) {
		fastConfig(c)
		c.Watch.KeepAlive = time.Hour
	}})
	v1 := putDeployment(t, env.Store, "d1", "eu", "app:1", 1, "running")
	v2 := putDeployment(t, env.Store, "d2", "eu", "app:1", 1, "running")
	cli := env.Cluster(t, env.ClusterToken(t, "eu", "eu-1"))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := cli.Watch(ctx, &clusterv1.WatchRequest{Kind: kinds.Deployment, AfterVersion: v1})
	if err != nil {
		t.Fatal(err)
	}
	if c := recv(t, st.Recv).GetChange(); c.GetVersion() != v2 {
		t.Fatalf("first event %v, want d2@%d", c, v2)
	}
	if ka := recv(t, st.Recv).GetKeepAlive(); ka == nil || ka.GetHeadVersion() < v2 {
		t.Fatalf("after the catch-up: %v, want KeepAlive{head >= %d}", ka, v2)
	}
}
