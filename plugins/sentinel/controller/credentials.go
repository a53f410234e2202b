package controller

// Credentials. A sentinel's encrypted_credentials (database, ClickHouse,
// Redis, ...; sealed by ctrl for the sentinel's id) are opened through the
// krane host, which asks ctrl (only a cluster of the sentinel's region,
// audited), and written to the Secret <k8s_name>-credentials, the last
// envFrom of the sentinel container: its keys win over those of the
// config's env_from_secrets.
//
// Order of writes, so no pod starts with credentials older than its
// template: the Secret first (owned by the Deployment when it exists), then
// the Deployment, whose pod template carries the SHA-256 of the sealed blob
// (ciphertext: it reveals nothing) so a change of credentials rolls the
// pods; then, for a new sentinel, the Secret again with the Deployment as
// its owner. Should the plugin die in between, the next Apply finishes the
// job, and deleting the sentinel deletes the Secret by label anyway.
//
// What keeps ctrl out of resyncs: a metadata informer caches the Secret's
// metadata only (its data never reaches the cache), and a Secret this process wrote is
// remembered with its resourceVersion and blob hash; an unchanged Apply
// compares those, with no API call and no decryption. After a restart the
// first Apply of each sentinel opens its credentials once more and applies
// them (an unchanged apply does not change the Secret). Values never reach
// logs or errors.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"regexp"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	clusterv1 "krane.dev/proto/krane/cluster/v1"
	"krane.dev/sdk"
	"krane.dev/sdk/kube"
)

// CredentialsHashAnnotation, on the credentials Secret and on the pod
// template, is the hex SHA-256 of the sealed credentials the Secret's data
// was opened from.
const CredentialsHashAnnotation = "krane.dev/sealed-credentials-sha256"

// credentialsSuffix names a sentinel's credentials Secret after its
// Deployment.
const credentialsSuffix = "-credentials"

var secretsGVR = corev1.SchemeGroupVersion.WithResource("secrets")

// envName is what a credential's name must look like: a variable name.
var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

func credentialsName(k8sName string) string { return k8sName + credentialsSuffix }

// credentialsHash is the hex SHA-256 of a sentinel's sealed credentials, ""
// when it has none.
func credentialsHash(s *clusterv1.Sentinel) string {
	blob := s.GetEncryptedCredentials()
	if len(blob) == 0 {
		return ""
	}
	sum := sha256.Sum256(blob)
	return hex.EncodeToString(sum[:])
}

// buildCredentialsSecret is the desired Secret; data is nil for the
// metadata-only form the cache is compared with.
func buildCredentialsSecret(s *clusterv1.Sentinel, p params, owner *metav1.OwnerReference, data map[string][]byte) *corev1.Secret {
	// Labels as every object of the sentinel, but not the version
	// annotations: a new version that keeps the credentials must not
	// rewrite (and so open) them.
	meta := metav1.ObjectMeta{
		Name: credentialsName(s.GetK8SName()), Namespace: p.Namespace, Labels: identityOf(s, 0).labels(),
		Annotations: map[string]string{CredentialsHashAnnotation: credentialsHash(s)},
	}
	if owner != nil {
		meta.OwnerReferences = []metav1.OwnerReference{*owner}
	}
	return &corev1.Secret{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"},
		ObjectMeta: meta,
		Type:       corev1.SecretTypeOpaque,
		Data:       data,
	}
}

// credentialsWriter writes one sentinel's credentials Secret during one
// Apply; it opens the credentials at most once. close zeroes what it
// opened.
type credentialsWriter struct {
	cl   *cluster
	s    *clusterv1.Sentinel
	data map[string][]byte
	// written is the owner of the last write or check (nil: none yet).
	written *metav1.OwnerReference
	done    bool
}

func (w *credentialsWriter) key() string {
	return w.cl.p.Namespace + "/" + credentialsName(w.s.GetK8SName())
}

// current reports, from the cache alone, whether the Secret exists with
// the wanted metadata and owner and holds what this process wrote for
// this blob.
func (w *credentialsWriter) current(owner *metav1.OwnerReference) bool {
	cl := w.cl
	live := cached[*metav1.PartialObjectMetadata](cl.secrets, cl.p.Namespace, credentialsName(w.s.GetK8SName()))
	if live == nil || live.DeletionTimestamp != nil || !cl.verified.Is(w.key(), credentialsHash(w.s), live.ResourceVersion) {
		return false
	}
	desired, err := kube.ToUnstructured(buildCredentialsSecret(w.s, cl.p, owner, nil))
	if err != nil {
		return false
	}
	// The cache holds metadata only: compare that.
	drift, err := kube.DriftObject(map[string]any{"metadata": desired.Object["metadata"]}, live)
	return err == nil && drift == ""
}

