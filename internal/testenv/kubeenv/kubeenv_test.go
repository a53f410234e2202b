package kubeenv_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"krane.dev/internal/testenv"
	"krane.dev/internal/testenv/kubeenv"
	"krane.dev/sdk/envtest"
)

func TestMain(m *testing.M) { testenv.Main(m) }

var cnpResource = schema.GroupVersionResource{Group: "cilium.io", Version: "v2", Resource: "ciliumnetworkpolicies"}

func TestReplicaSetBecomesReadyAcrossZones(t *testing.T) {
	c := kubeenv.Shared(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ns := "rs-ready"
	if err := c.EnsureNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{"app": "web"}
	rs := &appsv1.ReplicaSet{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: ns},
		Spec: appsv1.ReplicaSetSpec{
			Replicas: ptr(int32(3)),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					RuntimeClassName: ptr(kubeenv.RuntimeClassName),
					Tolerations:      []corev1.Toleration{{Key: kubeenv.TaintUntrusted, Operator: corev1.TolerationOpEqual, Value: kubeenv.NodeClassWorker, Effect: corev1.TaintEffectNoSchedule}},
					TopologySpreadConstraints: []corev1.TopologySpreadConstraint{{
						MaxSkew: 1, TopologyKey: kubeenv.LabelZone, WhenUnsatisfiable: corev1.DoNotSchedule,
						LabelSelector: &metav1.LabelSelector{MatchLabels: labels},
					}},
					Containers: []corev1.Container{{Name: "web", Image: "nginx:1.27"}},
				},
			},
		},
	}
	start := time.Now()
	if _, err := c.Client.AppsV1().ReplicaSets(ns).Create(ctx, rs, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(ctx, t, "3 ready replicas", func() (bool, error) {
		got, err := c.Client.AppsV1().ReplicaSets(ns).Get(ctx, "web", metav1.GetOptions{})
		return err == nil && got.Status.ReadyReplicas == 3, err
	})
	t.Logf("ReplicaSet of 3 ready after %s", time.Since(start).Round(time.Millisecond))

	pods, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	zones := map[string]bool{}
	for _, p := range pods.Items {
		if p.Status.Phase != corev1.PodRunning || p.Status.PodIP == "" {
			t.Errorf("pod %s: phase %s ip %q, want Running with an IP", p.Name, p.Status.Phase, p.Status.PodIP)
		}
		n, err := c.Client.CoreV1().Nodes().Get(ctx, p.Spec.NodeName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if n.Labels[kubeenv.LabelNodeClass] != kubeenv.NodeClassWorker {
			t.Errorf("pod %s landed on %s (class %q), want a worker node", p.Name, n.Name, n.Labels[kubeenv.LabelNodeClass])
		}
		zones[n.Labels[kubeenv.LabelZone]] = true
	}
	if len(zones) != 3 {
		t.Errorf("pods spread over zones %v, want 3 zones", zones)
	}
}

func TestFailureStagesByImageName(t *testing.T) {
	c := kubeenv.Shared(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ns := "failures"
	if err := c.EnsureNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"registry.example/kwok-fail-pull:1": "ImagePullBackOff", "registry.example/kwok-crash-loop:1": "CrashLoopBackOff"} {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{GenerateName: "broken-", Namespace: ns},
			Spec: corev1.PodSpec{
				Tolerations: []corev1.Toleration{{Key: kubeenv.TaintUntrusted, Operator: corev1.TolerationOpExists}},
				Containers:  []corev1.Container{{Name: "app", Image: name}},
			},
		}
		created, err := c.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		waitFor(ctx, t, want, func() (bool, error) {
			p, err := c.Client.CoreV1().Pods(ns).Get(ctx, created.Name, metav1.GetOptions{})
			if err != nil || len(p.Status.ContainerStatuses) == 0 {
				return false, err
			}
			w := p.Status.ContainerStatuses[0].State.Waiting
			return w != nil && w.Reason == want && !p.Status.ContainerStatuses[0].Ready, nil
		})
	}
}

func TestCiliumNetworkPolicyCRDValidates(t *testing.T) {
	c := kubeenv.Shared(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ns := "cnp"
	if err := c.EnsureNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	valid := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "cilium.io/v2", "kind": "CiliumNetworkPolicy",
		"metadata": map[string]any{"name": "allow-web", "namespace": ns},
		"spec": map[string]any{
			"endpointSelector": map[string]any{"matchLabels": map[string]any{"app": "web"}},
			"ingress": []any{map[string]any{
				"fromEndpoints": []any{map[string]any{"matchLabels": map[string]any{"app": "client"}}},
				"toPorts":       []any{map[string]any{"ports": []any{map[string]any{"port": "8080", "protocol": "TCP"}}}},
			}},
		},
	}}
	if _, err := c.Dynamic.Resource(cnpResource).Namespace(ns).Create(ctx, valid, metav1.CreateOptions{}); err != nil {
		t.Fatalf("valid policy rejected: %v", err)
	}
	got, err := c.Dynamic.Resource(cnpResource).Namespace(ns).Get(ctx, "allow-web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if port, _, _ := unstructured.NestedSlice(got.Object, "spec", "ingress"); len(port) != 1 {
		t.Errorf("policy read back with ingress %v", port)
	}

	invalid := valid.DeepCopy()
	invalid.SetName("bad-protocol")
	_ = unstructured.SetNestedSlice(invalid.Object, []any{map[string]any{
		"toPorts": []any{map[string]any{"ports": []any{map[string]any{"port": "8080", "protocol": "CARRIER-PIGEON"}}}},
	}}, "spec", "ingress")
	_, err = c.Dynamic.Resource(cnpResource).Namespace(ns).Create(ctx, invalid, metav1.CreateOptions{})
	if !apierrors.IsInvalid(err) {
		t.Fatalf("policy with protocol CARRIER-PIGEON: got %v, want an Invalid error from the CRD schema", err)
	}
}

