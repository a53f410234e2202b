package controller

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/cache"

	clusterv1 "krane.dev/proto/krane/cluster/v1"
	"krane.dev/sdk"
	"krane.dev/sdk/kube"
)

// A roll is the replacement of a deployment's pod template: a new
// ReplicaSet (a new template hash, or a new name or namespace) next to the
// old ones. The old ReplicaSets stay until the new one has all its
// replicas available (ready for the ReplicaSet's minReadySeconds), so a
// template change never takes a deployment below its replica count. A
// plugin upgrade or a config change (runtime class, tolerations, ...)
// changes the template of every deployment at once; at most
// max_concurrent_rolls deployments of the cluster roll at the same time,
// the others wait in order and start as slots free.
//
// A deployment holds its slot from the moment its new ReplicaSet is
// written until the plugin's cache no longer holds any other ReplicaSet of
// it (the old ones are deleted in the foreground, so that is after their
// pods are gone).
//
// A roll whose new ReplicaSet is not available within
// roll_progress_deadline of its start gives up: its slot goes to the next
// waiting deployment, and nothing is deleted, so the deployment keeps
// serving from its old ReplicaSet (the new one stays too, with its failing
// pods, for the operator to see). The failure is remembered per
// deployment: the Apply of that template at that version or an older one
// (the host's resync) fails permanently with it, which the host reports to
// ctrl as the deployment's apply error, unless the ReplicaSet has become
// available since (then the roll goes on). A newer version, another
// template or a delete starts afresh. A restarted plugin finds such a
// deployment mid-roll (two ReplicaSets), adopts it, and fails it again at
// once: the deadline of an adopted roll counts from its ReplicaSet's
// creation.
type roller struct {
	mu       sync.Mutex
	max      int
	deadline time.Duration
	active   map[string]*roll      // deployment id -> its roll (holds a slot)
	queue    []string              // ids waiting for a slot, oldest first
	waiting  map[string]sdk.Change // the latest change of each waiting id
	wake     chan struct{}         // a pending progress check (buffer of 1)
	dirty    map[string]bool       // ids whose roll needs a look
	failed   map[string]rollFailure
}

type roll struct {
	// ns/name of the ReplicaSet the deployment rolls to; "" until written
	// (or for a roll found in the cluster at Configure: then the newest).
	ns, name string
	// version is the change the roll writes (0 for an adopted roll: then
	// the target's applied version).
	version uint64
	// started is when the roll got its slot (for an adopted roll, the
	// target's creation); zero until known.
	started time.Time
	// timer pokes the roll at its deadline.
	timer *time.Timer
}

// rollFailure is a roll that missed its deadline.
type rollFailure struct {
	ns, name string // the ReplicaSet that never became available
	version  uint64
	err      error // permanent, names the deployment, ReplicaSet and pods
}

func newRoller() *roller {
	return &roller{
		max:      defaultMaxConcurrentRolls,
		deadline: defaultRollProgressDeadline,
		active:   map[string]*roll{},
		waiting:  map[string]sdk.Change{},
		wake:     make(chan struct{}, 1),
		dirty:    map[string]bool{},
		failed:   map[string]rollFailure{},
	}
}

// newRoll starts the clock of a roll that just got its slot. Called with
// r.mu held.
func (r *roller) newRoll(id string) *roll {
	ro := &roll{}
	r.start(id, ro, time.Now())
	return ro
}

// start sets ro's start and arms its deadline timer. Called with r.mu held.
func (r *roller) start(id string, ro *roll, at time.Time) {
	ro.started = at
	if ro.timer != nil {
		ro.timer.Stop()
	}
	// A timer that fires late or for a released roll only pokes: progress
	// looks at the roll as it is then.
	ro.timer = time.AfterFunc(time.Until(at.Add(r.deadline)), func() { r.poke(id) })
}

// stopRoll disarms ro's timer. Called with r.mu held.
func stopRoll(ro *roll) {
	if ro.timer != nil {
		ro.timer.Stop()
	}
}

// admitted is a waiting change given a slot; the caller applies it.
type admitted struct {
	id string
	ch sdk.Change
}

// acquire gives id a roll slot (or confirms the one it holds). When every
// slot is taken it remembers ch as id's latest change, to be applied when a
// slot frees, and returns false.
func (r *roller) acquire(id string, ch sdk.Change) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.active[id]; ok {
		return true
	}
	if len(r.active) < r.max {
		r.active[id] = r.newRoll(id)
		r.dropWaiting(id)
		return true
	}
	if _, ok := r.waiting[id]; !ok {
		r.queue = append(r.queue, id)
	}
	r.waiting[id] = ch
	return false
}

