package controller_test

//lint:file-ignore SA1019 legacy-workload: removed no earlier than v0.3.0 (docs/compatibility.md); this file builds or reads the deprecated top-level workload fields

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"krane.dev/plugins/deployment/controller"
	"krane.dev/sdk"
	"krane.dev/sdk/kube"
	"krane.dev/sdk/plugintest"
)

// TestTemplateReplaceIgnoresConcurrentWrites: a hand-added env var survives
// server-side apply, so the plugin replaces the template. Other writers
// (the ReplicaSet controller writing status, a person editing labels)
// bump the resource version all the while; the replace must not depend on
// winning a race against them.
func TestTemplateReplaceIgnoresConcurrentWrites(t *testing.T) {
	cluster, _, _ := pluginIdentity(t)
	cleanupNamespace(t, cluster, "busy")
	ctx := context.Background()
	p := startPlugin(t, `{}`)
	ch := change(t, "dep_busy", 1, spec("busy", "web", image, 2))
	apply(t, p, ch, sdk.Applied)
	applyUntil(t, p, ch, sdk.Unchanged)
	rs := replicaSetsOf(t, cluster, "dep_busy")[0]
	rsClient := cluster.Client.AppsV1().ReplicaSets("busy")
	wantEnv := rs.Spec.Template.Spec.Containers[0].Env

	// Writers that change the ReplicaSet's labels and annotations as fast
	// as the API server lets them, as the ReplicaSet controller does with
	// its status while pods start.
	hammerCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var writes atomic.Int64
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; hammerCtx.Err() == nil; n++ {
				var patch string
				switch i {
				case 0:
					patch = fmt.Sprintf(`{"metadata":{"labels":{"hand/edit":"%d"}}}`, n)
				default:
					patch = fmt.Sprintf(`{"metadata":{"annotations":{"hand/edit-%d":"%d"}}}`, i, n)
				}
				if _, err := rsClient.Patch(hammerCtx, rs.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{FieldManager: "hand"}); err == nil {
					writes.Add(1)
				}
			}
		}()
	}
	defer func() { stop(); wg.Wait() }()

	for round := range 5 {
		name := fmt.Sprintf("INJECTED_%d", round)
		add := fmt.Sprintf(`[{"op": "add", "path": "/spec/template/spec/containers/0/env/-", "value": {"name": %q, "value": "1"}}]`, name)
		if _, err := rsClient.Patch(ctx, rs.Name, types.JSONPatchType, []byte(add), metav1.PatchOptions{FieldManager: "kubectl-edit"}); err != nil {
			t.Fatal(err)
		}
		// applyUntil fails the test on any Apply error, such as a conflict.
		applyUntil(t, p, ch, sdk.Applied)
		got, err := rsClient.Get(ctx, rs.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if env := got.Spec.Template.Spec.Containers[0].Env; !slices.EqualFunc(env, wantEnv, func(a, b corev1.EnvVar) bool { return a.Name == b.Name && a.Value == b.Value }) {
			t.Fatalf("round %d: env %v after the replace, want %v", round, env, wantEnv)
		}
	}
	stop()
	wg.Wait()
	t.Logf("%d concurrent writes during the replaces", writes.Load())
	apply(t, p, deleted("dep_busy", 2), sdk.Deleted)
}

// rollWatch records, from the API server's own watch streams, how many
// deployments have more than one ReplicaSet at each moment (rolling) and
// the fewest ready pods any deployment had while armed.
type rollWatch struct {
	mu         sync.Mutex
	rss        map[string]map[string]bool // deployment id -> ReplicaSet names
	readyPods  map[string]map[string]bool // deployment id -> ready, not terminating pods
	armed      bool
	maxRolling int
	minReady   map[string]int
}

func (w *rollWatch) rolling() int {
	n := 0
	for _, names := range w.rss {
		if len(names) > 1 {
			n++
		}
	}
	return n
}

func (w *rollWatch) onReplicaSet(obj any, gone bool) {
	if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj, gone = tomb.Obj, true
	}
	rs, ok := obj.(*appsv1.ReplicaSet)
	if !ok {
		return
	}
	id := rs.Labels[controller.LabelDeployment]
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.rss[id] == nil {
		w.rss[id] = map[string]bool{}
	}
	if gone {
		delete(w.rss[id], rs.Name)
	} else {
		w.rss[id][rs.Name] = true
	}
	if w.armed {
		w.maxRolling = max(w.maxRolling, w.rolling())
	}
}

