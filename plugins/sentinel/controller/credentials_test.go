package controller_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"krane.dev/internal/testenv/kubeenv"
	"krane.dev/plugins/sentinel/controller"
	"krane.dev/sdk"
	"krane.dev/sdk/kube"
	"krane.dev/sdk/plugintest"
)

// fakeCtrl plays the krane host's DecryptEnv: each (sentinel id, blob)
// opens to its variables; anything else is refused as ctrl would.
type fakeCtrl struct {
	mu    sync.Mutex
	envs  map[string]map[string]string // id + "/" + blob
	calls atomic.Int64
}

func (f *fakeCtrl) set(id string, blob []byte, env map[string]string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.envs == nil {
		f.envs = map[string]map[string]string{}
	}
	f.envs[id+"/"+string(blob)] = env
}

func (f *fakeCtrl) DecryptEnv(_ context.Context, id string, sealed []byte) (map[string]string, error) {
	f.calls.Add(1)
	f.mu.Lock()
	defer f.mu.Unlock()
	env, ok := f.envs[id+"/"+string(sealed)]
	if !ok {
		return nil, fmt.Errorf("ctrl: PermissionDenied: not the sealed environment stored for %s", id)
	}
	return maps.Clone(env), nil
}

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// TestCredentialsSecret: a sentinel with encrypted_credentials gets the
// Secret <k8s_name>-credentials holding what the host opened, owned by the
// Deployment and read as the container's last envFrom; an unchanged Apply
// neither opens nor writes; new ciphertext changes the pod template's hash
// (a rollout) and the Secret; a hand edit of the Secret is repaired; a
// credential Krane sets itself is refused; the delete removes the Secret;
// no value reaches the plugin's log.
func TestCredentialsSecret(t *testing.T) {
	c := sharedCluster(t)
	vault := &fakeCtrl{}
	h := startWith(t, c, fullConfig, hclog.Trace, vault)
	ctx := context.Background()
	s := sentinel("sen_creds", "sentinel-creds", "env_creds", imageV1, 1)
	blob1, blob2 := []byte("sealed-1"), []byte("sealed-2")
	env1 := map[string]string{"DATABASE_PRIMARY": "mysql://u:" + randomValue(t) + "@db/x", "REDIS_URL": "redis://:" + randomValue(t) + "@r"}
	env2 := map[string]string{"DATABASE_PRIMARY": "mysql://u:" + randomValue(t) + "@db/y"}
	vault.set(s.Id, blob1, env1)
	vault.set(s.Id, blob2, env2)
	s.EncryptedCredentials = blob1
	secretName := s.K8SName + "-credentials"

	if r := h.apply(change(t, s, 1)); r != sdk.Applied {
		t.Fatalf("first Apply = %s, want applied", r)
	}
	if n := vault.calls.Load(); n != 1 {
		t.Fatalf("%d DecryptEnv calls for the first Apply, want 1", n)
	}
	dep, err := c.Client.AppsV1().Deployments(ns).Get(ctx, s.K8SName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	assertSecret(t, c, secretName, s.Id, env1, sha(blob1), dep.UID)
	ef := dep.Spec.Template.Spec.Containers[0].EnvFrom
	if len(ef) != 3 || ef[0].SecretRef.Name != "database" || ef[2].SecretRef.Name != secretName || ef[2].SecretRef.Optional != nil {
		t.Fatalf("envFrom %+v, want the configured Secrets, then %s last", ef, secretName)
	}
	if got := dep.Spec.Template.Annotations[controller.CredentialsHashAnnotation]; got != sha(blob1) {
		t.Fatalf("pod template annotation %q = %q, want the SHA-256 of the ciphertext", controller.CredentialsHashAnnotation, got)
	}

	// Unchanged: once the caches hold what was written, an Apply opens
	// nothing and writes nothing.
	waitFor(t, 30*time.Second, "an unchanged Apply", func() (bool, error) { return h.apply(change(t, s, 1)) == sdk.Unchanged, nil })
	calls, writes := vault.calls.Load(), h.calls.Writes()
	for range 5 {
		if r := h.apply(change(t, s, 1)); r != sdk.Unchanged {
			t.Fatalf("unchanged Apply = %s", r)
		}
	}
	if vault.calls.Load() != calls || h.calls.Writes() != writes {
		t.Fatalf("5 unchanged Applies: %d DecryptEnv calls, %d writes; want none", vault.calls.Load()-calls, h.calls.Writes()-writes)
	}
	// A new version with the same credentials rewrites the Deployment's
	// version annotation only: the Secret is not opened again.
	if r := h.apply(change(t, s, 2)); r != sdk.Applied || vault.calls.Load() != calls {
		t.Fatalf("version bump: %s, %d DecryptEnv calls; want applied and none", r, vault.calls.Load()-calls)
	}

	// New ciphertext: the Secret holds the new values and the template's
	// hash changes, so the Deployment rolls.
	s.EncryptedCredentials = blob2
	if r := h.apply(change(t, s, 3)); r != sdk.Applied {
		t.Fatalf("Apply with new credentials = %s", r)
	}
	dep2, err := c.Client.AppsV1().Deployments(ns).Get(ctx, s.K8SName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := dep2.Spec.Template.Annotations[controller.CredentialsHashAnnotation]; got != sha(blob2) || dep2.Generation <= dep.Generation {
		t.Fatalf("after new credentials: template hash %q (want %q), generation %d -> %d", got, sha(blob2), dep.Generation, dep2.Generation)
	}
	assertSecret(t, c, secretName, s.Id, env2, sha(blob2), dep.UID)
	waitFor(t, time.Minute, "a second ReplicaSet (the pods roll)", func() (bool, error) {
		l, err := c.Client.AppsV1().ReplicaSets(ns).List(ctx, metav1.ListOptions{LabelSelector: controller.LabelSentinel + "=" + s.Id})
		return err == nil && len(l.Items) == 2, err
	})

	// A hand edit of the Secret's data is repaired by the next Apply.
	sec, err := c.Client.CoreV1().Secrets(ns).Get(ctx, secretName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sec.Data["DATABASE_PRIMARY"] = []byte("edited by hand")
	if _, err := c.Client.CoreV1().Secrets(ns).Update(ctx, sec, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the hand edit repaired", func() (bool, error) {
		h.apply(change(t, s, 3))
		got, err := c.Client.CoreV1().Secrets(ns).Get(ctx, secretName, metav1.GetOptions{})
		return err == nil && string(got.Data["DATABASE_PRIMARY"]) == env2["DATABASE_PRIMARY"], err
	})

	// A credential named like a variable Krane sets is refused for good.
	bad := sentinel("sen_creds_bad", "sentinel-creds-bad", "env_creds_bad", imageV1, 1)
	bad.EncryptedCredentials = []byte("sealed-bad")
	vault.set(bad.Id, bad.EncryptedCredentials, map[string]string{"UNKEY_REGION": "elsewhere"})
	actx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	_, err = plugintest.Apply(actx, h.ctl, change(t, bad, 1))
	if err == nil || !sdk.IsPermanent(err) || !strings.Contains(err.Error(), "UNKEY_REGION") || strings.Contains(err.Error(), "elsewhere") {
		t.Fatalf("a credential Krane sets itself: %v, want a permanent error naming it", err)
	}
	if _, err := c.Client.AppsV1().Deployments(ns).Get(ctx, bad.K8SName, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the refused sentinel's Deployment: %v, want none", err)
	}

	// Delete: the Secret goes with the sentinel.
	h.delete(s.Id, 4)
	objectsGone(t, c, s.K8SName)
	if _, err := c.Client.CoreV1().Secrets(ns).Get(ctx, secretName, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("Secret %s after the delete: %v, want NotFound", secretName, err)
	}

	for _, env := range []map[string]string{env1, env2} {
		for k, v := range env {
			if h.logs.count(v) > 0 {
				t.Errorf("the plugin's log holds the value of %s", k)
			}
		}
	}
	if h.logs.count("credentials Secret applied") == 0 || h.logs.count("credentials Secret deleted") == 0 {
		t.Error("the plugin's log does not record the Secret's writes (by name)")
	}
}

// assertSecret checks the credentials Secret: data, labels, the hash
// annotation and the Deployment as its owner.
func assertSecret(t *testing.T, c *kubeenv.Cluster, name, id string, want map[string]string, hash string, owner types.UID) {
	t.Helper()
	sec, err := c.Client.CoreV1().Secrets(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("Secret %s: %v", name, err)
	}
	got := map[string]string{}
	for k, v := range sec.Data {
		got[k] = string(v)
	}
	if !maps.Equal(got, want) {
		t.Errorf("Secret %s holds %d keys, not the opened credentials", name, len(got))
	}
	if sec.Type != corev1.SecretTypeOpaque || sec.Labels[controller.LabelSentinel] != id || sec.Labels[kube.ManagedByLabel] != kube.ManagedBy ||
		sec.Labels[kube.ComponentLabel] != controller.Component {
		t.Errorf("Secret %s: type %s, labels %v", name, sec.Type, sec.Labels)
	}
	if sec.Annotations[controller.CredentialsHashAnnotation] != hash {
		t.Errorf("Secret %s: hash annotation %q, want %q", name, sec.Annotations[controller.CredentialsHashAnnotation], hash)
	}
	if len(sec.OwnerReferences) != 1 || sec.OwnerReferences[0].UID != owner || sec.OwnerReferences[0].Kind != "Deployment" {
		t.Errorf("Secret %s owners %+v, want the Deployment", name, sec.OwnerReferences)
	}
}

func randomValue(t *testing.T) string {
	t.Helper()
	return fmt.Sprintf("v%x", sha256.Sum256([]byte(t.Name()+time.Now().String())))[:24]
}