// setTarget records the ReplicaSet id rolls to, written at version. A
// roll whose clock has not started (adopted from the cluster) starts it
// at started.
func (r *roller) setTarget(id, ns, name string, version uint64, started time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if ro, ok := r.active[id]; ok {
		ro.ns, ro.name, ro.version = ns, name, version
		if ro.started.IsZero() {
			r.start(id, ro, started)
		}
	}
}

// adopted gives an adopted roll (found in the cluster) its target and the
// start of its clock, the target's creation.
func (r *roller) adopted(id, ns, name string, version uint64, created time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if ro, ok := r.active[id]; ok && ro.name == "" {
		ro.ns, ro.name, ro.version = ns, name, version
		if ro.started.IsZero() {
			r.start(id, ro, created)
		}
	}
}

// fail records that id's roll missed its deadline and frees its slot.
func (r *roller) fail(id string, f rollFailure) []admitted {
	r.mu.Lock()
	r.failed[id] = f
	r.mu.Unlock()
	return r.release(id)
}

// failure returns the recorded failure of id's roll to ns/name when a
// change at version would repeat it: the same ReplicaSet at that version
// or an older one. Any other change forgets the failure.
func (r *roller) failure(id, ns, name string, version uint64) (rollFailure, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	f, ok := r.failed[id]
	if !ok {
		return rollFailure{}, false
	}
	if f.ns == ns && f.name == name && version <= f.version {
		return f, true
	}
	delete(r.failed, id)
	return rollFailure{}, false
}

// forget drops a recorded failure (the deployment was deleted).
func (r *roller) forget(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.failed, id)
}

// target returns id's roll, if it holds a slot.
func (r *roller) target(id string) (roll, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ro, ok := r.active[id]
	if !ok {
		return roll{}, false
	}
	cp := *ro
	cp.timer = nil
	return cp, true
}

// holds reports whether id holds a slot.
func (r *roller) holds(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.active[id]
	return ok
}

// release frees id's slot (and forgets a waiting change of it) and hands
// the freed slots to the oldest waiting deployments.
func (r *roller) release(id string) []admitted {
	r.mu.Lock()
	defer r.mu.Unlock()
	if ro, ok := r.active[id]; ok {
		stopRoll(ro)
	}
	delete(r.active, id)
	r.dropWaiting(id)
	return r.admit()
}

// resize sets the bound and the deadline; a larger bound admits waiting
// deployments at once. Rolls already running beyond a smaller one finish.
// A new deadline applies to the running rolls too, from their start.
func (r *roller) resize(n int, deadline time.Duration) []admitted {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.max = n
	if deadline != r.deadline {
		r.deadline = deadline
		for id, ro := range r.active {
			if !ro.started.IsZero() {
				r.start(id, ro, ro.started)
			}
		}
	}
	return r.admit()
}

// expired reports whether a roll that started at started is past the
// deadline.
func (r *roller) expired(started time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return !started.IsZero() && time.Since(started) >= r.deadline
}

// adopt gives a slot to id, whose roll was found in the cluster (started
// before this process or this configuration), even beyond the bound: its
// pods are already there.
func (r *roller) adopt(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.active[id]; !ok {
		r.active[id] = &roll{}
	}
	r.dropWaiting(id)
}

func (r *roller) admit() []admitted {
	var out []admitted
	for len(r.active) < r.max && len(r.queue) > 0 {
		id := r.queue[0]
		r.queue = r.queue[1:]
		ch, ok := r.waiting[id]
		if !ok {
			continue
		}
		delete(r.waiting, id)
		r.active[id] = r.newRoll(id)
		out = append(out, admitted{id, ch})
	}
	return out
}

func (r *roller) dropWaiting(id string) {
	if _, ok := r.waiting[id]; ok {
		delete(r.waiting, id)
		r.queue = slices.DeleteFunc(r.queue, func(q string) bool { return q == id })
	}
}

// counts returns the number of rolling and waiting deployments.
func (r *roller) counts() (rolling, waiting int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.active), len(r.waiting)
}

// poke asks the progress loop to look at id's roll.
func (r *roller) poke(id string) {
	r.mu.Lock()
	if _, ok := r.active[id]; !ok {
		r.mu.Unlock()
		return
	}
	r.dirty[id] = true
	r.mu.Unlock()
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

func (r *roller) takeDirty() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	ids := make([]string, 0, len(r.dirty))
	for id := range r.dirty {
		ids = append(ids, id)
	}
	clear(r.dirty)
	return ids
}

// rollEvents tells the progress loop about every ReplicaSet change of a
// rolling deployment: a new ReplicaSet becoming available, an old one gone.
func (c *Controller) rollEvents() cache.ResourceEventHandlerFuncs {
	poke := func(obj any) {
		if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = tomb.Obj
		}
		if rs, ok := obj.(*appsv1.ReplicaSet); ok {
			c.rolls.poke(rs.Labels[LabelDeployment])
		}
	}
	return cache.ResourceEventHandlerFuncs{AddFunc: poke, UpdateFunc: func(_, obj any) { poke(obj) }, DeleteFunc: poke}
}

