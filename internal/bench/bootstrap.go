package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"krane.dev/internal/testenv/kubeenv"
	"krane.dev/plugins/deployment/controller"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
	"krane.dev/sdk"
	"krane.dev/sdk/kube"
)

// onlyDeployments runs krane with the deployment controller alone, and a
// resync soon after the bootstrap (measured next).
func (e *Env) onlyDeployments() []string {
	return []string{"KRANE_CONTROLLER__SENTINEL__ENABLED=false", "KRANE_CONTROLLER__CILIUM__ENABLED=false",
		fmt.Sprintf("KRANE_SYNC__RESYNC_INTERVAL=%ds", e.size(20, 5)), "KRANE_SYNC__WORKERS=32"}
}

// Bootstrap measures a fresh krane host bootstrapping 2,000 deployments
// against raw client-go server-side apply of exactly the same ReplicaSets
// (the plugin's own builder and apply call) with 32 workers, against the
// same API server in the same run (median of 3, alternating; each arm is
// timed until a watch saw the last object), with the CPU each arm's
// processes spent per 1,000 objects: on a saturated machine the
// throughput ratio is the ratio of CPU, and these say whose. Then the
// first resync of those 2,000 unchanged objects: API writes, CPU of host
// and plugin, wall time. The controller-manager and scheduler are stopped
// meanwhile, so only these writes reach the API server (no pods are made;
// both arms measure applying objects).
func Bootstrap(ctx context.Context, e *Env) ([]Figure, error) {
	bootN := e.size(2000, 50)
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
			Replicas: 1, Workload: &clusterv1.Workload{Image: "registry.local/bench/app:1", CpuMillicores: 100, MemoryMib: 64, EnvVars: map[string]string{"MODE": "bench"}, Port: 8080}}
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
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	cfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	rawRSs := cs.AppsV1().ReplicaSets(rawNS)
	apiserver := c.Pid("kube-apiserver")
	perK := func(cpu float64) float64 { return cpu * 1000 / float64(bootN) }
	var rawRates, kraneRates []float64
	var rawAPI, rawClient, kraneAPI, kraneOwn []float64
	for rep := range e.reps() {
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
		api0, self0 := procCPU(apiserver), procCPU(os.Getpid())
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
		rawAPI = append(rawAPI, perK(procCPU(apiserver)-api0))
		rawClient = append(rawClient, perK(procCPU(os.Getpid())-self0))
		<-rawProfile
		rawRates = append(rawRates, float64(bootN)/raw.Seconds())
		rawCPU, rawCalls := cpuSince(cpuBefore), apiCallsSince(ctx, c, callsBefore)

		// Krane: a fresh host bootstraps the same objects from ctrl.
		if err := clearRS(ctx, c, ns); err != nil {
			return nil, err
		}
		e.St.SetKraneEnv(e.Region, e.onlyDeployments())
		count, stop, err := countAdded(ctx, c, ns, bootN)
		if err != nil {
			return nil, err
		}
		cpuBefore = cpuByCommand()
		api0, ctrl0 := procCPU(apiserver), procCPU(e.St.CtrlPid())
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
		// The host and its plugin started with the arm: all their CPU so
		// far is the bootstrap's.
		host := e.St.Krane(e.Region).Pid()
		hostCPU, ctrlCPU := procCPU(host), procCPU(e.St.CtrlPid())-ctrl0
		var pluginCPU float64
		for pid := range children(host) {
			pluginCPU += procCPU(pid)
		}
		kraneAPI = append(kraneAPI, perK(procCPU(apiserver)-api0))
		kraneOwn = append(kraneOwn, perK(hostCPU+pluginCPU+ctrlCPU))
		e.logf("bootstrap: run %d: CPU per 1,000 objects: API server %.2f s in the raw arm (client %.2f), %.2f s in the krane arm; krane's own %.2f s (host %.2f, plugin %.2f, ctrl %.2f)",
			rep+1, rawAPI[rep], rawClient[rep], kraneAPI[rep], kraneOwn[rep], perK(hostCPU), perK(pluginCPU), perK(ctrlCPU))
		<-kraneProfile
		kraneRates = append(kraneRates, float64(bootN)/took.Seconds())
		// Where the CPU went: the machine has two cores, and both arms
		// are bound by them, not by client rate limits.
		e.logf("bootstrap: run %d: CPU during the raw arm, %s", rep+1, rawCPU)
		e.logf("bootstrap: run %d: CPU during the krane arm, %s", rep+1, cpuSince(cpuBefore))
		e.logf("bootstrap: run %d: API requests during the raw arm: %s", rep+1, rawCalls)
		e.logf("bootstrap: run %d: API requests during the krane arm: %s", rep+1, apiCallsSince(ctx, c, callsBefore))
		e.logf("bootstrap: run %d: raw client-go %s (%.0f/s; its applies returned at %s), krane %s (%.0f/s, process start included)",
			rep+1, raw.Round(time.Millisecond), rawRates[rep], applied.Round(time.Millisecond), took.Round(time.Millisecond), kraneRates[rep])
		if rep < e.reps()-1 {
			e.St.StopKrane(e.Region)
		}
	}
	n := Format(float64(bootN))
	figs := []Figure{
		{Key: "raw", Name: fmt.Sprintf("raw client-go server-side apply, %s ReplicaSets, 32 workers", n), Value: median(rawRates), Unit: "objects/s"},
		{Key: "krane", Name: fmt.Sprintf("fresh krane host bootstrapping the same %s from ctrl", n), Value: median(kraneRates), Unit: "objects/s", Note: "process start to last object applied; sync.workers 32"},
		{Key: "ratio", Name: "krane / raw", Value: median(kraneRates) / median(rawRates), Unit: "ratio", Target: AtLeast(0.9)},
		{Key: "cpu-krane", Name: "CPU per 1,000 objects, krane arm: krane's processes (host, plugin, ctrl)", Value: median(kraneOwn), Unit: "CPU s"},
		{Key: "cpu-apiserver-krane", Name: "CPU per 1,000 objects, krane arm: the API server", Value: median(kraneAPI), Unit: "CPU s"},
		{Key: "cpu-apiserver-raw", Name: "CPU per 1,000 objects, raw arm: the API server", Value: median(rawAPI), Unit: "CPU s"},
		{Key: "cpu-client-raw", Name: "CPU per 1,000 objects, raw arm: the client (this benchmark)", Value: median(rawClient), Unit: "CPU s", Note: "its watch of the objects included, which the krane arm runs too"},
	}
	rf, err := resyncCost(ctx, e, bootN)
	if err != nil {
		return nil, err
	}
	// Every controller again, for what runs next.
	e.St.SetKraneEnv(e.Region, nil)
	if err := e.St.RestartKrane(ctx, e.Region, false); err != nil {
		return nil, err
	}
	return append(figs, rf...), nil
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
func resyncCost(ctx context.Context, e *Env, bootN int) ([]Figure, error) {
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
		if n >= float64(bootN) {
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
		{Key: "resync-writes", Name: fmt.Sprintf("API write calls in a resync of %s unchanged objects", Format(float64(bootN))), Value: w1 - w0, Unit: "calls", Target: Exactly(0), Note: "apiserver_request_total, mutating verbs on replicasets"},
		{Key: "resync-cpu", Name: "CPU of host + plugins for that resync", Value: cpu1 - cpu0, Unit: "CPU s", Note: "from the last sample before its first apply (50 ms granularity)"},
		{Key: "resync-wall", Name: "wall time of the resync (first to last apply)", Value: float64(wall.Milliseconds()), Unit: "ms"},
	}, nil
}