// ensure makes the Secret exist with the opened credentials, owned by
// owner when given, and says whether it wrote.
func (w *credentialsWriter) ensure(ctx context.Context, owner *metav1.OwnerReference) (bool, error) {
	if w.done && sameOwner(w.written, owner) {
		return false, nil
	}
	if w.current(owner) {
		w.done, w.written = true, owner
		return false, nil
	}
	if w.data == nil {
		data, err := w.cl.openCredentials(ctx, w.s)
		if err != nil {
			return false, err
		}
		w.data = data
	}
	obj, err := kube.ToUnstructured(buildCredentialsSecret(w.s, w.cl.p, owner, w.data))
	if err != nil {
		return false, fmt.Errorf("sentinel %s: convert Secret %s: %w", w.s.GetId(), w.key(), err)
	}
	out, err := kube.Apply(ctx, w.cl.dyn, secretsGVR, obj)
	unstructured.RemoveNestedField(obj.Object, "data")
	if err != nil {
		return false, fmt.Errorf("sentinel %s: apply Secret %s: %w", w.s.GetId(), w.key(), classify(err))
	}
	w.cl.verified.Put(w.key(), credentialsHash(w.s), out.GetResourceVersion())
	w.done, w.written = true, owner
	w.cl.log.Info("credentials Secret applied", "sentinel", w.s.GetId(), "secret", w.key(), "variables", len(w.data), "owned", owner != nil)
	return true, nil
}

func (w *credentialsWriter) close() {
	for _, v := range w.data {
		clear(v)
	}
	w.data = nil
}

func sameOwner(a, b *metav1.OwnerReference) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.UID == b.UID && a.Name == b.Name
}

// openCredentials opens the sentinel's credentials through the host: a
// copy the caller owns (and zeroes). A failure to reach ctrl is retried;
// a credential the container cannot take is a permanent error naming it
// (never its value).
func (cl *cluster) openCredentials(ctx context.Context, s *clusterv1.Sentinel) (map[string][]byte, error) {
	if cl.host == nil {
		return nil, fmt.Errorf("sentinel %s: no krane host services to open its credentials with (retrying)", s.GetId())
	}
	env, err := cl.host.DecryptEnv(ctx, s.GetId(), s.GetEncryptedCredentials())
	if err != nil {
		return nil, fmt.Errorf("sentinel %s: cannot open its credentials (retrying): %w", s.GetId(), err)
	}
	reserved := map[string]bool{}
	for _, e := range containerEnv(identityOf(s, 0), cl.p) {
		reserved[e.Name] = true
	}
	data := make(map[string][]byte, len(env))
	for _, name := range slices.Sorted(maps.Keys(env)) {
		var bad string
		switch {
		case !envName.MatchString(name):
			bad = fmt.Sprintf("credential %q is not a variable name", name)
		case reserved[name]:
			bad = fmt.Sprintf("credential %s is set by Krane itself (the container's env wins over envFrom); rename it", name)
		}
		if bad != "" {
			for _, v := range data {
				clear(v)
			}
			return nil, sdk.InvalidField("encrypted_credentials", "%s", bad)
		}
		data[name] = []byte(env[name])
	}
	cl.log.Debug("credentials opened through the host", "sentinel", s.GetId(), "variables", len(data))
	return data, nil
}

// deleteCredentials deletes the sentinel's credentials Secrets except the
// one named keep ("" deletes all). It lists metadata from the API server
// (no data crosses the wire), so a Secret written a moment ago is not
// missed.
func (cl *cluster) deleteCredentials(ctx context.Context, id, keep string) error {
	ns := cl.p.Namespace
	list, err := cl.meta.Resource(secretsGVR).Namespace(ns).List(ctx, metav1.ListOptions{LabelSelector: kube.ManagedSelector(Component) + "," + LabelSentinel + "=" + id})
	if err != nil {
		return fmt.Errorf("list Secrets of sentinel %s: %w", id, err)
	}
	for _, s := range list.Items {
		if s.Name == keep || s.DeletionTimestamp != nil {
			continue
		}
		uid := s.UID
		err := kube.Typed[corev1.Secret, corev1.SecretList](cl.clients, "secrets", ns).Delete(ctx, s.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
		// NotFound: already gone. Conflict: replaced by a newer object
		// with another UID, which is not ours to delete.
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return fmt.Errorf("delete Secret %s/%s: %w", ns, s.Name, err)
		}
		cl.verified.Forget(ns + "/" + s.Name)
		cl.log.Info("credentials Secret deleted", "sentinel", id, "secret", ns+"/"+s.Name)
	}
	return nil
}