// progressRolls runs until ctx ends: it finishes the rolls whose new
// ReplicaSet is available and frees the slots of finished ones. It is
// driven by informer events (rollEvents) and by Apply.
func (c *Controller) progressRolls(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.rolls.wake:
		}
		for _, id := range c.rolls.takeDirty() {
			unlock := c.idLocks.lock(id)
			next := c.progress(ctx, id)
			unlock()
			c.startAdmitted(ctx, next)
		}
	}
}

// progress looks at one roll: when the new ReplicaSet is available, the
// others are deleted; when no other is left, the slot is freed.
func (c *Controller) progress(ctx context.Context, id string) []admitted {
	ro, ok := c.rolls.target(id)
	_, k := c.state()
	if !ok || k == nil {
		return nil
	}
	all, err := ofDeployment[*appsv1.ReplicaSet](k.replicaSetIndex, id)
	if err != nil {
		return nil
	}
	if ro.name == "" {
		// Found in the cluster, or not written yet: the newest is the
		// target once there are two.
		if len(all) <= 1 {
			return c.rolls.release(id)
		}
		target := newest(all)
		ro.ns, ro.name = target.Namespace, target.Name
		ro.version = kube.AppliedVersion(target.Annotations)
		if ro.started.IsZero() {
			ro.started = target.CreationTimestamp.Time
		}
		c.rolls.adopted(id, ro.ns, ro.name, ro.version, ro.started)
	}
	var target *appsv1.ReplicaSet
	var others []appsv1.ReplicaSet
	for _, rs := range all {
		if rs.Namespace == ro.ns && rs.Name == ro.name {
			target = rs
		} else {
			others = append(others, *rs)
		}
	}
	if len(others) == 0 {
		if target != nil {
			c.log.Info("roll finished", "deployment", id, "replicaset", ro.ns+"/"+ro.name)
		}
		return c.rolls.release(id)
	}
	if target == nil || target.DeletionTimestamp != nil || !available(target) {
		if !c.rolls.expired(ro.started) {
			return nil // the next ReplicaSet event or the deadline timer looks again
		}
		cfg, _ := c.state()
		f := rollFailure{ns: ro.ns, name: ro.name, version: ro.version}
		f.err = c.rollFailed(k, id, ro, target, others, cfg.rollDeadline)
		c.log.Warn("roll missed its progress deadline; its slot goes to the next deployment, the old ReplicaSets stay", "deployment", id, "replicaset", ro.ns+"/"+ro.name, "error", f.err)
		return c.rolls.fail(id, f)
	}
	if !slices.ContainsFunc(others, func(rs appsv1.ReplicaSet) bool { return rs.DeletionTimestamp == nil }) {
		return nil // deleting: the slot frees when they are gone
	}
	if err := c.finishRoll(ctx, k, id, target, others); err != nil {
		// The next event or Apply of this deployment tries again.
		c.log.Warn("finishing a roll failed", "deployment", id, "replicaset", ro.ns+"/"+ro.name, "error", err)
	}
	return nil
}

// rollFailed is the permanent error of a roll that missed its deadline:
// the deployment, the ReplicaSet, what of it was not ready and why (its
// pods' reasons), what still serves, and what to do.
func (c *Controller) rollFailed(k *kubeState, id string, ro roll, target *appsv1.ReplicaSet, others []appsv1.ReplicaSet, deadline time.Duration) error {
	var b strings.Builder
	fmt.Fprintf(&b, "deployment %s: the roll to ReplicaSet %s/%s (version %d) did not become available within roll_progress_deadline %s", id, ro.ns, ro.name, ro.version, deadline)
	switch {
	case target == nil:
		b.WriteString(": the ReplicaSet does not exist")
	case target.DeletionTimestamp != nil:
		b.WriteString(": the ReplicaSet is being deleted")
	default:
		want := int32(1)
		if target.Spec.Replicas != nil {
			want = *target.Spec.Replicas
		}
		fmt.Fprintf(&b, ": %d of %d replicas available", target.Status.AvailableReplicas, want)
		pods, _ := ofDeployment[*corev1.Pod](k.podIndex, id)
		var why []string
		for _, p := range pods {
			if !ownedBy(p, target) {
				continue
			}
			st, reason, msg := podState(p)
			if st == clusterv1.Instance_STATUS_RUNNING {
				continue
			}
			s := "pod " + p.Name + " " + reason
			if msg != "" {
				s += ": " + msg
			}
			why = append(why, s)
		}
		slices.Sort(why)
		if len(why) > maxListedPods {
			why = append(why[:maxListedPods], fmt.Sprintf("%d more", len(why)-maxListedPods))
		}
		if len(why) > 0 {
			b.WriteString(" (" + strings.Join(why, "; ") + ")")
		}
	}
	var old []string
	for _, rs := range others {
		if rs.DeletionTimestamp == nil {
			old = append(old, rs.Namespace+"/"+rs.Name)
		}
	}
	if len(old) > 0 {
		fmt.Fprintf(&b, "; it keeps serving from ReplicaSet %s", strings.Join(old, ", "))
	}
	b.WriteString("; the roll gave up its slot. Fix the deployment (image, command, probes, resources) and deploy a newer version, or raise roll_progress_deadline if its pods need longer to start")
	return sdk.Permanent(errors.New(b.String()))
}

