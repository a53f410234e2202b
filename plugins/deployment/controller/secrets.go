package controller

// Secret environments. A deployment's encrypted_env is opened through the
// krane host (which asks ctrl: only this cluster's region, audited) and
// written to a Secret that the pods read with envFrom.
//
// Order of writes, so no pod ever starts without its Secret (the
// reference platform's #5309 race): the Secret first, without an owner
// when its ReplicaSet does not exist yet; then the ReplicaSet; then the
// Secret again with the ReplicaSet as its owner (so it is garbage-collected
// with it). Should the plugin die in between, the next Apply finishes the
// job, and deleting the deployment deletes its Secrets by label anyway.
//
// What keeps ctrl out of resyncs: a Secret this process wrote (or checked)
// is remembered by its resourceVersion, and an unchanged Apply compares
// only metadata and that resourceVersion, from the informer, with no API
// call and no decryption. Opened environments are also kept, briefly
// (secret_cache_ttl), in a bounded cache keyed by a hash of deployment id
// and blob, so the writes of one Apply and a repair soon after ask ctrl
// once. Values never reach logs or errors.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	clusterv1 "krane.dev/proto/krane/cluster/v1"
	"krane.dev/sdk"
	"krane.dev/sdk/kube"
)

// SealedHashAnnotation on a Secret is the SHA-256 of the sealed blob its
// data was opened from (a hash of ciphertext: it reveals nothing).
const SealedHashAnnotation = "krane.dev/sealed-env-sha256"

var secretsGVR = corev1.SchemeGroupVersion.WithResource("secrets")

// secretPlan is the Secret one deployment needs, before its data is known.
type secretPlan struct {
	id        string
	d         *clusterv1.Deployment
	namespace string
	name      string
	blobHash  string   // hex SHA-256 of the blob
	cacheKey  [32]byte // SHA-256 of id, 0, blob
}

func newSecretPlan(id string, d *clusterv1.Deployment) *secretPlan {
	blob := d.GetEncryptedEnv()
	sum := sha256.Sum256(blob)
	h := sha256.New()
	h.Write([]byte(id))
	h.Write([]byte{0})
	h.Write(blob)
	p := &secretPlan{id: id, d: d, namespace: d.GetK8SNamespace(), name: secretName(d), blobHash: hex.EncodeToString(sum[:])}
	copy(p.cacheKey[:], h.Sum(nil))
	return p
}

func (p *secretPlan) key() string { return p.namespace + "/" + p.name }

// buildSecret is the desired Secret; data is nil for the metadata-only form
// the drift check compares.
func buildSecret(p *secretPlan, data map[string][]byte, owner *metav1.OwnerReference) *corev1.Secret {
	s := &corev1.Secret{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"},
		ObjectMeta: metav1.ObjectMeta{
			Name: p.name, Namespace: p.namespace,
			Labels:      podLabels(p.id, p.d),
			Annotations: map[string]string{SealedHashAnnotation: p.blobHash},
		},
		Type: corev1.SecretTypeOpaque,
		// Immutable: nobody can change a value in place, and the kubelet
		// need not watch it.
		Immutable: ptr(true),
		Data:      data,
	}
	if owner != nil {
		s.OwnerReferences = []metav1.OwnerReference{*owner}
	}
	return s
}

// ownerRef makes a ReplicaSet the owner of the Secret.
func ownerRef(name string, uid types.UID) *metav1.OwnerReference {
	return &metav1.OwnerReference{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: name, UID: uid}
}

// secretCurrent reports, from the informer alone, whether the Secret exists
// with the wanted metadata and owner and holds data this process wrote or
// checked for this blob.
func (c *Controller) secretCurrent(k *kubeState, p *secretPlan, owner *metav1.OwnerReference) bool {
	live, err := k.secrets.Secrets(p.namespace).Get(p.name)
	if err != nil || live.DeletionTimestamp != nil || !c.verified.Is(p.key(), p.blobHash, live.ResourceVersion) {
		return false
	}
	return metadataMatches(p, owner, live)
}

func metadataMatches(p *secretPlan, owner *metav1.OwnerReference, live *corev1.Secret) bool {
	desired, err := runtime.DefaultUnstructuredConverter.ToUnstructured(buildSecret(p, nil, owner))
	if err != nil {
		return false
	}
	delete(desired, "data")
	// Drift also sees an extra owner: a list must have the desired length.
	drift, err := kube.DriftObject(desired, live)
	return err == nil && drift == ""
}

