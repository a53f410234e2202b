package controller

// Registry pull secrets. The pods of a deployment name the configured pull
// Secrets (image_pull_secret, image_pull_secrets), and a pod can only use a
// Secret of its own namespace; workload namespaces are created on demand.
// So the plugin copies each configured Secret from pull_secret_namespace
// into every namespace it runs workloads in, keeps the copies equal to
// their source, and removes them when they are no longer wanted. The
// copies are registry credentials: they go only where ctrl put a workload,
// and the plugin touches no Secret it did not make.
//
//   - Which namespaces: those of the deployments the plugin holds from
//     ctrl (pulltargets.go: desiredNamespaces), never a reserved one
//     (default, kube-*, krane's own, pull_secret_namespace,
//     sentinel_namespace; validate refuses deployments there, naming
//     k8s_namespace). ReplicaSets decide nothing: anyone who may create one
//     can give it Krane's labels. A new deployment gets its copies in the
//     Apply that creates it, before the ReplicaSet, so no pod waits.
//   - What a copy is: the source's type and data under the same name, with
//     Krane's managed-by and component labels, PullSecretLabel,
//     CopiedFromAnnotation and CopyProofAnnotation: an HMAC of the copy's
//     namespace, name and UID under a key kept in pull_secret_namespace
//     (CopyKeySecret), beside the sources, so it is exactly as secret as
//     the credentials. A copy is created, then given its proof (the UID
//     exists only then); should the plugin die in between, that copy is
//     unproven and treated as below (delete it to have it made again). The
//     Secret informer the plugin keeps for secret environments selects
//     these labels, so copies are compared from the cache: an Apply whose
//     copies are current makes no API call.
//   - A lookalike (a Secret of a configured name without a valid proof,
//     whatever its labels) is someone else's: it is left exactly as it is,
//     never patched, never deleted; the pods use it, and the plugin logs it
//     and counts it (PullLookalikes). Copies made by releases before the
//     proof carry none and are such lookalikes too (a forged one cannot be
//     told apart): after the upgrade an operator deletes them once
//     (kubectl delete secret -A -l krane.dev/pull-secret=true) and the
//     plugin makes proven ones. Updates carry the copy's
//     resourceVersion, so a copy replaced by a lookalike between the check
//     and the write is not written either.
//   - When: at each Apply (from the cache), when a source changes (one
//     informer per configured name, selected by field, so no other Secret
//     of the source namespace is ever read), when a copy is edited or
//     deleted by hand, when a deployment goes, and at every Configure (a
//     config that drops a name removes its copies).
//   - Removal: a proven copy whose name is no longer configured, whose
//     source is gone, or whose namespace no held deployment runs in. Until
//     the host has asked for the inventory (after a complete bootstrap),
//     a namespace still holding a ReplicaSet of the plugin keeps its
//     copies: after a restart the plugin does not yet hold every
//     deployment, and a copy it made earlier is not taken from running
//     pods; afterwards, only a ReplicaSet of a held deployment (a roll to
//     another namespace) keeps them. The namespace is locked exclusively
//     and its ReplicaSets listed live first, so a copy is never removed
//     under an Apply that is creating the namespace's first ReplicaSet.

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"krane.dev/sdk/kube"
)

// PullSecretLabel marks a Secret as the plugin's copy of a configured pull
// Secret.
const PullSecretLabel = "krane.dev/pull-secret"

// CopiedFromAnnotation on a copy names its source, "namespace/name".
const CopiedFromAnnotation = "krane.dev/copied-from"

// pullSecretNames are the configured pull Secrets, sorted, each once.
func (c Config) pullSecretNames() []string {
	set := map[string]bool{}
	if c.ImagePullSecret != "" {
		set[c.ImagePullSecret] = true
	}
	for _, name := range c.ImagePullSecrets {
		set[name] = true
	}
	return slices.Sorted(maps.Keys(set))
}

// pullSelector selects the plugin's copies.
var pullSelector = labels.SelectorFromSet(labels.Set{kube.ManagedByLabel: kube.ManagedBy, kube.ComponentLabel: Component, PullSecretLabel: "true"})

func isPullCopy(s *corev1.Secret) bool {
	return s.Labels[PullSecretLabel] == "true" && s.Labels[kube.ManagedByLabel] == kube.ManagedBy && s.Labels[kube.ComponentLabel] == Component
}