func (w *rollWatch) onPod(obj any, gone bool) {
	if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj, gone = tomb.Obj, true
	}
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	id := pod.Labels[controller.LabelDeployment]
	ready := !gone && pod.DeletionTimestamp == nil && slices.ContainsFunc(pod.Status.Conditions, func(c corev1.PodCondition) bool {
		return c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue
	})
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.readyPods[id] == nil {
		w.readyPods[id] = map[string]bool{}
	}
	if ready {
		w.readyPods[id][pod.Name] = true
	} else {
		delete(w.readyPods[id], pod.Name)
	}
	if w.armed {
		if n, seen := w.minReady[id]; !seen || len(w.readyPods[id]) < n {
			w.minReady[id] = len(w.readyPods[id])
		}
	}
}

func (w *rollWatch) ready(id string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.readyPods[id])
}

func (w *rollWatch) replicaSets(id string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.rss[id])
}

func (w *rollWatch) arm() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.armed = true
	w.maxRolling = w.rolling()
}

// watchRolls starts watching the ReplicaSets and pods of namespace ns.
func watchRolls(t *testing.T, client kubernetes.Interface, ns string) *rollWatch {
	w := &rollWatch{rss: map[string]map[string]bool{}, readyPods: map[string]map[string]bool{}, minReady: map[string]int{}}
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(ns))
	handler := func(on func(any, bool)) cache.ResourceEventHandlerFuncs {
		return cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { on(obj, false) },
			UpdateFunc: func(_, obj any) { on(obj, false) },
			DeleteFunc: func(obj any) { on(obj, true) },
		}
	}
	if _, err := factory.Apps().V1().ReplicaSets().Informer().AddEventHandler(handler(w.onReplicaSet)); err != nil {
		t.Fatal(err)
	}
	if _, err := factory.Core().V1().Pods().Informer().AddEventHandler(handler(w.onPod)); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	factory.Start(stop)
	t.Cleanup(func() { close(stop); factory.Shutdown() })
	for typ, ok := range factory.WaitForCacheSync(stop) {
		if !ok {
			t.Fatalf("watch of %v never synced", typ)
		}
	}
	return w
}