// ensureSecret makes the deployment's Secret exist with its opened
// environment, owned by owner when given, and says whether it wrote. It
// writes nothing when the live Secret already matches. Call with the
// namespace locked.
func (c *Controller) ensureSecret(ctx context.Context, k *kubeState, host sdk.Host, p *secretPlan, owner *metav1.OwnerReference) (bool, error) {
	if c.secretCurrent(k, p, owner) {
		return false, nil
	}
	data, err := c.openEnv(ctx, host, p)
	if err != nil {
		return false, err
	}
	defer clearData(data)
	live, err := k.secrets.Secrets(p.namespace).Get(p.name)
	if err == nil && live.DeletionTimestamp == nil && metadataMatches(p, owner, live) && equalData(live.Data, data) {
		// Written before this process started (or before the cache saw its
		// own write): the content is right, so remember it.
		c.verified.Put(p.key(), p.blobHash, live.ResourceVersion)
		return false, nil
	}
	obj, err := kube.ToUnstructured(buildSecret(p, data, owner))
	if err != nil {
		return false, fmt.Errorf("deployment %s: convert Secret %s: %w", p.id, p.key(), err)
	}
	out, err := kube.Apply(ctx, k.dynamic, secretsGVR, obj)
	clearUnstructuredData(obj)
	if err != nil {
		if apierrors.IsInvalid(err) && live != nil && live.Immutable != nil && *live.Immutable {
			return false, sdk.Permanent(fmt.Errorf("deployment %s: Secret %s exists, is immutable and holds other data (made by hand?): delete it and Krane writes it again", p.id, p.key()))
		}
		return false, classify(err, p.id)
	}
	c.verified.Put(p.key(), p.blobHash, out.GetResourceVersion())
	c.log.Info("Secret applied", "deployment", p.id, "secret", p.key(), "variables", len(data), "owner", ownerName(owner))
	return true, nil
}

// openEnv returns the deployment's variables, a copy the caller owns (and
// zeroes): from the cache, or opened through the host (ctrl). A failure is
// retryable and blocks only this deployment.
func (c *Controller) openEnv(ctx context.Context, host sdk.Host, p *secretPlan) (map[string][]byte, error) {
	if data, ok := c.envCache.get(p.cacheKey); ok {
		return data, nil
	}
	if host == nil {
		return nil, fmt.Errorf("deployment %s: no krane host services to open its secret environment with (retrying)", p.id)
	}
	c.stats.decrypts.Add(1)
	env, err := host.DecryptEnv(ctx, p.id, p.d.GetEncryptedEnv())
	if err != nil {
		return nil, fmt.Errorf("deployment %s: cannot open its secret environment (retrying): %w", p.id, err)
	}
	cfg, _ := c.state()
	data := make(map[string][]byte, len(env))
	for _, name := range slices.Sorted(maps.Keys(env)) {
		if !cIdentifier.MatchString(name) {
			clearData(data)
			return nil, sdk.InvalidField("encrypted_env", "secret variable %q is not a variable name", name)
		}
		if slices.Contains(cfg.EnvVarNames.list(), name) {
			clearData(data)
			return nil, sdk.InvalidField("encrypted_env", "secret variable %s is set by Krane itself", name)
		}
		data[name] = []byte(env[name])
	}
	c.envCache.put(p.cacheKey, data)
	c.log.Debug("secret environment opened through the host", "deployment", p.id, "variables", len(data))
	return data, nil
}

// deleteStaleSecrets deletes the deployment's Secrets other than keep's
// (a former namespace or blob), as far as the cache knows them: a Secret
// this write did not make was made long enough ago to be in it.
func (c *Controller) deleteStaleSecrets(ctx context.Context, k *kubeState, id string, keep *secretPlan) error {
	cached, err := ofDeployment[*corev1.Secret](k.secretIndex, id)
	if err != nil {
		return err
	}
	var stale []metav1.ObjectMeta
	for _, s := range cached {
		if keep == nil || s.Namespace != keep.namespace || s.Name != keep.name {
			stale = append(stale, s.ObjectMeta)
		}
	}
	return c.deleteSecretObjects(ctx, k, id, stale)
}

// deleteSecrets deletes every Secret of the deployment, listed live (as
// metadata: no data crosses the wire) so one written a moment ago is not
// missed.
func (c *Controller) deleteSecrets(ctx context.Context, k *kubeState, id string) error {
	list, err := k.metadata.Resource(secretsGVR).Namespace("").List(ctx, metav1.ListOptions{LabelSelector: byDeployment(id).String()})
	if err != nil {
		return fmt.Errorf("deployment %s: list its Secrets: %w", id, err)
	}
	metas := make([]metav1.ObjectMeta, len(list.Items))
	for i, s := range list.Items {
		metas[i] = s.ObjectMeta
	}
	return c.deleteSecretObjects(ctx, k, id, metas)
}

func (c *Controller) deleteSecretObjects(ctx context.Context, k *kubeState, id string, secrets []metav1.ObjectMeta) error {
	for _, s := range secrets {
		if s.DeletionTimestamp != nil {
			continue
		}
		err := kube.Typed[corev1.Secret, corev1.SecretList](k.clients, "secrets", s.Namespace).Delete(ctx, s.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &s.UID}})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return classify(fmt.Errorf("delete Secret %s/%s: %w", s.Namespace, s.Name, err), id)
		}
		c.verified.Forget(s.Namespace + "/" + s.Name)
		c.log.Info("Secret deleted", "deployment", id, "secret", s.Namespace+"/"+s.Name)
	}
	return nil
}