// buildPullCopy is the copy of source in namespace ns.
func buildPullCopy(source *corev1.Secret, ns string) *corev1.Secret {
	return &corev1.Secret{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"},
		ObjectMeta: metav1.ObjectMeta{
			Name: source.Name, Namespace: ns,
			Labels:      map[string]string{kube.ManagedByLabel: kube.ManagedBy, kube.ComponentLabel: Component, PullSecretLabel: "true"},
			Annotations: map[string]string{CopiedFromAnnotation: source.Namespace + "/" + source.Name},
		},
		Type: source.Type,
		Data: source.Data,
	}
}

func pullCopyCurrent(key []byte, live, desired *corev1.Secret) bool {
	return live.DeletionTimestamp == nil && provenCopy(key, live) && live.Type == desired.Type &&
		live.Annotations[CopiedFromAnnotation] == desired.Annotations[CopiedFromAnnotation] &&
		equalData(live.Data, desired.Data)
}

// pullSources returns the configured sources that exist, by name.
func (k *kubeState) pullSources(cfg Config) map[string]*corev1.Secret {
	out := map[string]*corev1.Secret{}
	for name, store := range k.pullSourceStores {
		obj, ok, err := store.GetByKey(cfg.PullSecretNamespace + "/" + name)
		if err != nil || !ok {
			continue
		}
		if s, ok := obj.(*corev1.Secret); ok && s.DeletionTimestamp == nil {
			out[name] = s
		}
	}
	return out
}

// copiesWanted: whether ns gets copies under cfg: a held deployment runs
// there and it is not reserved.
func (c *Controller) copiesWanted(cfg Config, ns string) bool {
	return cfg.PullSecretNamespace != "" && reservedNamespace(cfg, ns) == "" && c.desired.has(ns)
}

// pullSecretsCurrent reports, from the caches alone, whether ns holds a
// current copy of every existing source (someone else's Secret of that
// name counts as current).
func (c *Controller) pullSecretsCurrent(cfg Config, k *kubeState, ns string) bool {
	if !c.copiesWanted(cfg, ns) {
		return true
	}
	for name, src := range k.pullSources(cfg) {
		if c.pulls.isForeign(ns, name) {
			continue
		}
		live, err := k.secrets.Secrets(ns).Get(name)
		if err != nil || !pullCopyCurrent(k.copyKey, live, buildPullCopy(src, ns)) {
			return false
		}
	}
	return true
}

// ensurePullSecrets writes the copies ns lacks or that differ from their
// source and says whether it wrote. Call with ns locked (shared is enough:
// it only adds and updates).
func (c *Controller) ensurePullSecrets(ctx context.Context, cfg Config, k *kubeState, ns string) (bool, error) {
	if !c.copiesWanted(cfg, ns) || len(k.copyKey) == 0 {
		return false, nil
	}
	sources := k.pullSources(cfg)
	wrote := false
	for _, name := range slices.Sorted(maps.Keys(sources)) {
		w, err := c.ensurePullCopy(ctx, k, ns, sources[name])
		if err != nil {
			return wrote, err
		}
		wrote = wrote || w
	}
	return wrote, nil
}

func (c *Controller) ensurePullCopy(ctx context.Context, k *kubeState, ns string, src *corev1.Secret) (bool, error) {
	if c.pulls.isForeign(ns, src.Name) {
		return false, nil
	}
	desired := buildPullCopy(src, ns)
	secrets := kube.Typed[corev1.Secret, corev1.SecretList](k.clients, "secrets", ns)
	live, err := k.secrets.Secrets(ns).Get(src.Name)
	if err == nil && !provenCopy(k.copyKey, live) && !c.pulls.isPending(live.UID) {
		c.lookalike(ns, src.Name, "it carries the copy's labels without the plugin's proof")
		return false, nil
	}
	var meta metav1.Object
	switch {
	case err == nil && pullCopyCurrent(k.copyKey, live, desired):
		return false, nil
	case err == nil && live.DeletionTimestamp != nil:
		return false, fmt.Errorf("pull Secret %s/%s is being deleted; it is copied again once it is gone (retrying)", ns, src.Name)
	case err == nil && live.Type != desired.Type:
		// A Secret's type cannot change: replace the copy.
		if err := secrets.Delete(ctx, live.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &live.UID, ResourceVersion: &live.ResourceVersion}}); err != nil && !apierrors.IsNotFound(err) {
			return false, fmt.Errorf("replace pull Secret %s/%s (its source changed type): %w", ns, src.Name, err)
		}
		err = apierrors.NewNotFound(secretsGVR.GroupResource(), live.Name)
		fallthrough
	case apierrors.IsNotFound(err):
		created, err := secrets.Create(ctx, desired, metav1.CreateOptions{FieldManager: kube.FieldManager})
		if err == nil {
			c.log.Info("pull Secret copied", "secret", ns+"/"+src.Name, "from", src.Namespace+"/"+src.Name)
			// The proof names the UID, which exists only now.
			c.pulls.setPending(created.UID)
			meta = created
			break
		}
		if !apierrors.IsAlreadyExists(err) {
			return false, pullError(ns, src.Name, err)
		}
		// Not in the cache, yet there: the cache has not seen our own
		// copy yet, or the Secret is someone else's. Look (as metadata).
		m, err := c.pullCopyLive(ctx, k, ns, src.Name)
		if err != nil {
			return false, err
		}
		if m == nil {
			return false, fmt.Errorf("pull Secret %s/%s was there a moment ago and is gone (retrying)", ns, src.Name)
		}
		if !provenCopy(k.copyKey, m) && !c.pulls.isPending(m.UID) {
			c.lookalike(ns, src.Name, "a Secret of that name exists and is not the plugin's copy")
			return false, nil
		}
		meta = m
	case err != nil:
		return false, fmt.Errorf("read pull Secret %s/%s from the cache: %w", ns, src.Name, err)
	default:
		meta = live
	}
	return true, c.patchPullCopy(ctx, k, meta, desired, src)
}