// ownedBy reports whether p belongs to rs.
func ownedBy(p *corev1.Pod, rs *appsv1.ReplicaSet) bool {
	for _, o := range p.OwnerReferences {
		if o.UID == rs.UID {
			return true
		}
	}
	return false
}

// maxListedPods bounds how many pods a roll failure names.
const maxListedPods = 3

// finishRoll deletes the ReplicaSets a roll replaced, then the Secrets only
// they used and the namespaces they leave empty.
func (c *Controller) finishRoll(ctx context.Context, k *kubeState, id string, target *appsv1.ReplicaSet, others []appsv1.ReplicaSet) error {
	c.log.Info("new ReplicaSet available, deleting the old ones", "deployment", id, "replicaset", target.Namespace+"/"+target.Name, "old", len(others))
	moved, err := c.deleteReplicaSets(ctx, k, id, others)
	if err != nil {
		return err
	}
	delete(moved, target.Namespace)
	if err := c.deleteStaleSecrets(ctx, k, id, secretOf(target)); err != nil {
		return err
	}
	return c.removeNamespacesIfUnused(ctx, k, id, moved)
}

// secretOf names the environment Secret target's pods read, nil for none.
func secretOf(rs *appsv1.ReplicaSet) *secretPlan {
	for _, c := range rs.Spec.Template.Spec.Containers {
		for _, from := range c.EnvFrom {
			if from.SecretRef != nil {
				return &secretPlan{namespace: rs.Namespace, name: from.SecretRef.Name}
			}
		}
	}
	return nil
}

// startAdmitted applies the changes that just got a slot, each in its own
// goroutine, under the deployment's lock like any Apply. A failure is
// logged; the host's next resync applies the deployment again.
func (c *Controller) startAdmitted(ctx context.Context, next []admitted) {
	for _, a := range next {
		go func() {
			unlock := c.idLocks.lock(a.id)
			res, err := c.apply(ctx, a.ch)
			unlock()
			if err != nil {
				c.log.Warn("a waiting roll failed to start; the next resync retries it", "deployment", a.id, "version", a.ch.Version, "error", err)
				c.rolls.poke(a.id)
				return
			}
			c.log.Debug("waiting roll started", "deployment", a.id, "version", a.ch.Version, "result", res)
		}()
	}
}

// adoptRolls gives a slot to every deployment the cache shows mid-roll (two
// ReplicaSets or more), so a restarted plugin counts them against the bound
// and finishes them.
func (c *Controller) adoptRolls(k *kubeState) {
	count := map[string]int{}
	for _, obj := range k.replicaSetIndex.List() {
		if rs, ok := obj.(*appsv1.ReplicaSet); ok {
			if id := rs.Labels[LabelDeployment]; id != "" {
				count[id]++
			}
		}
	}
	for id, n := range count {
		if n > 1 {
			c.rolls.adopt(id)
			c.rolls.poke(id)
		}
	}
}

// available: the ReplicaSet controller has seen the current spec and every
// desired replica has been ready for minReadySeconds.
func available(rs *appsv1.ReplicaSet) bool {
	want := int32(1)
	if rs.Spec.Replicas != nil {
		want = *rs.Spec.Replicas
	}
	return rs.Status.ObservedGeneration >= rs.Generation && rs.Status.AvailableReplicas >= want
}

// newest is the ReplicaSet created last (ties: the newer applied version).
func newest(rss []*appsv1.ReplicaSet) *appsv1.ReplicaSet {
	return slices.MaxFunc(rss, func(a, b *appsv1.ReplicaSet) int {
		if c := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); c != 0 {
			return c
		}
		return cmp.Compare(kube.AppliedVersion(a.Annotations), kube.AppliedVersion(b.Annotations))
	})
}

// defaultMaxConcurrentRolls is max_concurrent_rolls when unset.
const defaultMaxConcurrentRolls = 10

// defaultRollProgressDeadline is roll_progress_deadline when unset, as
// Kubernetes' progressDeadlineSeconds.
const defaultRollProgressDeadline = 10 * time.Minute