// Memory measures the memory of the krane host and each plugin over
// 2,000 deployments and 2,000 sentinels (a smoke run: 20 of each): the
// region's running ones are topped up to that many, krane restarts with
// every controller, and once the new objects exist each process's
// resident memory is read, anonymous (heap, stacks) and file-backed
// (mostly executable text) apart. As in Bootstrap, the controller-manager
// and scheduler are stopped, so the caches hold the plugins' own objects
// and no pods.
func Memory(ctx context.Context, e *Env) ([]Figure, error) {
	want := e.size(2000, 20)
	c := e.St.Clusters[e.Region]
	defer quiet(c)()
	e.St.StopKrane(e.Region)
	db := e.Store.DB()
	var deps, sents int
	if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM deployment_topology WHERE region = ? AND desired_status = 'running'", e.Region).Scan(&deps); err != nil {
		return nil, fmt.Errorf("count the region's deployments: %w", err)
	}
	if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM sentinels WHERE region = ? AND desired_state = 'running'", e.Region).Scan(&sents); err != nil {
		return nil, fmt.Errorf("count the region's sentinels: %w", err)
	}
	ns := "ws-bench-mem"
	newDeps, newSents := max(0, want-deps), max(0, want-sents)
	if newDeps > 0 {
		if err := (bulk{db}).deployments(ctx, e.Region, ns, "mem-d", newDeps, 1); err != nil {
			return nil, err
		}
		if err := c.EnsureNamespace(ctx, ns); err != nil {
			return nil, err
		}
	}
	if newSents > 0 {
		if err := (bulk{db}).sentinels(ctx, e.Region, "mem", newSents); err != nil {
			return nil, err
		}
	}
	applied, stop, err := countAdded(ctx, c, ns, newDeps)
	if err != nil {
		return nil, err
	}
	defer stop()
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
	if newDeps > 0 {
		select {
		case <-applied:
		case <-time.After(5 * time.Minute):
			return nil, fmt.Errorf("krane did not apply the %d new deployments' ReplicaSets within 5 minutes", newDeps)
		}
	}
	// Informers have settled once the new sentinels' objects all exist.
	deadline := time.Now().Add(5 * time.Minute)
	for newSents > 0 {
		list, err := c.Client.AppsV1().Deployments("sentinel").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=sentinel"})
		n := 0
		if err == nil {
			for _, d := range list.Items {
				if strings.HasPrefix(d.Name, "mem-") {
					n++
				}
			}
		}
		if n >= newSents {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%d of %d sentinels applied within 5 minutes", n, newSents)
		}
		time.Sleep(time.Second)
	}
	time.Sleep(5 * time.Second)
	host := e.St.Krane(e.Region).Pid()
	pids := []int{host}
	for pid := range children(host) {
		pids = append(pids, pid)
	}
	slices.Sort(pids[1:])
	var figs []Figure
	var all memUse
	for i, pid := range pids {
		m := procMemory(pid)
		all.RSS, all.Anon, all.File = all.RSS+m.RSS, all.Anon+m.Anon, all.File+m.File
		name := commandName(pid)
		if i == 0 {
			name = "krane host"
		}
		figs = append(figs, memFigures(strings.TrimPrefix(commandName(pid), "krane-plugin-"), name, m, nil)...)
	}
	figs = append(figs, memFigures("all", fmt.Sprintf("all %d processes", len(pids)), all, AtMost(250))...)
	figs[0].Note = fmt.Sprintf("%d deployments and %d sentinels running in the region (%d and %d added for this measurement)", max(deps, want), max(sents, want), newDeps, newSents)
	e.logf("memory: %v", figs)
	if profiles != "" {
		if err := heapProfiles(profiles, pids); err != nil {
			return nil, err
		}
		e.logf("memory: heap profiles in %s (go tool pprof -top -inuse_space FILE)", profiles)
	}
	return figs, nil
}

// EnvMemoryEnv is extra environment for the krane host (and through it the
// plugins) in the memory measurement, space-separated NAME=VALUE pairs:
// GOGC=100 to compare collector settings, or KRANE_PLUGIN_HEAP_PROFILE_DIR=DIR
// to have every process write a heap profile into DIR once measured.
const EnvMemoryEnv = "KRANE_BENCH_MEMORY_ENV"

// memFigures are a process's resident memory, all of it and its
// anonymous and file-backed parts.
func memFigures(key, name string, m memUse, rssTarget *Target) []Figure {
	return []Figure{
		{Key: key + "/rss", Name: name + ": RSS", Value: m.RSS, Unit: "MiB", Target: rssTarget},
		{Key: key + "/anon", Name: name + ": anonymous", Value: m.Anon, Unit: "MiB"},
		{Key: key + "/file", Name: name + ": file-backed (executable)", Value: m.File, Unit: "MiB"},
	}
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
