package controller

import (
	"cmp"
	"context"
	"slices"
	"sync"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/client-go/tools/cache"

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
// Known limit: a new template whose pods never become available keeps its
// slot (and its old pods) until a newer version or a delete arrives.
type roller struct {
	mu      sync.Mutex
	max     int
	active  map[string]*roll      // deployment id -> its roll (holds a slot)
	queue   []string              // ids waiting for a slot, oldest first
	waiting map[string]sdk.Change // the latest change of each waiting id
	wake    chan struct{}         // a pending progress check (buffer of 1)
	dirty   map[string]bool       // ids whose roll needs a look
}

type roll struct {
	// ns/name of the ReplicaSet the deployment rolls to; "" until written
	// (or for a roll found in the cluster at Configure: then the newest).
	ns, name string
}

func newRoller() *roller {
	return &roller{
		max:     defaultMaxConcurrentRolls,
		active:  map[string]*roll{},
		waiting: map[string]sdk.Change{},
		wake:    make(chan struct{}, 1),
		dirty:   map[string]bool{},
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
		r.active[id] = &roll{}
		r.dropWaiting(id)
		return true
	}
	if _, ok := r.waiting[id]; !ok {
		r.queue = append(r.queue, id)
	}
	r.waiting[id] = ch
	return false
}

// setTarget records the ReplicaSet id rolls to.
func (r *roller) setTarget(id, ns, name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if ro, ok := r.active[id]; ok {
		ro.ns, ro.name = ns, name
	}
}

// target returns id's roll, if it holds a slot.
func (r *roller) target(id string) (roll, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ro, ok := r.active[id]
	if !ok {
		return roll{}, false
	}
	return *ro, true
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
	delete(r.active, id)
	r.dropWaiting(id)
	return r.admit()
}

// resize sets the bound; a larger one admits waiting deployments at once.
// Rolls already running beyond a smaller one finish.
func (r *roller) resize(n int) []admitted {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.max = n
	return r.admit()
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
		r.active[id] = &roll{}
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
		return nil
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