// patchPullCopy sets the copy's data, labels and proof. The patch carries
// the object's UID and resourceVersion: when the Secret changed since it
// was checked (replaced by someone else's, say), the API server refuses
// the write and the next sync looks again.
func (c *Controller) patchPullCopy(ctx context.Context, k *kubeState, live metav1.Object, desired *corev1.Secret, src *corev1.Secret) error {
	ns, name := live.GetNamespace(), live.GetName()
	annotations := maps.Clone(desired.Annotations)
	annotations[CopyProofAnnotation] = copyProof(k.copyKey, ns, name, live.GetUID())
	data := map[string]any{}
	if s, ok := live.(*corev1.Secret); ok {
		for key := range s.Data {
			data[key] = nil
		}
	}
	for key, v := range desired.Data {
		data[key] = v
	}
	patch, err := json.Marshal(map[string]any{
		"metadata": map[string]any{"uid": live.GetUID(), "resourceVersion": live.GetResourceVersion(), "labels": desired.Labels, "annotations": annotations},
		"data":     data,
	})
	if err != nil {
		return fmt.Errorf("pull Secret %s/%s: encode patch: %w", ns, name, err)
	}
	secrets := kube.Typed[corev1.Secret, corev1.SecretList](k.clients, "secrets", ns)
	_, err = secrets.Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: kube.FieldManager})
	if err != nil {
		return pullError(ns, name, err)
	}
	c.pulls.clearPending(live.GetUID())
	c.log.Info("pull Secret copy written from its source", "secret", ns+"/"+name, "from", src.Namespace+"/"+src.Name)
	return nil
}

// lookalike reports a Secret that looks like a copy and is not the
// plugin's: it is left as it is.
func (c *Controller) lookalike(ns, name, why string) {
	if c.pulls.setForeign(ns, name) {
		c.pullLookalikes.Add(1)
		c.log.Warn("pull Secret left alone: not the plugin's copy, so neither written nor deleted; the namespace's pods pull with it. If the plugin should manage it, delete it",
			"secret", ns+"/"+name, "why", why)
	}
}

// PullLookalikes counts the Secrets found named and labelled like a pull
// Secret copy without being the plugin's (each counted once per sync
// round).
func (c *Controller) PullLookalikes() int64 { return c.pullLookalikes.Load() }

// pullCopyLive reads the Secret ns/name as the API server has it (a
// metadata list by name: the role grants list, not get, on Secrets); nil
// when it does not exist.
func (c *Controller) pullCopyLive(ctx context.Context, k *kubeState, ns, name string) (*metav1.PartialObjectMetadata, error) {
	list, err := k.metadata.Resource(secretsGVR).Namespace(ns).List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String()})
	if err != nil {
		return nil, fmt.Errorf("read Secret %s/%s: %w", ns, name, err)
	}
	for i := range list.Items {
		return &list.Items[i], nil
	}
	return nil, nil
}

