package controller

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"

	"krane.dev/sdk/kube"
)

// Where pull Secrets may go, and how the plugin knows its own copies
// (see pullsecrets.go for the whole picture).

// hostNamespaceFile holds the namespace of an in-cluster pod.
const hostNamespaceFile = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// hostNamespace is the namespace krane runs in when in-cluster, "" when
// unknown.
func hostNamespace(inCluster bool) string {
	if !inCluster {
		return ""
	}
	b, err := os.ReadFile(hostNamespaceFile)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// reservedNamespace says why no user workload (and so no pull Secret copy)
// may go into ns, "" when it may: the cluster's own namespaces (default and
// every kube-*), krane's (the host's, "krane" as rbac.yaml installs it, and
// the in-cluster pod's own), where the pull Secrets' sources are, and
// where the sentinels run.
func reservedNamespace(cfg Config, ns string) string {
	switch {
	case ns == "default" || strings.HasPrefix(ns, "kube-"):
		return "it is the cluster's own"
	case ns == "krane" || (ns == cfg.hostNamespace && ns != ""):
		return "krane runs there"
	case ns == cfg.PullSecretNamespace:
		return "the pull Secrets' sources are kept there (pull_secret_namespace)"
	case ns == cfg.SentinelNamespace:
		return "the sentinels run there (sentinel_namespace)"
	}
	return ""
}

// desiredNamespaces is what the plugin holds from ctrl: the namespace of
// every deployment it was sent and did not see deleted or stopped. Only
// these namespaces ever receive pull Secret copies; a ReplicaSet's labels,
// which anyone who may create one can set, decide nothing. complete is set
// once the host has asked for the inventory, which it does after applying
// a whole bootstrap: before that, a namespace not named yet may still be
// one whose deployment has not been re-applied since a restart.
type desiredNamespaces struct {
	mu       sync.Mutex
	byID     map[string]string
	complete bool
}

// set records id's namespace and returns the one it held before ("" when
// none).
func (d *desiredNamespaces) set(id, ns string) (old string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.byID == nil {
		d.byID = map[string]string{}
	}
	old = d.byID[id]
	d.byID[id] = ns
	return old
}

func (d *desiredNamespaces) drop(id string) (ns string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	ns = d.byID[id]
	delete(d.byID, id)
	return ns
}

func (d *desiredNamespaces) markComplete() {
	d.mu.Lock()
	d.complete = true
	d.mu.Unlock()
}

func (d *desiredNamespaces) isComplete() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.complete
}

// has says whether a held deployment runs in ns.
func (d *desiredNamespaces) has(ns string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Contains(slices.Collect(maps.Values(d.byID)), ns)
}

// holds says whether id is a held deployment.
func (d *desiredNamespaces) holds(id string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	_, ok := d.byID[id]
	return ok
}

func (d *desiredNamespaces) all() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	set := map[string]bool{}
	for _, ns := range d.byID {
		set[ns] = true
	}
	return slices.Sorted(maps.Keys(set))
}

// CopyProofAnnotation on a pull Secret copy proves the plugin made it: an
// HMAC-SHA256, under the plugin's copy key, of the copy's namespace, name
// and UID. A tenant can read the copy (and so the proof) but not the key,
// and a proof does not carry over to another object (the UID differs), so
// a Secret made to look like a copy never passes for one.
const CopyProofAnnotation = "krane.dev/copy-proof"

// CopyKeySecret is the Secret of pull_secret_namespace that holds the copy
// key (data key "key", 32 random bytes), created by the plugin when
// missing. It sits beside the pull Secrets' sources: whoever can read it
// can read the credentials themselves.
const CopyKeySecret = "krane-pull-copy-key"

func copyProof(key []byte, ns, name string, uid types.UID) string {
	m := hmac.New(sha256.New, key)
	fmt.Fprintf(m, "krane pull copy\x00%s\x00%s\x00%s", ns, name, uid)
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// provenCopy: the object carries the copy's labels and a valid proof.
func provenCopy(key []byte, m metav1.Object) bool {
	l := m.GetLabels()
	if len(key) == 0 || l[PullSecretLabel] != "true" || l[kube.ManagedByLabel] != kube.ManagedBy || l[kube.ComponentLabel] != Component {
		return false
	}
	want := copyProof(key, m.GetNamespace(), m.GetName(), m.GetUID())
	return hmac.Equal([]byte(m.GetAnnotations()[CopyProofAnnotation]), []byte(want))
}

// loadCopyKey reads the copy key from pull_secret_namespace, creating it
// when missing (a list by name: the role grants list, not get).
func loadCopyKey(ctx context.Context, k *kubeState, cfg Config) ([]byte, error) {
	if cfg.PullSecretNamespace == "" || len(cfg.pullSecretNames()) == 0 {
		return nil, nil
	}
	secrets := kube.Typed[corev1.Secret, corev1.SecretList](k.clients, "secrets", cfg.PullSecretNamespace)
	for range 3 {
		list, err := secrets.List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", CopyKeySecret).String()})
		if err != nil {
			return nil, fmt.Errorf("read the pull Secret copy key %s/%s: %w", cfg.PullSecretNamespace, CopyKeySecret, err)
		}
		for _, s := range list.Items {
			if key := s.Data["key"]; len(key) >= 32 {
				return key, nil
			}
			return nil, fmt.Errorf("pull Secret copy key %s/%s has no data key \"key\" of at least 32 bytes: delete it and the plugin makes a new one (its copies made under the old key are then left alone: delete them too)", cfg.PullSecretNamespace, CopyKeySecret)
		}
		key := make([]byte, 32)
		_, _ = rand.Read(key)
		_, err = secrets.Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: CopyKeySecret, Namespace: cfg.PullSecretNamespace,
				Labels: map[string]string{kube.ManagedByLabel: kube.ManagedBy}},
			Type: corev1.SecretTypeOpaque, Data: map[string][]byte{"key": key},
		}, metav1.CreateOptions{FieldManager: kube.FieldManager})
		if err == nil {
			return key, nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("create the pull Secret copy key %s/%s: %w", cfg.PullSecretNamespace, CopyKeySecret, err)
		}
	}
	return nil, fmt.Errorf("pull Secret copy key %s/%s: created and deleted concurrently (retrying)", cfg.PullSecretNamespace, CopyKeySecret)
}
