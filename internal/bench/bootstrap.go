package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"

	"krane.dev/internal/testenv/kubeenv"
	"krane.dev/plugins/deployment/controller"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
	"krane.dev/sdk"
	"krane.dev/sdk/kube"
)

const bootN = 2000

// onlyDeployments runs krane with the deployment controller alone.
var onlyDeployments = []string{"KRANE_CONTROLLER__SENTINEL__ENABLED=false", "KRANE_CONTROLLER__CILIUM__ENABLED=false", "KRANE_SYNC__RESYNC_INTERVAL=20s", "KRANE_SYNC__WORKERS=32"}

// Bootstrap measures (2) a fresh krane host bootstrapping 2,000
// deployments against raw client-go server-side apply of exactly the same
// ReplicaSets (the plugin's own builder and apply call) with 32 workers, against the same
// API server in the same run (median of 3, alternating; each arm is timed
// until a watch saw the last object); (3) the first
// resync of those 2,000 unchanged objects: API writes, CPU of host and
// plugin, wall time; (5) memory of the host and each plugin with 2,000
// deployments and 2,000 sentinels. The controller-manager and scheduler
// are stopped meanwhile, so only these writes reach the API server (no
// pods are made; both arms measure applying objects).
func Bootstrap(ctx context.Context, e *Env) ([]Figure, error) {
	c := e.St.Clusters[e.Region]
	defer quiet(c)()
	e.St.StopKrane(e.Region)
	ns, rawNS := "ws-bench-boot", "bench-raw"
	if err := (bulk{e.Store.DB()}).deployments(ctx, e.Region, ns, "boot", bootN, 1); err != nil {
		return nil, err
	}
	objs := make([]*unstructured.Unstructured, bootN)
	for i := range objs {
		id := fmt.Sprintf("boot-%05d", i)
		d := &clusterv1.Deployment{Id: id, WorkspaceId: "bench", ProjectId: "p", EnvironmentId: "bench-env", AppId: "a", K8SNamespace: ns, K8SName: id,
			Image: "registry.local/bench/app:1", CpuMillicores: 100, MemoryMib: 64, Replicas: 1, EnvVars: map[string]string{"MODE": "bench"}, Port: 8080}
		rs := controller.BuildReplicaSet(id, uint64(i+1), d, controller.Defaults())
		rs.Namespace = rawNS
		// The same object, minus Krane's claim on it: with the managed-by
		// label the deployment plugin would (rightly) take these copies for
		// its own objects in the wrong namespace and delete them.
		rs.Labels[kube.ManagedByLabel] = "bench-raw"
		rs.Spec.Template.Labels[kube.ManagedByLabel] = "bench-raw"
		u, err := kube.ToUnstructured(rs)
		if err != nil {
			return nil, err
		}
		objs[i] = u
	}
	if err := c.EnsureNamespace(ctx, rawNS); err != nil {
		return nil, err
	}
	cfg := rest.CopyConfig(c.Config)
	cfg.QPS, cfg.Burst = 5000, 10000
	// The baseline applies as the plugin does, with client-go at its
	// fastest: a typed client answered in protobuf.
	cs, err := kube.NewClientset(cfg)
	if err != nil {
		return nil, err
	}
	rawRSs := cs.AppsV1().ReplicaSets(rawNS)
	var rawRates, kraneRates []float64
	for rep := range 3 {
		// Raw client-go: 32 workers.
		if err := clearRS(ctx, c, rawNS); err != nil {
			return nil, err
		}
		// Both arms are timed the same way: until a watch has seen every
		// object added (the watch also costs the API server the same in
		// both).
		rawDone, stopRaw, err := countAdded(ctx, c, rawNS, bootN)
		if err != nil {
			return nil, err
		}
		cpuBefore := cpuByCommand()
		callsBefore, err := apiCalls(ctx, c)
		if err != nil {
			return nil, err
		}
		rawProfile := profileAPIServer(ctx, c, fmt.Sprintf("apiserver-raw-%d", rep+1), 4*time.Second)
		begin := time.Now()
		var next atomic.Int64
		var wg sync.WaitGroup
		errs := make(chan error, 32)
		for range 32 {
			wg.Go(func() {
				for {
					i := int(next.Add(1)) - 1
					if i >= bootN {
						return
					}
					if _, err := kube.ApplyTyped(ctx, rawRSs.Patch, objs[i]); err != nil {
						errs <- err
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		if err := <-errs; err != nil {
			stopRaw()
			return nil, err
		}
		applied := time.Since(begin)
		select {
		case <-rawDone:
		case <-time.After(time.Minute):
			stopRaw()
			return nil, fmt.Errorf("the watch did not see the %d raw ReplicaSets within a minute of their applies", bootN)
		}
		stopRaw()
		raw := time.Since(begin)
		<-rawProfile
		rawRates = append(rawRates, bootN/raw.Seconds())
		rawCPU, rawCalls := cpuSince(cpuBefore), apiCallsSince(ctx, c, callsBefore)

		// Krane: a fresh host bootstraps the same objects from ctrl.
		if err := clearRS(ctx, c, ns); err != nil {
			return nil, err
		}
		e.St.SetKraneEnv(e.Region, onlyDeployments)
		count, stop, err := countAdded(ctx, c, ns, bootN)
		if err != nil {
			return nil, err
		}
		cpuBefore = cpuByCommand()
		if callsBefore, err = apiCalls(ctx, c); err != nil {
			stop()
			return nil, err
		}
		kraneProfile := profileAPIServer(ctx, c, fmt.Sprintf("apiserver-krane-%d", rep+1), 4*time.Second)
		begin = time.Now()
		if err := e.St.StartKrane(ctx, e.Region); err != nil {
			stop()
			return nil, err
		}
		select {
		case <-count:
		case <-time.After(5 * time.Minute):
			stop()
			return nil, fmt.Errorf("krane did not apply %d ReplicaSets within 5 minutes", bootN)
		}
		stop()
		took := time.Since(begin)
		<-kraneProfile
		kraneRates = append(kraneRates, bootN/took.Seconds())
		// Where the CPU went: the machine has two cores, and both arms
		// are bound by them, not by client rate limits.
		e.logf("bootstrap: run %d: CPU during the raw arm, %s", rep+1, rawCPU)
		e.logf("bootstrap: run %d: CPU during the krane arm, %s", rep+1, cpuSince(cpuBefore))
		e.logf("bootstrap: run %d: API requests during the raw arm: %s", rep+1, rawCalls)
		e.logf("bootstrap: run %d: API requests during the krane arm: %s", rep+1, apiCallsSince(ctx, c, callsBefore))
		e.logf("bootstrap: run %d: raw client-go %s (%.0f/s; its applies returned at %s), krane %s (%.0f/s, process start included)",
			rep+1, raw.Round(time.Millisecond), rawRates[rep], applied.Round(time.Millisecond), took.Round(time.Millisecond), kraneRates[rep])
		if rep < 2 {
			e.St.StopKrane(e.Region)
		}
	}
	figs := []Figure{
		{Section: "2 bootstrap", Name: "raw client-go server-side apply, 2,000 ReplicaSets, 32 workers", Value: median(rawRates), Unit: "objects/s"},
		{Section: "2 bootstrap", Name: "fresh krane host bootstrapping the same 2,000 from ctrl", Value: median(kraneRates), Unit: "objects/s", Note: "process start to last object applied; sync.workers 32"},
		{Section: "2 bootstrap", Name: "krane / raw", Value: median(kraneRates) / median(rawRates), Unit: "ratio", Target: ">= 0.9"},
	}
	rf, err := resyncCost(ctx, e)
	if err != nil {
		return nil, err
	}
	figs = append(figs, rf...)
	mf, err := memory(ctx, e, nil)
	if err != nil {
		return nil, err
	}
	return append(figs, mf...), nil
}

// clearRS deletes every ReplicaSet of a namespace and waits until they are gone.
func clearRS(ctx context.Context, c *kubeenv.Cluster, ns string) error {
	if err := c.Client.AppsV1().ReplicaSets(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		return err
	}
	for {
		list, err := c.Client.AppsV1().ReplicaSets(ns).List(ctx, metav1.ListOptions{Limit: 1})
		if err != nil {
			return err
		}
		if len(list.Items) == 0 {
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// countAdded watches a namespace and closes the returned channel once n
// ReplicaSets were added. A watch the API server closes (it drops watchers
// that fall behind a burst) is resumed at once from the last event seen.
func countAdded(ctx context.Context, c *kubeenv.Cluster, ns string, n int) (<-chan struct{}, func(), error) {
	rss := c.Client.AppsV1().ReplicaSets(ns)
	list, err := rss.List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, nil, err
	}
	wctx, cancel := context.WithCancel(ctx)
	rv := list.ResourceVersion
	first, err := rss.Watch(wctx, metav1.ListOptions{ResourceVersion: rv, AllowWatchBookmarks: true})
	if err != nil {
		cancel()
		return nil, nil, err
	}
	done := make(chan struct{})
	go func() {
		w, seen := first, len(list.Items)
		for {
			for ev := range w.ResultChan() {
				if m, err := meta.Accessor(ev.Object); err == nil {
					rv = m.GetResourceVersion()
				}
				if ev.Type == watch.Added {
					if seen++; seen == n {
						w.Stop()
						close(done)
						return
					}
				}
			}
			for {
				if wctx.Err() != nil {
					return
				}
				if w, err = rss.Watch(wctx, metav1.ListOptions{ResourceVersion: rv, AllowWatchBookmarks: true}); err == nil {
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
		}
	}()
	return done, cancel, nil
}

// resyncCost watches the first resync after the bootstrap: 2,000 unchanged
// objects re-applied through the plugin.
func resyncCost(ctx context.Context, e *Env) ([]Figure, error) {
	c := e.St.Clusters[e.Region]
	metricsURL := e.St.KraneHTTP[e.Region] + "/metrics"
	resyncApplies := func() float64 {
		m, _ := scrape(ctx, metricsURL)
		return sum(m, "krane_host_applies_total", `kind="deployment"`, `source="resync"`)
	}
	writes := func() (float64, error) {
		calls, err := apiCalls(ctx, c)
		if err != nil {
			return 0, err
		}
		var t float64
		for _, verb := range []string{"POST", "PUT", "PATCH", "DELETE", "APPLY"} {
			t += calls[verb+" replicasets"]
		}
		return t, nil
	}
	host := e.St.Krane(e.Region).Pid()
	pids := func() []int {
		ps := []int{host}
		for pid := range children(host) {
			ps = append(ps, pid)
		}
		return ps
	}
	base := resyncApplies()
	w0, err := writes()
	if err != nil {
		return nil, err
	}
	// CPU is sampled continuously; the sample just before the first resync
	// apply is the baseline, so idle time before the resync does not count.
	var start time.Time
	var cpu0 float64
	deadline := time.Now().Add(2 * time.Minute)
	for {
		cpu := procCPU(pids()...)
		n := resyncApplies() - base
		if start.IsZero() {
			if n > 0 {
				start = time.Now()
			} else {
				cpu0 = cpu
			}
		}
		if n >= bootN {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("no complete resync within 2 minutes (%v of %d applies)", n, bootN)
		}
		time.Sleep(50 * time.Millisecond)
	}
	wall := time.Since(start)
	cpu1 := procCPU(pids()...)
	w1, err := writes()
	if err != nil {
		return nil, err
	}
	e.logf("resync: %d unchanged objects: %v API writes, %.2f CPU s (host + plugins), %s", bootN, w1-w0, cpu1-cpu0, wall.Round(time.Millisecond))
	return []Figure{
		{Section: "3 resync", Name: "API write calls in a resync of 2,000 unchanged objects", Value: w1 - w0, Unit: "calls", Target: "0", Note: "apiserver_request_total, mutating verbs on replicasets"},
		{Section: "3 resync", Name: "CPU of host + plugins for that resync", Value: cpu1 - cpu0, Unit: "CPU s", Note: "from the last sample before its first apply (50 ms granularity)"},
		{Section: "3 resync", Name: "wall time of the resync (first to last apply)", Value: float64(wall.Milliseconds()), Unit: "ms"},
	}, nil
}

// Memory measures (5) alone (`go run ./cmd/bench -only memory`): 2,000
// deployments and 2,000 sentinels, their objects applied by a fresh krane,
// then the memory of the host and each plugin. As within Bootstrap, the
// controller-manager and scheduler are stopped, so the caches hold the
// plugins' own objects and no pods.
func Memory(ctx context.Context, e *Env) ([]Figure, error) {
	c := e.St.Clusters[e.Region]
	defer quiet(c)()
	e.St.StopKrane(e.Region)
	ns := "ws-bench-mem"
	if err := (bulk{e.Store.DB()}).deployments(ctx, e.Region, ns, "mem-d", bootN, 1); err != nil {
		return nil, err
	}
	if err := c.EnsureNamespace(ctx, ns); err != nil {
		return nil, err
	}
	applied, stop, err := countAdded(ctx, c, ns, bootN)
	if err != nil {
		return nil, err
	}
	defer stop()
	return memory(ctx, e, applied)
}

// EnvMemoryEnv is extra environment for the krane host (and through it the
// plugins) in the memory measurement, space-separated NAME=VALUE pairs:
// GOGC=100 to compare collector settings, or KRANE_PLUGIN_HEAP_PROFILE_DIR=DIR
// to have every process write a heap profile into DIR once measured.
const EnvMemoryEnv = "KRANE_BENCH_MEMORY_ENV"

// memory restarts krane with every controller over 2,000 deployments and
// 2,000 sentinels and reads the memory of the host and each plugin once
// the sentinel objects exist and deploymentsApplied (nil: already) is
// closed.
func memory(ctx context.Context, e *Env, deploymentsApplied <-chan struct{}) ([]Figure, error) {
	c := e.St.Clusters[e.Region]
	e.St.StopKrane(e.Region)
	if err := (bulk{e.Store.DB()}).sentinels(ctx, e.Region, "mem", bootN); err != nil {
		return nil, err
	}
	extra := strings.Fields(os.Getenv(EnvMemoryEnv))
	profiles := ""
	for _, kv := range extra {
		if v, ok := strings.CutPrefix(kv, sdk.EnvHeapProfileDir+"="); ok {
			profiles = v
		}
	}
	e.St.SetKraneEnv(e.Region, extra)
	defer e.St.SetKraneEnv(e.Region, nil)
	if err := e.St.StartKrane(ctx, e.Region); err != nil {
		return nil, err
	}
	if deploymentsApplied != nil {
		select {
		case <-deploymentsApplied:
		case <-time.After(5 * time.Minute):
			return nil, fmt.Errorf("krane did not apply the %d deployments' ReplicaSets within 5 minutes", bootN)
		}
	}
	// Informers have settled once the sentinel objects all exist.
	deadline := time.Now().Add(5 * time.Minute)
	for {
		list, err := c.Client.AppsV1().Deployments("sentinel").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=sentinel"})
		if err == nil && len(list.Items) >= bootN {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("sentinels not applied within 5 minutes")
		}
		time.Sleep(time.Second)
	}
	time.Sleep(5 * time.Second)
	host := e.St.Krane(e.Region).Pid()
	pids := []int{host}
	for pid := range children(host) {
		pids = append(pids, pid)
	}
	var figs []Figure
	for i, pid := range pids {
		m := procMemory(pid)
		name := commandName(pid) + " RSS"
		if i == 0 {
			name = "krane host RSS (2,000 deployments + 2,000 sentinels = 12,000 objects)"
		}
		figs = append(figs, Figure{Section: "5 memory", Name: name, Value: m.RSS, Unit: "MiB",
			Note: fmt.Sprintf("anonymous %.1f MiB, file-backed (executable) %.1f MiB", m.Anon, m.File)})
	}
	e.logf("memory: %v", figs)
	if profiles != "" {
		if err := heapProfiles(profiles, pids); err != nil {
			return nil, err
		}
		e.logf("memory: heap profiles in %s (go tool pprof -top -inuse_space FILE)", profiles)
	}
	return figs, nil
}

// heapProfiles sends SIGUSR1 to every process and waits until each has
// written a profile into dir (the processes were started with
// sdk.EnvHeapProfileDir=dir).
func heapProfiles(dir string, pids []int) error {
	for _, pid := range pids {
		if err := syscall.Kill(pid, syscall.SIGUSR1); err != nil {
			return fmt.Errorf("heap profile of process %d: %w", pid, err)
		}
	}
	deadline := time.Now().Add(time.Minute)
	for _, pid := range pids {
		for {
			if m, _ := filepath.Glob(filepath.Join(dir, fmt.Sprintf("*-%d-*.pprof", pid))); len(m) > 0 {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("process %d (%s) wrote no heap profile into %s within a minute of SIGUSR1; was it started with %s set?", pid, commandName(pid), dir, sdk.EnvHeapProfileDir)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	return nil
}

// quiet stops the cluster's controller-manager and scheduler, so only the
// measured writes reach the API server and no pods are made, and returns
// what starts them again.
func quiet(c *kubeenv.Cluster) (restore func()) {
	c.StopComponent("kube-controller-manager")
	c.StopComponent("kube-scheduler")
	return func() {
		_ = c.StartComponent("kube-controller-manager")
		_ = c.StartComponent("kube-scheduler")
	}
}