func pullError(ns, name string, err error) error {
	if apierrors.IsForbidden(err) {
		return fmt.Errorf("write pull Secret %s/%s: %w (does the plugin's identity have the ClusterRole from rbac.yaml?)", ns, name, err)
	}
	return fmt.Errorf("write pull Secret %s/%s: %w", ns, name, err)
}

// syncPullNamespace brings ns's copies to what they should be: every
// existing source when a held deployment runs there, none otherwise. Only
// proven copies are ever written or removed.
func (c *Controller) syncPullNamespace(ctx context.Context, ns string) error {
	cfg, k := c.state()
	if k == nil {
		return nil
	}
	unlock := c.nsLocks.lock(ns)
	defer unlock()
	listed, err := k.secrets.Secrets(ns).List(pullSelector)
	if err != nil {
		return err
	}
	var copies []*corev1.Secret
	for _, s := range listed {
		if provenCopy(k.copyKey, s) || c.pulls.isPending(s.UID) {
			copies = append(copies, s)
		} else if s.DeletionTimestamp == nil {
			c.lookalike(ns, s.Name, "it carries the copy's labels without the plugin's proof")
		}
	}
	keep := map[string]bool{}
	if c.copiesWanted(cfg, ns) {
		if _, err := c.ensurePullSecrets(ctx, cfg, k, ns); err != nil {
			if apierrors.IsNotFound(err) || apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause) {
				return nil // the namespace is going away
			}
			return err
		}
		for name := range k.pullSources(cfg) {
			keep[name] = true
		}
	} else if len(copies) > 0 {
		// No held deployment runs here; a workload that may still need the
		// copies keeps them (see the package doc: Removal).
		used, err := c.runsWorkloads(ctx, k, ns)
		if err != nil {
			return err
		}
		if used {
			for name := range k.pullSources(cfg) {
				keep[name] = true
			}
		}
	}
	for _, s := range copies {
		if keep[s.Name] || s.DeletionTimestamp != nil {
			continue
		}
		err := kube.Typed[corev1.Secret, corev1.SecretList](k.clients, "secrets", ns).Delete(ctx, s.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &s.UID}})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return fmt.Errorf("delete pull Secret %s/%s: %w", ns, s.Name, err)
		}
		c.log.Info("pull Secret removed: no longer configured, its source is gone, or no deployment runs in the namespace", "secret", ns+"/"+s.Name)
	}
	return nil
}

// runsWorkloads says whether ns holds a ReplicaSet, not being deleted,
// that keeps copies the plugin made there: before the plugin holds a
// complete desired state, any ReplicaSet of the plugin; afterwards, only
// one of a held deployment (an older ReplicaSet of a roll to another
// namespace). Listed live: one written a moment ago may not be in the
// cache yet.
func (c *Controller) runsWorkloads(ctx context.Context, k *kubeState, ns string) (bool, error) {
	list, err := k.metadata.Resource(appsv1.SchemeGroupVersion.WithResource("replicasets")).Namespace(ns).List(ctx, metav1.ListOptions{LabelSelector: kube.ManagedSelector(Component)})
	if err != nil {
		return false, fmt.Errorf("list ReplicaSets of namespace %s: %w", ns, err)
	}
	complete := c.desired.isComplete()
	return slices.ContainsFunc(list.Items, func(m metav1.PartialObjectMetadata) bool {
		return m.DeletionTimestamp == nil && (!complete || c.desired.holds(m.Labels[LabelDeployment]))
	}), nil
}

// syncAllPullSecrets syncs every namespace a held deployment runs in or
// that holds a copy, and says which configured sources are missing.
func (c *Controller) syncAllPullSecrets(ctx context.Context) error {
	cfg, k := c.state()
	if k == nil {
		return nil
	}
	c.pulls.clearForeign()
	sources := k.pullSources(cfg)
	for _, name := range cfg.pullSecretNames() {
		if _, ok := sources[name]; !ok && cfg.PullSecretNamespace != "" {
			c.log.Warn("a configured pull Secret does not exist: pods of workspace namespaces pull without it until it is created", "secret", cfg.PullSecretNamespace+"/"+name)
		}
	}
	namespaces := map[string]bool{}
	for _, ns := range c.desired.all() {
		namespaces[ns] = true
	}
	copies, err := k.secrets.List(pullSelector)
	if err != nil {
		return err
	}
	for _, s := range copies {
		namespaces[s.Namespace] = true
	}
	var first error
	for _, ns := range slices.Sorted(maps.Keys(namespaces)) {
		if err := c.syncPullNamespace(ctx, ns); err != nil {
			c.pulls.mark(ns)
			if first == nil {
				first = err
			}
		}
	}
	return first
}

