package clusterapi_test

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"krane.dev/ctrl/internal/ctrltest"
	"krane.dev/ctrl/serve"
	"krane.dev/ctrl/store"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
	"krane.dev/shared/kinds"
)

// seedTopology inserts deployments and their topology rows straight into
// the tables with the given versions (stamping 100,000 rows one write at a
// time would test the writer, not the bootstrap).
func seedTopology(t *testing.T, s *store.Store, region string, first, n int, status string) {
	t.Helper()
	ctx := context.Background()
	const batch = 1000
	for start := first; start < first+n; start += batch {
		end := min(start+batch, first+n)
		var dep, top strings.Builder
		dep.WriteString(`INSERT INTO deployments (id, workspace_id, project_id, environment_id, app_id, k8s_namespace, k8s_name,
  replicas, workload, created_at, updated_at) VALUES `)
		top.WriteString("INSERT INTO deployment_topology (deployment_id, region, desired_replicas, desired_status, version, created_at, updated_at) VALUES ")
		for v := start; v < end; v++ {
			if v > start {
				dep.WriteString(",")
				top.WriteString(",")
			}
			fmt.Fprintf(&dep, `('dep-%07d','ws','proj','env','app','ns-ws','dep-%07d',2,`+
				`'{"version":1,"workload":{"image":"registry.example/app:%d","cpu_millicores":250,"memory_mib":256,"env_vars":{"PORT":"8080","LOG":"info"},"command":["/app","serve"]}}',0,0)`, v, v, v)
			fmt.Fprintf(&top, "('dep-%07d','%s',2,'%s',%d,0,0)", v, region, status, v)
		}
		for _, q := range []string{dep.String(), top.String()} {
			if _, err := s.DB().ExecContext(ctx, q); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// histogram returns the sample count and sum of one histogram series.
func histogram(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) (uint64, float64) {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	next:
		for _, m := range f.GetMetric() {
			for _, lp := range m.GetLabel() {
				if want, ok := labels[lp.GetName()]; ok && want != lp.GetValue() {
					continue next
				}
			}
			return m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
		}
	}
	return 0, 0
}

func TestBootstrapOf100kRowsStreamsInBoundedPages(t *testing.T) {
	const (
		live     = 100_000
		pageSize = 500
	)
	env := ctrltest.Start(t, ctrltest.Options{Configure: func(c *serve.Config) { fastConfig(c); c.Watch.PageSize = pageSize }})
	ctx := context.Background()
	seedStart := time.Now()
	// Versions: 1,000 rows of another region, 1,000 stopped rows, then the
	// live rows, so the last live row carries the head.
	seedTopology(t, env.Store, "us", 1, 1000, "running")
	seedTopology(t, env.Store, "eu", 1001, 1000, "stopped")
	seedTopology(t, env.Store, "eu", 2001, live, "running")
	head := uint64(2000 + live)
	if _, err := env.Store.DB().ExecContext(ctx, "UPDATE version_seq SET head = ? WHERE id = 1", head); err != nil {
		t.Fatal(err)
	}
	if _, err := env.Store.DB().ExecContext(ctx, "INSERT INTO change_heads (region, kind, head) VALUES ('eu', 'deployment', ?), ('us', 'deployment', 1000)", head); err != nil {
		t.Fatal(err)
	}
	t.Logf("seeded %d topology rows in %s", live+2000, time.Since(seedStart).Round(time.Millisecond))

	cli := env.Cluster(t, env.ClusterToken(t, "eu", "eu-1"))
	runtime.GC()
	var base runtime.MemStats
	runtime.ReadMemStats(&base)
	var peak uint64
	stop := make(chan struct{})
	var sampler sync.WaitGroup
	sampler.Add(1)
	go func() {
		defer sampler.Done()
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			var m runtime.MemStats
			runtime.ReadMemStats(&m)
			peak = max(peak, m.HeapAlloc)
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}()

	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := time.Now()
	stream, err := cli.Watch(sctx, &clusterv1.WatchRequest{Kind: kinds.Deployment, Region: "eu"})
	if err != nil {
		t.Fatal(err)
	}
	var rows int
	var last uint64
	for {
		ev, err := stream.Recv()
		if err != nil {
			t.Fatalf("after %d rows: %v", rows, err)
		}
		if bc := ev.GetBootstrapComplete(); bc != nil {
			if bc.GetMaxVersion() != head {
				t.Fatalf("BootstrapComplete{%d}, want %d", bc.GetMaxVersion(), head)
			}
			break
		}
		c := ev.GetChange()
		if c.GetVersion() <= last || c.GetDeleted() || c.GetVersion() <= 2000 {
			t.Fatalf("row %d: %s@%d deleted=%v after version %d: want live eu rows in version order", rows, c.GetId(), c.GetVersion(), c.GetDeleted(), last)
		}
		last = c.GetVersion()
		rows++
	}
	elapsed := time.Since(start)
	close(stop)
	sampler.Wait()
	if rows != live {
		t.Fatalf("bootstrap sent %d rows, want %d", rows, live)
	}
	pages, querySeconds := histogram(t, env.Server.Registry(), "krane_ctrl_watch_query_seconds", map[string]string{"kind": kinds.Deployment, "phase": "bootstrap"})
	if pages != live/pageSize {
		t.Fatalf("bootstrap ran %d page queries, want %d (%d rows / %d per page)", pages, live/pageSize, live, pageSize)
	}
	growth := int64(peak) - int64(base.HeapAlloc)

	// For scale: the same rows held in memory at once.
	all, err := env.Store.ChangesAfter(ctx, kinds.Deployment, "eu", 2000, live)
	if err != nil {
		t.Fatal(err)
	}
	runtime.GC()
	var withAll runtime.MemStats
	runtime.ReadMemStats(&withAll)
	allBytes := int64(withAll.HeapAlloc) - int64(base.HeapAlloc)
	runtime.KeepAlive(all)

	t.Logf("bootstrap: %d rows in %d pages of %d in %s = %.0f rows/s (page queries %.2fs of it); peak heap growth %.1f MiB (all rows at once: %.1f MiB)",
		rows, pages, pageSize, elapsed.Round(time.Millisecond), float64(rows)/elapsed.Seconds(), querySeconds, float64(growth)/(1<<20), float64(allBytes)/(1<<20))
	if growth > allBytes/3 {
		t.Fatalf("heap grew by %d bytes while streaming, more than a third of holding every row (%d bytes): the bootstrap is not bounded", growth, allBytes)
	}
}