// TestTemplateChangesRollBounded: a config change that alters every pod
// template (here the runtime class) rolls the deployments at most
// max_concurrent_rolls at a time, and each keeps its replicas ready: the
// new ReplicaSet is available before the old one goes.
func TestTemplateChangesRollBounded(t *testing.T) {
	const (
		ns       = "rolls"
		bound    = 10
		replicas = 2
	)
	n := 200
	if testing.Short() {
		n = 30
	}
	cluster, _, _ := pluginIdentity(t)
	cleanupNamespace(t, cluster, ns)
	p := startPlugin(t, fmt.Sprintf(`{"max_concurrent_rolls": %d}`, bound))
	w := watchRolls(t, cluster.Client, ns)

	changes := make([]sdk.Change, n)
	for i := range changes {
		d := spec(ns, fmt.Sprintf("web-%03d", i), image, replicas)
		d.CpuMillicores, d.MemoryMib = 10, 16
		changes[i] = change(t, fmt.Sprintf("dep_roll_%03d", i), 1, d)
	}
	applyAll := func(want ...sdk.Result) {
		t.Helper()
		var wg sync.WaitGroup
		errs := make(chan error, len(changes))
		work := make(chan sdk.Change)
		for range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ch := range work {
					got, err := plugintest.Apply(context.Background(), p, ch)
					if err == nil && !slices.Contains(want, got) {
						err = fmt.Errorf("result %s, want one of %v", got, want)
					}
					if err != nil {
						errs <- fmt.Errorf("Apply(%s): %w", ch.ID, err)
					}
				}
			}()
		}
		for _, ch := range changes {
			work <- ch
		}
		close(work)
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
	}
	settled := func(what string) {
		t.Helper()
		waitUntil(t, 5*time.Minute, what, func() bool {
			for _, ch := range changes {
				if w.replicaSets(ch.ID) != 1 || w.ready(ch.ID) != replicas {
					return false
				}
			}
			return true
		})
	}
	start := time.Now()
	applyAll(sdk.Applied)
	settled(fmt.Sprintf("%d deployments with %d ready pods each", n, replicas))
	t.Logf("%d deployments running after %s", n, time.Since(start).Round(time.Millisecond))

	// The config change: same versions, a new template for every one, as
	// after a plugin upgrade. The host re-applies everything (a resync).
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	w.arm()
	start = time.Now()
	if _, err := p.Configure(ctx, &sdk.ConfigureRequest{
		Region: "local", ClusterID: "test",
		Kube:   sdk.KubeSource{Path: identity.kubeconfig},
		Config: []byte(fmt.Sprintf(`{"max_concurrent_rolls": %d, "runtime_class": ""}`, bound)),
	}); err != nil {
		t.Fatal(err)
	}
	applyAll(sdk.Applied)
	settled("every deployment rolled to the new template")
	t.Logf("%d deployments rolled in %s", n, time.Since(start).Round(time.Millisecond))
	for _, ch := range changes {
		rss := replicaSetsOf(t, cluster, ch.ID)
		if len(rss) != 1 || rss[0].Spec.Template.Spec.RuntimeClassName != nil {
			t.Fatalf("%s: ReplicaSets %d after the roll, want 1 without a runtime class", ch.ID, len(rss))
		}
	}

	w.mu.Lock()
	defer w.mu.Unlock()
	t.Logf("at most %d deployments rolling at once (bound %d)", w.maxRolling, bound)
	if w.maxRolling > bound {
		t.Errorf("%d deployments rolled at once, bound %d", w.maxRolling, bound)
	}
	if w.maxRolling < 2 {
		t.Errorf("at most %d deployment rolled at once: the rolls did not overlap, the bound was not exercised", w.maxRolling)
	}
	for _, ch := range changes {
		if got := w.minReady[ch.ID]; got < replicas-1 {
			t.Errorf("%s fell to %d ready pods during the roll, want at least %d", ch.ID, got, replicas-1)
		}
	}
}

