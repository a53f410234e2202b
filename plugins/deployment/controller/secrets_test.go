package controller_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"maps"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"

	"krane.dev/plugins/deployment/controller"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
	"krane.dev/sdk"
	"krane.dev/sdk/kube"
	"krane.dev/sdk/plugintest"
)

// fakeVault plays the krane host's DecryptEnv: each deployment id opens to
// its own random values, "dep_sec_denied" is refused the way ctrl refuses.
type fakeVault struct {
	mu     sync.Mutex
	values map[string]map[string]string
	calls  map[string]int
}

func newFakeVault() *fakeVault {
	return &fakeVault{values: map[string]map[string]string{}, calls: map[string]int{}}
}

func randomValue() string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return "v-" + hex.EncodeToString(b)
}

func (f *fakeVault) DecryptEnv(_ context.Context, id string, sealed []byte) (map[string]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls[id]++
	if id == "dep_sec_denied" {
		return nil, status.Error(codes.PermissionDenied, "ctrl: deployment dep_sec_denied is not scheduled to run in region local")
	}
	if len(sealed) == 0 {
		return nil, status.Error(codes.InvalidArgument, "no blob")
	}
	if f.values[id] == nil {
		f.values[id] = map[string]string{"DB_PASSWORD": randomValue(), "API_TOKEN": randomValue(), "EMPTY": ""}
	}
	return maps.Clone(f.values[id]), nil
}

func (f *fakeVault) count(id string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[id]
}

func (f *fakeVault) total() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, c := range f.calls {
		n += c
	}
	return n
}

func (f *fakeVault) secretValues() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, m := range f.values {
		for _, v := range m {
			if v != "" {
				out = append(out, v)
			}
		}
	}
	return out
}

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// startSecretPlugin is startPlugin with a fake vault served through the
// broker, and the plugin's log (debug) captured.
func startSecretPlugin(t *testing.T, config string, v *fakeVault) (plugin, *controller.Controller, *syncBuffer) {
	t.Helper()
	_, kubeconfig, _ := pluginIdentity(t)
	logs := &syncBuffer{}
	log := hclog.New(&hclog.LoggerOptions{Name: "deployment", Level: hclog.Trace, Output: io.MultiWriter(logs, os.Stderr)})
	counter := &kube.CallCounter{}
	impl := controller.New(log, controller.WithCallCounter(counter))
	ctl := plugintest.New(t, impl, plugintest.WithHost(v))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := ctl.Configure(ctx, &sdk.ConfigureRequest{Region: "local", ClusterID: "test", Kube: sdk.KubeSource{Path: kubeconfig}, Config: []byte(config)}); err != nil {
		t.Fatalf("Configure: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = ctl.Shutdown(ctx)
	})
	return plugin{ctl, counter}, impl, logs
}

func sealedSpec(ns, name string, replicas int32) *clusterv1.Deployment {
	d := spec(ns, name, image, replicas)
	d.EncryptedEnv = []byte("sealed:" + ns + "/" + name + ":" + randomValue())
	return d
}

func secretsOf(t *testing.T, ns, id string) []corev1.Secret {
	t.Helper()
	cluster, _, _ := pluginIdentity(t)
	list, err := cluster.Client.CoreV1().Secrets(ns).List(context.Background(), metav1.ListOptions{LabelSelector: controller.LabelDeployment + "=" + id})
	if err != nil {
		t.Fatal(err)
	}
	return list.Items
}

