// Package chaos runs the whole system under a seeded random schedule of
// faults while desired state keeps changing, then checks that nothing was
// lost: each cluster's managed objects equal desired state exactly,
// objects without Krane's label are untouched, every deploy workflow has
// ended, no plugin process is orphaned, and every cursor reached ctrl's
// head. `make chaos` runs it for CHAOS_DURATION; a short run is part of
// `make test`.
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
}

func (r Report) String() string {
	var kinds []string
	total := 0
	for k, n := range r.Faults {
		kinds = append(kinds, fmt.Sprintf("%s=%d", k, n))
		total += n
	}
	sort.Strings(kinds)
	s := fmt.Sprintf("chaos seed %d: %d faults (%s); %d desired-state changes and %d API deploys written; %d lost",
		r.Seed, total, strings.Join(kinds, " "), r.Changes, r.APIDeploys, len(r.Lost))
	if len(r.Lost) == 0 {
		s += fmt.Sprintf("; converged %s after the last fault", r.ConvergeAfter.Round(100*time.Millisecond))
	} else {
		s += ":\n  " + strings.Join(r.Lost, "\n  ")
	}
	return s
}

// fault is one fault type, injected and recovered from by do.
type fault struct {
	name string
	do   func(ctx context.Context, st *stack.Stack, rng *rand.Rand, region string) error
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
	{"krane-sigkill", func(ctx context.Context, st *stack.Stack, _ *rand.Rand, region string) error {
		return st.RestartKrane(ctx, region, true)
	}},
	{"ctrl-restart", func(_ context.Context, st *stack.Stack, rng *rand.Rand, _ string) error {
		return st.RestartCtrl(rng.IntN(2) == 0)
	}},
	{"mysql-restart", func(_ context.Context, st *stack.Stack, rng *rand.Rand, _ string) error {
		st.MySQL.Kill()
		time.Sleep(time.Duration(500+rng.IntN(2000)) * time.Millisecond)
		return st.MySQL.Start()
	}},
	{"restate-restart", func(_ context.Context, st *stack.Stack, rng *rand.Rand, _ string) error {
		st.Restate.Kill()
		time.Sleep(time.Duration(500+rng.IntN(1500)) * time.Millisecond)
		return st.Restate.Start()
	}},
	{"apiserver-crash", func(_ context.Context, st *stack.Stack, _ *rand.Rand, region string) error {
		return st.Clusters[region].RestartAPIServer(true)
	}},
	{"link-cut", func(_ context.Context, st *stack.Stack, rng *rand.Rand, region string) error {
		st.Proxy(region).Cut()
		time.Sleep(time.Duration(1000+rng.IntN(4000)) * time.Millisecond)
		st.Proxy(region).Restore()
		return nil
	}},
	{"link-stall", func(_ context.Context, st *stack.Stack, rng *rand.Rand, region string) error {
		st.Proxy(region).Stall()
		time.Sleep(time.Duration(1000+rng.IntN(4000)) * time.Millisecond)
		st.Proxy(region).Restore()
		return nil
	}},
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
	defer s.Close()
	regs := regions(st)
	ch := &churn{s: s, rng: rand.New(rand.NewPCG(o.Seed, 1)), regions: regs}
	ck := &checker{st: st, s: s}
	if err := setup(ctx, st, ck); err != nil {
		return rep, err
	}
	begin := time.Now()
	logf := func(format string, args ...any) {
		fmt.Fprintf(o.Out, "[%6.1fs] %s\n", time.Since(begin).Seconds(), fmt.Sprintf(format, args...))
	}

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
		if err := f.do(ctx, st, rng, region); err != nil {
			stopChurn()
			<-churnDone
			return rep, fmt.Errorf("fault %s in %s: recovery failed: %w", f.name, region, err)
		}
		rep.Faults[f.name]++
	}
	stopChurn()
	<-churnDone
	rep.Changes = ch.written
	last := time.Now()
	logf("schedule over: %d changes written; waiting up to %s for convergence", ch.written, o.Settle)
	for {
		mm := ck.mismatches(ctx)
		if len(mm) == 0 {
			rep.ConvergeAfter = time.Since(last)
			logf("converged")
			return rep, nil
		}
		if time.Since(last) > o.Settle || ctx.Err() != nil {
			rep.Lost = mm
			return rep, nil
		}
		time.Sleep(time.Second)
	}
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
func killPlugin(_ context.Context, st *stack.Stack, rng *rand.Rand, region string) error {
	host := st.Krane(region).Pid()
	plugins := childPids(host)
	if len(plugins) == 0 {
		return nil // all restarting right now; nothing to kill
	}
	return syscall.Kill(plugins[rng.IntN(len(plugins))], syscall.SIGKILL)
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