// TestStuckRollGivesUpItsSlot: with one roll slot, a deployment whose new
// pods never become available (an image that cannot be pulled) holds the
// slot only until roll_progress_deadline. Then another deployment's
// waiting template change rolls; the stuck one keeps serving from its old
// ReplicaSet, its Apply fails permanently saying which ReplicaSet was not
// available and why, and a newer version of it rolls normally.
func TestStuckRollGivesUpItsSlot(t *testing.T) {
	const (
		ns       = "stuck-rolls"
		deadline = 4 * time.Second
		replicas = 2
		badImage = "registry.example/kwok-fail-pull:v2"
	)
	cluster, _, _ := pluginIdentity(t)
	cleanupNamespace(t, cluster, ns)
	p := startPlugin(t, fmt.Sprintf(`{"max_concurrent_rolls": 1, "roll_progress_deadline": %q}`, deadline))
	w := watchRolls(t, cluster.Client, ns)

	stuck := spec(ns, "stuck", image, replicas)
	next := spec(ns, "next", image, replicas)
	apply(t, p, change(t, "dep_stuck", 1, stuck), sdk.Applied)
	apply(t, p, change(t, "dep_next", 1, next), sdk.Applied)
	waitUntil(t, time.Minute, "both deployments running", func() bool {
		return w.ready("dep_stuck") == replicas && w.ready("dep_next") == replicas
	})
	oldRS := replicaSetsOf(t, cluster, "dep_stuck")
	if len(oldRS) != 1 {
		t.Fatalf("dep_stuck has %d ReplicaSets, want 1", len(oldRS))
	}
	oldPods := uids(podsOf(t, cluster, ns, "dep_stuck"))

	// dep_stuck takes the only slot with a template that never becomes
	// available; dep_next's template change must wait for it.
	w.arm()
	stuck.Image = badImage
	start := time.Now()
	apply(t, p, change(t, "dep_stuck", 2, stuck), sdk.Applied)
	next.EnvVars = map[string]string{"GREETING": "bonjour"}
	apply(t, p, change(t, "dep_next", 2, next), sdk.Applied)

	waitUntil(t, time.Minute, "dep_next rolled to its new template", func() bool {
		rss := replicaSetsOf(t, cluster, "dep_next")
		return len(rss) == 1 && kube.AppliedVersion(rss[0].Annotations) == 2 && w.ready("dep_next") == replicas
	})
	rolled := replicaSetsOf(t, cluster, "dep_next")[0]
	// Creation times are whole seconds, truncated.
	if created := rolled.CreationTimestamp.Add(time.Second); created.Before(start.Add(deadline)) {
		t.Errorf("dep_next's new ReplicaSet was created at %s, %s after dep_stuck took the slot: before the deadline %s",
			rolled.CreationTimestamp.Time, rolled.CreationTimestamp.Sub(start), deadline)
	}
	t.Logf("dep_next rolled %s after dep_stuck took the only slot (deadline %s)", time.Since(start).Round(time.Millisecond), deadline)

	// dep_stuck still serves from its old ReplicaSet, with the same pods.
	rss := replicaSetsOf(t, cluster, "dep_stuck")
	var broken string
	keptOld := false
	for _, rs := range rss {
		switch {
		case rs.UID == oldRS[0].UID && rs.DeletionTimestamp == nil:
			keptOld = true
		case rs.Spec.Template.Spec.Containers[0].Image == badImage:
			broken = rs.Name
		}
	}
	if !keptOld || broken == "" {
		t.Fatalf("dep_stuck's ReplicaSets after the deadline: %d (kept the old one: %t, new one: %q)", len(rss), keptOld, broken)
	}
	var still []string
	for _, pod := range podsOf(t, cluster, ns, "dep_stuck") {
		if slices.Contains(oldPods, string(pod.UID)) && pod.DeletionTimestamp == nil {
			still = append(still, string(pod.UID))
		}
	}
	if len(still) != len(oldPods) {
		t.Errorf("dep_stuck kept %d of its %d old pods", len(still), len(oldPods))
	}
	w.mu.Lock()
	minReady := w.minReady["dep_stuck"]
	w.mu.Unlock()
	if minReady < replicas {
		t.Errorf("dep_stuck fell to %d ready pods while its roll was stuck, want %d", minReady, replicas)
	}

	// The host's next Apply of that version (its resync) learns why.
	_, err := plugintest.Apply(context.Background(), p, change(t, "dep_stuck", 2, stuck))
	if err == nil || !sdk.IsPermanent(err) {
		t.Fatalf("Apply(dep_stuck v2) after the deadline: %v, want a permanent error", err)
	}
	for _, want := range []string{"deployment dep_stuck", ns + "/" + broken, "roll_progress_deadline " + deadline.String(),
		"0 of 2 replicas available", "ImagePull", "keeps serving from ReplicaSet " + ns + "/" + oldRS[0].Name} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the failure %q does not say %q", err, want)
		}
	}

	// A restarted plugin finds dep_stuck mid-roll, counts its deadline
	// from the new ReplicaSet's creation, and fails its Apply at once.
	config := fmt.Sprintf(`{"max_concurrent_rolls": 1, "roll_progress_deadline": %q}`, deadline)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	p = startPlugin(t, config)
	_, err = plugintest.Apply(context.Background(), p, change(t, "dep_stuck", 2, stuck))
	if err == nil || !sdk.IsPermanent(err) || !strings.Contains(err.Error(), ns+"/"+broken) {
		t.Fatalf("Apply(dep_stuck v2) on a restarted plugin: %v, want the roll's failure at once", err)
	}
	if n := len(replicaSetsOf(t, cluster, "dep_stuck")); n != 2 {
		t.Fatalf("dep_stuck has %d ReplicaSets after the restarted plugin's Apply, want the old and the stuck one", n)
	}

	// A newer version rolls again, normally.
	stuck.Image = image
	stuck.EnvVars = map[string]string{"GREETING": "fixed"}
	apply(t, p, change(t, "dep_stuck", 3, stuck), sdk.Applied)
	waitUntil(t, time.Minute, "dep_stuck rolled to version 3", func() bool {
		rss := replicaSetsOf(t, cluster, "dep_stuck")
		return len(rss) == 1 && kube.AppliedVersion(rss[0].Annotations) == 3 && w.ready("dep_stuck") == replicas
	})
	apply(t, p, deleted("dep_stuck", 4), sdk.Deleted)
	apply(t, p, deleted("dep_next", 3), sdk.Deleted)
}