// TestSecretEnvironment: a deployment with a sealed environment runs with a
// Secret (written before its ReplicaSet, owned by it, read with envFrom);
// unchanged applies and resyncs write nothing and ask the host nothing;
// hand edits are repaired from the cache; a decrypt failure is retryable
// and blocks only its deployment; nothing secret reaches the log.
func TestSecretEnvironment(t *testing.T) {
	cluster, _, _ := pluginIdentity(t)
	ctx := context.Background()
	for _, ns := range []string{"sec", "sec-other"} {
		cleanupNamespace(t, cluster, ns)
	}
	v := newFakeVault()
	p, impl, logs := startSecretPlugin(t, `{"secret_cache_ttl": "3s"}`, v)
	const id = "dep_sec"
	d := sealedSpec("sec", "web", 2)

	// Order of creation, seen through a watch of the namespace's Secrets
	// and ReplicaSets: resourceVersions are etcd revisions.
	if err := cluster.EnsureNamespace(ctx, "sec"); err != nil {
		t.Fatal(err)
	}
	sw, err := cluster.Client.CoreV1().Secrets("sec").Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer sw.Stop()
	rw, err := cluster.Client.AppsV1().ReplicaSets("sec").Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer rw.Stop()

	apply(t, p, change(t, id, 1, d), sdk.Applied)
	if n := v.count(id); n != 1 {
		t.Fatalf("%d DecryptEnv calls for the first apply, want 1", n)
	}
	secretRV, rsRV := addedRV(t, sw), addedRV(t, rw)
	if secretRV >= rsRV {
		t.Fatalf("the Secret (rv %d) was created after its ReplicaSet (rv %d): pods could start without it", secretRV, rsRV)
	}

	// The Secret: our labels, the blob's hash, immutable, owned by the
	// ReplicaSet, holding exactly the values.
	secrets, rss := secretsOf(t, "sec", id), replicaSetsOf(t, cluster, id)
	if len(secrets) != 1 || len(rss) != 1 {
		t.Fatalf("%d Secrets and %d ReplicaSets, want 1 and 1", len(secrets), len(rss))
	}
	sec, rs := secrets[0], rss[0]
	want := v.values[id]
	got := map[string]string{}
	for k, b := range sec.Data {
		got[k] = string(b)
	}
	if !maps.Equal(got, want) {
		t.Fatal("the Secret's data is not the opened environment")
	}
	if sec.Labels[kube.ManagedByLabel] != kube.ManagedBy || sec.Labels[kube.ComponentLabel] != controller.Component ||
		sec.Immutable == nil || !*sec.Immutable || sec.Annotations[controller.SealedHashAnnotation] == "" {
		t.Errorf("Secret metadata: labels %v, annotations %v, immutable %v", sec.Labels, sec.Annotations, sec.Immutable)
	}
	if len(sec.OwnerReferences) != 1 || sec.OwnerReferences[0].UID != rs.UID || sec.OwnerReferences[0].Kind != "ReplicaSet" {
		t.Errorf("Secret owners %+v, want ReplicaSet %s", sec.OwnerReferences, rs.Name)
	}
	c := rs.Spec.Template.Spec.Containers[0]
	if len(c.EnvFrom) != 1 || c.EnvFrom[0].SecretRef.Name != sec.Name {
		t.Fatalf("template envFrom %+v, want Secret %s", c.EnvFrom, sec.Name)
	}
	for _, e := range c.Env {
		if e.Name == "UNKEY_ENCRYPTED_ENV" {
			t.Error("UNKEY_ENCRYPTED_ENV set without pass_encrypted_env")
		}
	}
	waitUntil(t, time.Minute, "2 pods reading the Secret", func() bool {
		pods := podsOf(t, cluster, "sec", id)
		for _, pod := range pods {
			if ef := pod.Spec.Containers[0].EnvFrom; len(ef) != 1 || ef[0].SecretRef.Name != sec.Name || pod.Status.Phase != corev1.PodRunning {
				return false
			}
		}
		return len(pods) == 2
	})

	// Unchanged: no write, no read, no DecryptEnv, even long after the
	// cache expired.
	ch := change(t, id, 1, d)
	applyUntil(t, p, ch, sdk.Unchanged)
	time.Sleep(3500 * time.Millisecond)
	writes, reads, calls := p.counter.Writes(), p.counter.Reads(), v.total()
	for i := range 500 {
		if r, err := plugintest.Apply(ctx, p, ch); err != nil || r != sdk.Unchanged {
			t.Fatalf("unchanged Apply #%d = %s, %v", i, r, err)
		}
	}
	if w, r, n := p.counter.Writes()-writes, p.counter.Reads()-reads, v.total()-calls; w != 0 || r != 0 || n != 0 {
		t.Fatalf("500 unchanged Applies: %d writes, %d reads, %d DecryptEnv calls; want none", w, r, n)
	}
	if st := impl.SecretStats(); st.Cached != 0 {
		t.Errorf("%d opened environments still in memory after their TTL", st.Cached)
	}

	// A new version (scale) re-applies the ReplicaSet only: the Secret is
	// known, nothing is decrypted.
	d.Replicas = 3
	apply(t, p, change(t, id, 2, d), sdk.Applied)
	if n := v.count(id); n != 1 {
		t.Fatalf("%d DecryptEnv calls after a scale, want still 1", n)
	}

	// Hand edits: the blob's hash annotation forged, then the Secret
	// deleted. Repaired from the cache (one DecryptEnv, as the
	// cache had expired before the first repair), with the same values.
	secrets = secretsOf(t, "sec", id)
	if _, err := cluster.Client.CoreV1().Secrets("sec").Patch(ctx, secrets[0].Name, types.MergePatchType,
		[]byte(`{"metadata":{"annotations":{"`+controller.SealedHashAnnotation+`":"forged"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	applyUntil(t, p, change(t, id, 2, d), sdk.Applied)
	if err := cluster.Client.CoreV1().Secrets("sec").Delete(ctx, secrets[0].Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	applyUntil(t, p, change(t, id, 2, d), sdk.Applied)
	applyUntil(t, p, change(t, id, 2, d), sdk.Unchanged)
	if n := v.count(id); n != 2 {
		t.Errorf("%d DecryptEnv calls after two repairs within the cache TTL, want 2 (one after expiry, then a cache hit)", n)
	}
	secrets = secretsOf(t, "sec", id)
	if len(secrets) != 1 || secrets[0].Annotations[controller.SealedHashAnnotation] == "forged" || string(secrets[0].Data["DB_PASSWORD"]) != want["DB_PASSWORD"] ||
		len(secrets[0].OwnerReferences) != 1 {
		t.Fatalf("after repairs: %d Secrets, %+v", len(secrets), secrets[0].ObjectMeta)
	}

	// A decrypt failure is retryable, names the reason and blocks only its
	// deployment: nothing of it reaches the cluster, the other applies.
	_, err = plugintest.Apply(ctx, p, change(t, "dep_sec_denied", 1, sealedSpec("sec-other", "denied", 1)))
	if err == nil || sdk.IsPermanent(err) || !strings.Contains(err.Error(), "not scheduled to run in region local") || !strings.Contains(err.Error(), "dep_sec_denied") {
		t.Fatalf("a refused decryption: %v, want a retryable error with ctrl's reason", err)
	}
	if len(replicaSetsOf(t, cluster, "dep_sec_denied")) != 0 || len(secretsOf(t, "sec-other", "dep_sec_denied")) != 0 {
		t.Fatal("a deployment whose secrets cannot be opened reached the cluster")
	}
	apply(t, p, change(t, "dep_sec_other", 1, sealedSpec("sec-other", "ok", 1)), sdk.Applied)

	// Delete: the Secrets go with the workload and the namespace.
	apply(t, p, deleted(id, 3), sdk.Deleted)
	apply(t, p, deleted("dep_sec_other", 2), sdk.Deleted)
	apply(t, p, deleted("dep_sec_denied", 2), sdk.Deleted)
	waitUntil(t, time.Minute, "Secrets and namespaces gone", func() bool {
		return len(secretsOf(t, "sec", id)) == 0 && len(secretsOf(t, "sec-other", "dep_sec_other")) == 0 && namespaceGone(t, cluster, "sec-other")
	})

	// Nothing secret in the plugin's log (debug level).
	out := logs.String()
	if !strings.Contains(out, "Secret applied") {
		t.Fatal("the plugin's log was not captured")
	}
	for _, val := range v.secretValues() {
		if strings.Contains(out, val) {
			t.Fatal("the plugin's log contains a secret value")
		}
	}
}

// addedRV is the resourceVersion of the first ADDED event on w.
func addedRV(t *testing.T, w watch.Interface) int64 {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case ev := <-w.ResultChan():
			if ev.Type != watch.Added {
				continue
			}
			m, ok := ev.Object.(metav1.Object)
			if !ok {
				continue
			}
			rv, err := strconv.ParseInt(m.GetResourceVersion(), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return rv
		case <-timeout:
			t.Fatal("no ADDED event within 10s")
		}
	}
}

// TestSecretResync measures a resync of deployments with secrets: after
// the first pass, no DecryptEnv call and no write, and the cache is not even
// consulted (each Secret is known by its resourceVersion).
func TestSecretResync(t *testing.T) {
	cluster, _, _ := pluginIdentity(t)
	cleanupNamespace(t, cluster, "sec-resync")
	v := newFakeVault()
	p, impl, _ := startSecretPlugin(t, `{}`, v)
	const n, passes = 30, 5
	changes := make([]sdk.Change, n)
	for i := range changes {
		changes[i] = change(t, fmt.Sprintf("dep_resync_%02d", i), 1, sealedSpec("sec-resync", fmt.Sprintf("web-%02d", i), 1))
		apply(t, p, changes[i], sdk.Applied)
	}
	for _, ch := range changes {
		applyUntil(t, p, ch, sdk.Unchanged)
	}
	before, calls, writes := impl.SecretStats(), v.total(), p.counter.Writes()
	t.Logf("creating %d deployments with secrets: %d DecryptEnv calls, cache hits %d, misses %d (the owner update after the ReplicaSet hits the cache)",
		n, calls, before.CacheHits, before.CacheMisses)
	for range passes {
		for _, ch := range changes {
			if r, err := plugintest.Apply(context.Background(), p, ch); err != nil || r != sdk.Unchanged {
				t.Fatalf("resync Apply of %s = %s, %v", ch.ID, r, err)
			}
		}
	}
	after := impl.SecretStats()
	if got := v.total() - calls; got != 0 || p.counter.Writes() != writes {
		t.Fatalf("%d resync passes over %d deployments: %d DecryptEnv calls, %d writes; want 0 and 0", passes, n, got, p.counter.Writes()-writes)
	}
	t.Logf("resync, %d passes x %d deployments with secrets: %d DecryptEnv calls, %d writes, %d cache lookups (each Secret is known by its resourceVersion: 100%% of resync Applies answered without ctrl)",
		passes, n, v.total()-calls, p.counter.Writes()-writes, (after.CacheHits+after.CacheMisses)-(before.CacheHits+before.CacheMisses))

	// A restarted plugin (empty cache, nothing known): one DecryptEnv per
	// deployment to check what is there, and no write.
	p2, impl2, _ := startSecretPlugin(t, `{}`, v)
	calls, writes = v.total(), p2.counter.Writes()
	for _, ch := range changes {
		applyUntil(t, p2, ch, sdk.Unchanged)
	}
	for range passes {
		for _, ch := range changes {
			if r, err := plugintest.Apply(context.Background(), p2, ch); err != nil || r != sdk.Unchanged {
				t.Fatalf("resync after restart: %s = %s, %v", ch.ID, r, err)
			}
		}
	}
	st := impl2.SecretStats()
	if got := v.total() - calls; got != n || p2.counter.Writes() != writes {
		t.Fatalf("after a restart: %d DecryptEnv calls and %d writes for %d deployments, want %d and 0", got, p2.counter.Writes()-writes, n, n)
	}
	t.Logf("after a plugin restart: %d DecryptEnv calls (one per deployment, checking the live Secrets), 0 writes, then %d resync passes with none; cache hits %d, misses %d",
		v.total()-calls, passes, st.CacheHits, st.CacheMisses)
	for _, ch := range changes {
		apply(t, p2, deleted(ch.ID, 2), sdk.Deleted)
	}
	if _, err := cluster.Client.CoreV1().Namespaces().Get(context.Background(), "sec-resync", metav1.GetOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
}
