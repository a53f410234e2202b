// Package chaos runs the whole system under a seeded random schedule of
// faults while desired state keeps changing, then checks that nothing was
// lost: each cluster's managed objects equal desired state exactly,
// objects without Krane's label are untouched, every deploy workflow has
// ended, no plugin process is orphaned, and every cursor reached ctrl's
// head. Two fault types take ctrl's database back in time (a restore from
// an older backup, a failover to a lagging replica); after each, before
// the churn goes on, the clusters must hold what the database ctrl came
// back on holds (dbfaults.go). `make chaos` runs it for CHAOS_DURATION; a
// short run is part of `make test`.
package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-sql-driver/mysql"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"krane.dev/ctrl/store"
	"krane.dev/internal/stack"
)

// Options shape a run.
type Options struct {
	// Duration of the fault schedule; faults come every FaultEvery on
	// average (jittered), changes every ChurnEvery.
	Duration   time.Duration
	FaultEvery time.Duration
	ChurnEvery time.Duration
	// Settle bounds the wait for convergence after the last fault.
	Settle time.Duration
	Seed   uint64
	Out    io.Writer
	// MinFaults extends the schedule past Duration until at least this
	// many faults were injected.
	MinFaults int
}

// Report is what a run found.
type Report struct {
	Seed          uint64
	Faults        map[string]int
	Changes       int
	APIDeploys    int
	Lost          []string // mismatches left after the settle period
	ConvergeAfter time.Duration
	// Goroutines of each region's krane: after its start, and at the end.
	Goroutines map[string][2]int
	// LeakedGoroutines counts goroutines past the allowance, over all
	// kranes; LeakedProcesses counts plugin processes without a live
	// krane, and kranes or plugins beyond the expected ones.
	LeakedGoroutines int
	LeakedProcesses  int
}

func (r Report) String() string {
	total := 0
	for _, n := range r.Faults {
		total += n
	}
	var b strings.Builder
	fmt.Fprintf(&b, "chaos seed %d: %d faults of %d types; %d desired-state changes and %d API deploys written\n",
		r.Seed, total, len(faults), r.Changes, r.APIDeploys)
	for _, f := range faults {
		fmt.Fprintf(&b, "  fault %-28s %4d\n", f.name, r.Faults[f.name])
	}
	var regions []string
	for region := range r.Goroutines {
		regions = append(regions, region)
	}
	sort.Strings(regions)
	for _, region := range regions {
		g := r.Goroutines[region]
		fmt.Fprintf(&b, "  krane %-8s goroutines %d after start, %d at the end\n", region, g[0], g[1])
	}
	fmt.Fprintf(&b, "lost: %d; leaked goroutines: %d; leaked processes: %d", len(r.Lost), r.LeakedGoroutines, r.LeakedProcesses)
	if len(r.Lost) == 0 {
		fmt.Fprintf(&b, "; converged %s after the last fault", r.ConvergeAfter.Round(100*time.Millisecond))
	} else {
		b.WriteString(":\n  " + strings.Join(r.Lost, "\n  "))
	}
	return b.String()
}

// run is what a fault acts on.
type run struct {
	st   *stack.Stack
	rng  *rand.Rand
	ch   *churn
	ck   *checker
	logf func(format string, args ...any)
	// replicas counts kranes started as standbys, for their names.
	replicas int
	// quiet is held by the churn for each of its ticks (a write, now and
	// then an API deploy): a fault that needs desired state still holds it.
	quiet sync.Mutex
	// stores are the stores the churn and the checker used (a failover
	// moves them to another server); Run closes them all.
	stores []*store.Store
	// dbMoves counts failovers, for the replicas' server ids (the first
	// primary is 1).
	dbMoves int
	// lost is what a fault found lost in its own check (the database
	// going back); the report adds it to what the end of the run finds.
	lost []string
}

// fault is one fault type, injected and recovered from by do.
type fault struct {
	name string
	do   func(ctx context.Context, r *run, region string) error
}

// FaultKinds names every fault type a run deals.
func FaultKinds() []string {
	names := make([]string, len(faults))
	for i, f := range faults {
		names[i] = f.name
	}
	return names
}