func TestServiceAccountTokenIsBoundByRBAC(t *testing.T) {
	c := kubeenv.Shared(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ns := "rbac"
	if err := c.EnsureNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	err := c.ApplyYAML(ctx, []byte(fmt.Sprintf(`
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: configmap-reader, namespace: %[1]s}
rules:
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, list]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: reader, namespace: %[1]s}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: configmap-reader}
subjects:
- {kind: ServiceAccount, name: reader, namespace: %[1]s}
`, ns)))
	if err != nil {
		t.Fatal(err)
	}
	cfg, _, err := c.ServiceAccountConfig(ctx, ns, "reader")
	if err != nil {
		t.Fatal(err)
	}
	sa := kubernetes.NewForConfigOrDie(cfg)
	if _, err := sa.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("list configmaps (allowed by the Role): %v", err)
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "x"}}
	if _, err := sa.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("create configmap (not in the Role): got %v, want Forbidden", err)
	}
	if _, err := sa.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("list secrets (not in the Role): got %v, want Forbidden", err)
	}
	if _, err := dynamic.NewForConfigOrDie(cfg).Resource(cnpResource).Namespace(ns).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("list CiliumNetworkPolicies (not in the Role): got %v, want Forbidden", err)
	}
}

func TestTwoClustersAtOnce(t *testing.T) {
	a := kubeenv.Shared(t)
	b := kubeenv.Start(t, kubeenv.Options{Name: "region-b", Zones: []string{"b1", "b2", "b3"}, WorkerNodesPerZone: 1, WithoutCiliumCRD: true})
	t.Logf("second cluster started in %s", b.StartupTime().Round(time.Millisecond))
	ctx := context.Background()
	if err := b.EnsureNamespace(ctx, "only-in-b"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Client.CoreV1().Namespaces().Get(ctx, "only-in-b", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("namespace created in cluster b is visible in cluster a: %v", err)
	}
	if _, err := b.Client.Discovery().ServerResourcesForGroupVersion("cilium.io/v2"); err == nil {
		t.Errorf("cluster b was started without the Cilium CRD but serves cilium.io/v2")
	}
}

func waitFor(ctx context.Context, t *testing.T, what string, cond func() (bool, error)) {
	t.Helper()
	var last error
	for {
		ok, err := cond()
		if ok {
			return
		}
		last = err
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s (last error: %v)", what, last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func ptr[T any](v T) *T { return &v }

// TestNodeHeartbeatsRenewLeases: kwok renews every node's Lease well
// within the controller-manager's grace period, so nodes (and their pods)
// stay Ready for as long as a test runs.
func TestNodeHeartbeatsRenewLeases(t *testing.T) {
	c := kubeenv.Shared(t)
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	leases := c.Client.CoordinationV1().Leases(corev1.NamespaceNodeLease)
	var first time.Time
	waitFor(ctx, t, "a node Lease", func() (bool, error) {
		l, err := leases.Get(ctx, "worker-zone-a-0", metav1.GetOptions{})
		if err != nil || l.Spec.RenewTime == nil {
			return false, nil
		}
		first = l.Spec.RenewTime.Time
		return true, nil
	})
	waitFor(ctx, t, "the node Lease renewed", func() (bool, error) {
		l, err := leases.Get(ctx, "worker-zone-a-0", metav1.GetOptions{})
		return err == nil && l.Spec.RenewTime.After(first), err
	})
}

// TestAComponentThatExitsFailsTheStart: a kube-controller-manager that
// refuses its flags (here, an unknown controller to disable) fails the
// cluster's start with its own words, instead of a cluster where nothing
// ever makes a pod.
func TestAComponentThatExitsFailsTheStart(t *testing.T) {
	_, err := envtest.New(envtest.Options{Name: "badkcm", Zones: []string{"zone-a"}, DisabledControllers: []string{"no-such-controller"}})
	if err == nil || !strings.Contains(err.Error(), "kube-controller-manager exited") || !strings.Contains(err.Error(), "no-such-controller") {
		t.Fatalf("start with an unknown controller: %v, want it to say kube-controller-manager exited and why", err)
	}
}