func ownerName(o *metav1.OwnerReference) string {
	if o == nil {
		return ""
	}
	return o.Name
}

func equalData(a, b map[string][]byte) bool {
	return maps.EqualFunc(a, b, func(x, y []byte) bool { return string(x) == string(y) })
}

func cloneData(m map[string][]byte) map[string][]byte {
	out := make(map[string][]byte, len(m))
	for k, v := range m {
		out[k] = slices.Clone(v)
	}
	return out
}

func clearData(m map[string][]byte) {
	for _, v := range m {
		clear(v)
	}
}

// clearUnstructuredData drops the base64 copies of the values from an
// applied object (strings: they cannot be zeroed, only released).
func clearUnstructuredData(obj *unstructured.Unstructured) {
	unstructured.RemoveNestedField(obj.Object, "data")
}

// envCache keeps opened environments for a short time. Bounded by total
// bytes; expired and evicted values are zeroed.
type envCache struct {
	mu       sync.Mutex
	ttl      time.Duration
	maxBytes int
	bytes    int
	entries  map[[32]byte]*envEntry
	timer    *time.Timer
	now      func() time.Time

	hits, misses atomic.Int64
}

type envEntry struct {
	data    map[string][]byte
	size    int
	expires time.Time
}

// defaultCacheBytes bounds the plaintext the cache holds.
const defaultCacheBytes = 32 << 20

func (e *envCache) setTTL(ttl time.Duration) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.ttl = ttl
}

// get returns a copy of a live entry: the cache zeroes its own buffers when
// they expire, whoever else still holds them.
func (e *envCache) get(key [32]byte) (map[string][]byte, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	en, ok := e.entries[key]
	if ok && e.clock().Before(en.expires) {
		e.hits.Add(1)
		return cloneData(en.data), true
	}
	if ok {
		e.drop(key, en)
	}
	e.misses.Add(1)
	return nil, false
}

func (e *envCache) put(key [32]byte, data map[string][]byte) {
	size := 0
	for k, v := range data {
		size += len(k) + len(v)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.entries == nil {
		e.entries = map[[32]byte]*envEntry{}
	}
	if old, ok := e.entries[key]; ok {
		e.drop(key, old)
	}
	limit := e.maxBytes
	if limit <= 0 {
		limit = defaultCacheBytes
	}
	if size > limit {
		return // used once by the caller, never kept
	}
	e.sweep()
	for e.bytes+size > limit {
		// Evict whatever expires first.
		var victim [32]byte
		var first *envEntry
		for k, en := range e.entries {
			if first == nil || en.expires.Before(first.expires) {
				victim, first = k, en
			}
		}
		e.drop(victim, first)
	}
	ttl := e.ttl
	if ttl <= 0 {
		ttl = 5 * time.Minute
	}
	e.entries[key] = &envEntry{data: cloneData(data), size: size, expires: e.clock().Add(ttl)}
	e.bytes += size
	if e.timer == nil {
		// Expired values leave memory even when nothing asks for them.
		e.timer = time.AfterFunc(ttl, e.expire)
	}
}

// drop removes an entry and zeroes its values; the caller holds mu.
func (e *envCache) drop(key [32]byte, en *envEntry) {
	delete(e.entries, key)
	e.bytes -= en.size
	clearData(en.data)
}

func (e *envCache) sweep() {
	now := e.clock()
	for k, en := range e.entries {
		if !now.Before(en.expires) {
			e.drop(k, en)
		}
	}
}

func (e *envCache) expire() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.sweep()
	e.timer = nil
	if len(e.entries) > 0 {
		next := e.ttl
		for _, en := range e.entries {
			next = min(next, time.Until(en.expires))
		}
		e.timer = time.AfterFunc(max(next, 10*time.Millisecond), e.expire)
	}
}

func (e *envCache) len() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.entries)
}

func (e *envCache) clock() time.Time {
	if e.now != nil {
		return e.now()
	}
	return time.Now()
}

// SecretStats count how the plugin got secret environments.
type SecretStats struct {
	// Decrypts are DecryptEnv calls to the host (each one a call to ctrl).
	Decrypts int64
	// CacheHits and CacheMisses count lookups in the opened-environment
	// cache (only Applies that must write or check a Secret look).
	CacheHits, CacheMisses int64
	// Cached is the number of environments in memory now.
	Cached int
}

type secretCounters struct {
	decrypts atomic.Int64
}

// SecretStats reports the counters since the controller was created.
func (c *Controller) SecretStats() SecretStats {
	return SecretStats{Decrypts: c.stats.decrypts.Load(), CacheHits: c.envCache.hits.Load(), CacheMisses: c.envCache.misses.Load(), Cached: c.envCache.len()}
}