// faults are the fault types. A run deals them from a shuffled deck, so
// every type comes once before any comes twice: a short run still
// exercises them all, in an order the seed decides.
var faults = []fault{
	{"plugin-sigkill", killPlugin},
	{"krane-sigkill", func(ctx context.Context, r *run, region string) error {
		if err := r.st.RestartKrane(ctx, region, true); err != nil {
			return err
		}
		return r.ck.measure(ctx, region)
	}},
	{"ctrl-restart", func(_ context.Context, r *run, _ string) error {
		return r.st.RestartCtrl(r.rng.IntN(2) == 0)
	}},
	{"mysql-restart", func(_ context.Context, r *run, _ string) error {
		r.st.MySQL.Kill()
		time.Sleep(time.Duration(500+r.rng.IntN(2000)) * time.Millisecond)
		return r.st.MySQL.Start()
	}},
	{"restate-restart", func(_ context.Context, r *run, _ string) error {
		r.st.Restate.Kill()
		time.Sleep(time.Duration(500+r.rng.IntN(1500)) * time.Millisecond)
		return r.st.Restate.Start()
	}},
	{"apiserver-crash", func(_ context.Context, r *run, region string) error {
		return r.st.Clusters[region].RestartAPIServer(true)
	}},
	{"link-cut", func(_ context.Context, r *run, region string) error {
		r.st.Proxy(region).Cut()
		time.Sleep(time.Duration(1000+r.rng.IntN(4000)) * time.Millisecond)
		r.st.Proxy(region).Restore()
		return nil
	}},
	{"link-stall", func(_ context.Context, r *run, region string) error {
		r.st.Proxy(region).Stall()
		time.Sleep(time.Duration(1000+r.rng.IntN(4000)) * time.Millisecond)
		r.st.Proxy(region).Restore()
		return nil
	}},
	{"plugin-hung", hangPlugin},
	{"parked-past-max-pending", parkPastMaxPending},
	{"reload-missing-ca", reloadMissingCA},
	{"ctrl-stall", stallCtrl},
	{"leader-kill-mid-apply", killLeaderMidApply},
	{"db-restored-from-backup", restoreFromBackup},
	{"db-failover-lagging-replica", failoverToLaggingReplica},
}

// Run injects faults into st (started with ProxyCtrl) for o.Duration while
// changing desired state, then waits up to o.Settle for convergence.
func Run(ctx context.Context, st *stack.Stack, o Options) (Report, error) {
	rep := Report{Seed: o.Seed, Faults: map[string]int{}}
	// The driver logs every connection MySQL's restarts break; expected here.
	_ = mysql.SetLogger(log.New(io.Discard, "", 0))
	rng := rand.New(rand.NewPCG(o.Seed, 0x6b72616e65))
	s, err := store.Open(ctx, st.DSN, store.PoolOptions{})
	if err != nil {
		return rep, err
	}
	regs := regions(st)
	ch := &churn{s: s, rng: rand.New(rand.NewPCG(o.Seed, 1)), regions: regs}
	ck := &checker{st: st, s: s, baseline: map[int]int{}}
	r := &run{st: st, rng: rng, ch: ch, ck: ck, stores: []*store.Store{s}}
	defer func() {
		for _, s := range r.stores {
			_ = s.Close()
		}
	}()
	if err := setup(ctx, st, ck); err != nil {
		return rep, err
	}
	for _, region := range regs {
		if err := ck.measure(ctx, region); err != nil {
			return rep, err
		}
	}
	begin := time.Now()
	logf := func(format string, args ...any) {
		fmt.Fprintf(o.Out, "[%6.1fs] %s\n", time.Since(begin).Seconds(), fmt.Sprintf(format, args...))
	}
	r.logf = logf

	// Churn runs for the whole schedule; a write refused while MySQL is
	// down is simply not counted (the next one is attempted later).
	churnCtx, stopChurn := context.WithCancel(ctx)
	churnDone := make(chan struct{})
	go func() {
		defer close(churnDone)
		t := time.NewTicker(o.ChurnEvery)
		defer t.Stop()
		for n := 0; ; n++ {
			select {
			case <-churnCtx.Done():
				return
			case <-t.C:
			}
			r.quiet.Lock()
			wctx, cancel := context.WithTimeout(churnCtx, 5*time.Second)
			_ = ch.step(wctx)
			if n%15 == 7 { // now and then a deploy through the API (Restate workflow)
				args := []string{"deploy", "create", "--workspace", "chaos", "--project", "p", "--app", "a", "--environment", "chaos-api",
					"--image", fmt.Sprintf("registry.local/chaos/api:%d", n), "--replicas", "1", "--timeout", "3m"}
				if _, err := st.Ctrl(wctx, args...); err == nil {
					rep.APIDeploys++
				}
			}
			cancel()
			r.quiet.Unlock()
		}
	}()

	var deck []fault
	for injected := 0; (time.Since(begin) < o.Duration || injected < o.MinFaults) && ctx.Err() == nil; injected++ {
		wait := time.Duration(float64(o.FaultEvery) * (0.5 + rng.Float64()))
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
		if len(deck) == 0 {
			deck = slices.Clone(faults)
			rng.Shuffle(len(deck), func(i, j int) { deck[i], deck[j] = deck[j], deck[i] })
		}
		f := deck[0]
		deck = deck[1:]
		region := regs[rng.IntN(len(regs))]
		logf("fault %s (%s)", f.name, region)
		if err := f.do(ctx, r, region); err != nil {
			stopChurn()
			<-churnDone
			return rep, fmt.Errorf("fault %s in %s: recovery failed: %w", f.name, region, err)
		}
		rep.Faults[f.name]++
	}
	stopChurn()
	<-churnDone
	rep.Changes = ch.changes()
	last := time.Now()
	logf("schedule over: %d changes written; waiting up to %s for convergence", rep.Changes, o.Settle)
	progress := time.Now()
	for {
		mm := ck.mismatches(ctx)
		if len(mm) == 0 {
			rep.ConvergeAfter = time.Since(last)
			logf("converged")
			break
		}
		if time.Since(progress) > 15*time.Second {
			progress = time.Now()
			logf("not converged yet: %d differences, e.g. %s", len(mm), mm[0])
		}
		if time.Since(last) > o.Settle || ctx.Err() != nil {
			rep.Lost = mm
			break
		}
		time.Sleep(time.Second)
	}
	rep.Lost = append(rep.Lost, r.lost...)
	// Nothing may be left behind: processes at once, goroutines once
	// they had the settle period to wind down.
	procs := ck.processes()
	rep.LeakedProcesses = len(procs)
	rep.Lost = append(rep.Lost, procs...)
	rep.Goroutines = map[string][2]int{}
	for _, region := range regs {
		start, end, leaked, err := ck.goroutines(ctx, region)
		if err != nil {
			rep.Lost = append(rep.Lost, err.Error())
			continue
		}
		rep.Goroutines[region] = [2]int{start, end}
		if leaked > 0 {
			rep.LeakedGoroutines += leaked
			rep.Lost = append(rep.Lost, fmt.Sprintf("%s: krane has %d goroutines, %d after its start: %d more than the allowance of %d", region, end, start, leaked, goroutineAllowance))
		}
	}
	return rep, nil
}