// pullQueue holds what is to sync: every namespace, or some. Marks made
// while a sync runs are kept for the next round.
type pullQueue struct {
	mu      sync.Mutex
	all     bool
	ns      map[string]bool
	foreign map[string]bool // "ns/name" of Secrets someone else made
	// pending are copies this process created and has not yet given
	// their proof (the UID exists only after the create).
	pending map[types.UID]bool
	wake    chan struct{}
}

func newPullQueue() *pullQueue { return &pullQueue{wake: make(chan struct{}, 1)} }

func (q *pullQueue) signal() {
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

func (q *pullQueue) markAll() {
	q.mu.Lock()
	q.all = true
	q.mu.Unlock()
	q.signal()
}

func (q *pullQueue) mark(ns string) {
	q.mu.Lock()
	if q.ns == nil {
		q.ns = map[string]bool{}
	}
	q.ns[ns] = true
	q.mu.Unlock()
	q.signal()
}

func (q *pullQueue) take() (bool, []string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	all, ns := q.all, slices.Sorted(maps.Keys(q.ns))
	q.all, q.ns = false, nil
	return all, ns
}

func (q *pullQueue) isForeign(ns, name string) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.foreign[ns+"/"+name]
}

// setForeign records ns/name as someone else's and says whether that is
// news.
func (q *pullQueue) setForeign(ns, name string) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.foreign == nil {
		q.foreign = map[string]bool{}
	}
	if q.foreign[ns+"/"+name] {
		return false
	}
	q.foreign[ns+"/"+name] = true
	return true
}

func (q *pullQueue) isPending(uid types.UID) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.pending[uid]
}

func (q *pullQueue) setPending(uid types.UID) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.pending == nil {
		q.pending = map[types.UID]bool{}
	}
	q.pending[uid] = true
}

func (q *pullQueue) clearPending(uid types.UID) {
	q.mu.Lock()
	defer q.mu.Unlock()
	delete(q.pending, uid)
}

func (q *pullQueue) clearForeign() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.foreign = nil
}

// syncPullSecrets runs until ctx ends, syncing what is marked; a failed
// sync is marked again and retried with backoff.
func (c *Controller) syncPullSecrets(ctx context.Context) {
	backoff := time.Duration(0)
	for {
		var retry <-chan time.Time
		var timer *time.Timer
		if backoff > 0 {
			timer = time.NewTimer(backoff)
			retry = timer.C
		}
		select {
		case <-ctx.Done():
		case <-c.pulls.wake:
		case <-retry:
		}
		if timer != nil {
			timer.Stop()
		}
		if ctx.Err() != nil {
			return
		}
		all, namespaces := c.pulls.take()
		var err error
		if all {
			err = c.syncAllPullSecrets(ctx)
		}
		for _, ns := range namespaces {
			if e := c.syncPullNamespace(ctx, ns); e != nil {
				c.pulls.mark(ns)
				err = e
			}
		}
		switch {
		case err != nil && ctx.Err() == nil:
			backoff = min(max(2*backoff, 500*time.Millisecond), 30*time.Second)
			c.log.Warn("syncing pull Secrets failed (retrying)", "error", err, "retry_in", backoff)
		case err == nil:
			backoff = 0
		}
	}
}

// pullSourceEvents: any change of a source syncs every namespace.
func (c *Controller) pullSourceEvents() cache.ResourceEventHandlerFuncs {
	all := func(any) { c.pulls.markAll() }
	return cache.ResourceEventHandlerFuncs{AddFunc: all, UpdateFunc: func(_, obj any) { all(obj) }, DeleteFunc: all}
}

// nsEvents marks the namespace of a changed copy (edited or deleted by
// hand) or of a deleted ReplicaSet (its namespace may need no copies any
// more).
func (c *Controller) nsEvents(onlyCopies bool) cache.ResourceEventHandlerFuncs {
	markNS := func(obj any) {
		if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = tomb.Obj
		}
		if onlyCopies {
			s, ok := obj.(*corev1.Secret)
			if !ok || !isPullCopy(s) {
				return
			}
		}
		if m, err := meta.Accessor(obj); err == nil {
			c.pulls.mark(m.GetNamespace())
		}
	}
	h := cache.ResourceEventHandlerFuncs{DeleteFunc: markNS}
	if onlyCopies {
		h.UpdateFunc = func(_, obj any) { markNS(obj) }
	}
	return h
}