// setup creates the churn's namespace and the look-alike objects.
func setup(ctx context.Context, st *stack.Stack, ck *checker) error {
	for _, region := range regions(st) {
		c := st.Clusters[region]
		if err := c.EnsureNamespace(ctx, chaosNS); err != nil {
			return err
		}
		// Same names and component labels as Krane's, no managed-by label.
		labels := map[string]string{"app.kubernetes.io/component": "deployment", "unkey.com/deployment.id": "chaos-dep-0"}
		zero := int32(0)
		rs := &appsv1.ReplicaSet{
			ObjectMeta: metav1.ObjectMeta{Name: "chaos-dep-0-lookalike", Namespace: chaosNS, Labels: labels},
			Spec: appsv1.ReplicaSetSpec{Replicas: &zero, Selector: &metav1.LabelSelector{MatchLabels: labels},
				Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "x", Image: "registry.local/not-krane:1"}}}}},
		}
		got, err := c.Client.AppsV1().ReplicaSets(chaosNS).Create(ctx, rs, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("create look-alike ReplicaSet: %w", err)
		}
		spec, _ := json.Marshal(got.Spec)
		ck.lookalikes = append(ck.lookalikes, lookalike{region, "ReplicaSet", chaosNS, got.Name, string(spec)})
		cnp := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "cilium.io/v2", "kind": "CiliumNetworkPolicy",
			"metadata": map[string]any{"name": "chaos-pol-0", "namespace": "default",
				"labels": map[string]any{"app.kubernetes.io/component": "ciliumnetworkpolicy", "unkey.com/networkpolicy.id": "chaos-pol-" + region + "-0"}},
			"spec": map[string]any{"endpointSelector": map[string]any{"matchLabels": map[string]any{"app": "other"}}, "ingress": []any{map[string]any{}}},
		}}
		gotCNP, err := c.Dynamic.Resource(cnpGVR).Namespace("default").Create(ctx, cnp, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("create look-alike policy: %w", err)
		}
		spec, _ = json.Marshal(gotCNP.Object["spec"])
		ck.lookalikes = append(ck.lookalikes, lookalike{region, "CiliumNetworkPolicy", "default", gotCNP.GetName(), string(spec)})
	}
	return nil
}

// killPlugin SIGKILLs one of a region's plugin processes.
func killPlugin(_ context.Context, r *run, region string) error {
	host := r.st.Krane(region).Pid()
	plugins := childPids(host)
	if len(plugins) == 0 {
		return nil // all restarting right now; nothing to kill
	}
	return syscall.Kill(plugins[r.rng.IntN(len(plugins))], syscall.SIGKILL)
}

func childPids(parent int) []int {
	var out []int
	for _, pid := range allPids() {
		if ppid, state := procStatus(pid); ppid == parent && state != "Z" {
			out = append(out, pid)
		}
	}
	sort.Ints(out)
	return out
}
