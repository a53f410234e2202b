package controller_test

//lint:file-ignore SA1019 legacy-workload: removed no earlier than v0.3.0 (docs/compatibility.md); this file builds or reads the deprecated top-level workload fields

import (
	"cmp"
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"krane.dev/internal/testenv/kubeenv"
	"krane.dev/plugins/deployment/controller"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
	"krane.dev/sdk"
	"krane.dev/sdk/kube"
	"krane.dev/sdk/plugintest"
	"krane.dev/shared/kinds"
)

const image = "registry.example/team/web:v1"

func TestConformance(t *testing.T) {
	cluster, kubeconfig, _ := pluginIdentity(t)
	for _, ns := range []string{"conf-a", "conf-b", "conf-invalid"} {
		cleanupNamespace(t, cluster, ns)
	}
	ctl := plugintest.New(t, controller.New(testLogger()), plugintest.WithHost(newFakeVault()))

	var bad []plugintest.BadConfig
	for _, bc := range controller.BadConfigs() {
		bad = append(bad, plugintest.BadConfig{Config: bc.Config, Key: bc.Key})
	}
	// Configure checks the cluster too: a RuntimeClass that does not exist.
	bad = append(bad, plugintest.BadConfig{Config: `{"runtime_class": "kata"}`, Key: "runtime_class"})

	var invalid []plugintest.InvalidChange
	for i, ic := range controller.InvalidCases() {
		d := controller.ValidSpec()
		d.K8SNamespace = "conf-invalid"
		id := cmp.Or(ic.ID, d.GetId())
		ic.Edit(d)
		invalid = append(invalid, plugintest.InvalidChange{Change: change(t, id, uint64(100+i), d), Field: ic.Field})
	}
	invalid = append(invalid,
		plugintest.InvalidChange{Change: sdk.Change{Kind: kinds.Deployment, ID: "dep_raw", Version: 200, Spec: sdk.Spec{TypeURL: "type.googleapis.com/krane.cluster.v1.Deployment", Value: []byte{0xff, 0x01}}}},
		plugintest.InvalidChange{Change: changeOf(t, "dep_struct", 201, &clusterv1.Sentinel{Id: "x"})},
	)

	full := spec("conf-b", "api", "ghcr.io/team/api@sha256:"+sha, 2)
	full.AppId = "app_conf"
	full.Port = 3000
	full.Command = []string{"/api", "serve"}
	full.EncryptedEnv = []byte("sealed by ctrl")
	full.ShutdownSignal = "SIGINT"
	full.Healthcheck = &clusterv1.Healthcheck{Method: "POST", Path: "/health", PeriodSeconds: 5}
	plugintest.Conformance(t, ctl, plugintest.Suite{
		Configure: sdk.ConfigureRequest{
			Region: "local", ClusterID: "test",
			Kube:   sdk.KubeSource{Path: kubeconfig},
			Config: []byte(`{"status_resync_interval": "30s", "probe_defaults": {"timeout_seconds": 3}}`),
		},
		BadConfigs: bad,
		Objects: []sdk.Change{
			change(t, "dep_conf_a", 10, spec("conf-a", "web", image, 1)),
			change(t, "dep_conf_b", 11, full),
		},
		Invalid: invalid,
	})
	// Nothing reached the cluster for the invalid changes, and the deleted
	// objects left nothing behind: ReplicaSets and namespaces are gone.
	// The namespace controller finishes a namespace only after the pods'
	// grace period estimate, hence the long wait.
	waitUntil(t, 2*time.Minute, "conformance objects gone", func() bool {
		return len(replicaSetsOf(t, cluster, "dep_conf_a")) == 0 && len(replicaSetsOf(t, cluster, "dep_conf_b")) == 0 &&
			namespaceGone(t, cluster, "conf-a") && namespaceGone(t, cluster, "conf-b") && namespaceGone(t, cluster, "conf-invalid")
	})
}

const sha = "4e07408562bedb8b60ce05c1decfe3ad16b72230967de01f640b7e4729b49fce"

func changeOf(t *testing.T, id string, version uint64, m proto.Message) sdk.Change {
	t.Helper()
	s, err := sdk.SpecOf(m)
	if err != nil {
		t.Fatal(err)
	}
	return sdk.Change{Kind: kinds.Deployment, ID: id, Version: version, Spec: s}
}

// TestLifecycle: apply, spread, report, scale up and down without pod
// churn, replace pods on an image change, delete everything.
func TestLifecycle(t *testing.T) {
	cluster, _, _ := pluginIdentity(t)
	cleanupNamespace(t, cluster, "life")
	p := startPlugin(t, `{}`)
	st := watchStatus(t, p)
	const id = "dep_life"
	d := spec("life", "web", image, 3)

	start := time.Now()
	apply(t, p, change(t, id, 1, d), sdk.Applied)
	rep := st.waitFor(t, id, time.Minute, "3 instances running", running(3))
	t.Logf("time to Running: %s from Apply to a report of 3 running instances", time.Since(start).Round(time.Millisecond))

	pods := podsOf(t, cluster, "life", id)
	zones := map[string]bool{}
	for _, pod := range pods {
		if !isWorker(pod.Spec.NodeName) {
			t.Errorf("pod %s on node %q, want a kwok worker node", pod.Name, pod.Spec.NodeName)
		}
		zones[zoneOfNode(t, cluster, pod.Spec.NodeName)] = true
		if pod.Spec.RuntimeClassName == nil || *pod.Spec.RuntimeClassName != "gvisor" || *pod.Spec.AutomountServiceAccountToken {
			t.Errorf("pod %s: runtime class %v, automount %v", pod.Name, pod.Spec.RuntimeClassName, *pod.Spec.AutomountServiceAccountToken)
		}
	}
	if len(zones) != 3 {
		t.Errorf("3 replicas in zones %v, want one per zone", zones)
	}
	byName := map[string]corev1.Pod{}
	for _, pod := range pods {
		byName[pod.Name] = pod
	}
	for _, in := range rep.status.Instances {
		pod, ok := byName[in.K8SName]
		if !ok {
			t.Fatalf("instance %s is not a pod of the deployment", in.K8SName)
		}
		if want := net.JoinHostPort(pod.Status.PodIP, "8080"); in.Address != want {
			t.Errorf("instance %s address %q, want %q", in.K8SName, in.Address, want)
		}
		if want := zoneOfNode(t, cluster, pod.Spec.NodeName); in.Zone != want || in.CpuMillicores != 250 || in.MemoryMib != 256 {
			t.Errorf("instance %+v, want zone %s, 250m, 256Mi", in, want)
		}
	}
	if rep.version != 1 || rep.status.DesiredReplicas != 3 || rep.status.K8SName != "web" {
		t.Errorf("report version %d, desired %d, name %q", rep.version, rep.status.DesiredReplicas, rep.status.K8SName)
	}
	rsName := replicaSetsOf(t, cluster, id)[0].Name

	// Scaling keeps every pod that runs.
	before := uids(pods)
	d.Replicas = 5
	apply(t, p, change(t, id, 2, d), sdk.Applied)
	st.waitFor(t, id, time.Minute, "5 running", running(5))
	scaled := uids(podsOf(t, cluster, "life", id))
	for _, uid := range before {
		if !slices.Contains(scaled, uid) {
			t.Errorf("pod %s was replaced by a scale-up", uid)
		}
	}
	d.Replicas = 2
	apply(t, p, change(t, id, 3, d), sdk.Applied)
	st.waitFor(t, id, time.Minute, "2 running", running(2))
	waitUntil(t, 30*time.Second, "scaled-down pods gone", func() bool { return len(podsOf(t, cluster, "life", id)) == 2 })
	for _, uid := range uids(podsOf(t, cluster, "life", id)) {
		if !slices.Contains(scaled, uid) {
			t.Errorf("pod %s was created by a scale-down", uid)
		}
	}
	if rss := replicaSetsOf(t, cluster, id); len(rss) != 1 || rss[0].Name != rsName {
		t.Errorf("scaling changed the ReplicaSets: %d, want only %s", len(rss), rsName)
	}

	// An image change replaces every pod.
	oldPods := podsOf(t, cluster, "life", id)
	old := uids(oldPods)
	d.Image = "registry.example/team/web:v2"
	apply(t, p, change(t, id, 4, d), sdk.Applied)
	rep = st.waitFor(t, id, time.Minute, "2 new instances running", func(s *clusterv1.DeploymentStatus) bool {
		return running(2)(s) && !slices.ContainsFunc(s.Instances, func(in *clusterv1.Instance) bool {
			return slices.ContainsFunc(oldPods, func(p corev1.Pod) bool { return p.Name == in.K8SName })
		})
	})
	waitUntil(t, time.Minute, "old pods and ReplicaSet gone", func() bool {
		pods := podsOf(t, cluster, "life", id)
		for _, pod := range pods {
			if slices.Contains(old, string(pod.UID)) || pod.Spec.Containers[0].Image != d.Image {
				return false
			}
		}
		return len(pods) == 2 && len(replicaSetsOf(t, cluster, id)) == 1
	})
	if rss := replicaSetsOf(t, cluster, id); rss[0].Name == rsName {
		t.Errorf("image change kept ReplicaSet %s", rsName)
	}
	if rep.version != 4 {
		t.Errorf("observed version %d after applying version 4", rep.version)
	}
	applyUntil(t, p, change(t, id, 4, d), sdk.Unchanged)

	// Delete removes the ReplicaSet, the pods and the namespace it made.
	apply(t, p, deleted(id, 5), sdk.Deleted)
	waitUntil(t, time.Minute, "deployment gone", func() bool {
		return len(replicaSetsOf(t, cluster, id)) == 0 && len(podsOf(t, cluster, "life", id)) == 0 && namespaceGone(t, cluster, "life")
	})
	rep = st.waitFor(t, id, 30*time.Second, "a deleted report", func(s *clusterv1.DeploymentStatus) bool { return s.Deleted && len(s.Instances) == 0 })
	if rep.version != 5 {
		t.Errorf("deleted report observed version %d, want the delete's 5 (ctrl ignores older reports)", rep.version)
	}
	items, err := plugintest.Inventory(context.Background(), p, kinds.Deployment)
	if err != nil || slices.ContainsFunc(items, func(it sdk.InventoryItem) bool { return it.ID == id }) {
		t.Errorf("Inventory after delete: %v, %v", items, err)
	}
	noStorm(t, st, id, time.Minute)
}

func TestNamespaceLifecycle(t *testing.T) {
	cluster, _, _ := pluginIdentity(t)
	ctx := context.Background()
	for _, ns := range []string{"shared", "foreign", "preexisting", "stopping"} {
		cleanupNamespace(t, cluster, ns)
	}
	p := startPlugin(t, `{}`)

	// Created on demand and labelled; kept while another deployment uses it.
	apply(t, p, change(t, "dep_ns_a", 1, spec("shared", "a", image, 1)), sdk.Applied)
	apply(t, p, change(t, "dep_ns_b", 1, spec("shared", "b", image, 1)), sdk.Applied)
	ns, err := cluster.Client.CoreV1().Namespaces().Get(ctx, "shared", metav1.GetOptions{})
	if err != nil || ns.Labels[kube.ManagedByLabel] != kube.ManagedBy {
		t.Fatalf("namespace shared: %v, labels %v", err, ns.GetLabels())
	}
	apply(t, p, deleted("dep_ns_a", 2), sdk.Deleted)
	if namespaceGone(t, cluster, "shared") || ns.DeletionTimestamp != nil {
		t.Fatal("namespace removed while dep_ns_b still runs in it")
	}
	apply(t, p, deleted("dep_ns_b", 2), sdk.Deleted)
	waitUntil(t, time.Minute, "namespace shared removed", func() bool { return namespaceGone(t, cluster, "shared") })

	// A foreign object keeps the namespace.
	apply(t, p, change(t, "dep_ns_c", 1, spec("foreign", "c", image, 1)), sdk.Applied)
	foreign := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "someone-elses", Namespace: "foreign"}}
	if _, err := cluster.Client.CoreV1().ConfigMaps("foreign").Create(ctx, foreign, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	apply(t, p, deleted("dep_ns_c", 2), sdk.Deleted)
	waitUntil(t, time.Minute, "dep_ns_c's ReplicaSet gone", func() bool { return len(replicaSetsOf(t, cluster, "dep_ns_c")) == 0 })
	if ns, err := cluster.Client.CoreV1().Namespaces().Get(ctx, "foreign", metav1.GetOptions{}); err != nil || ns.DeletionTimestamp != nil {
		t.Errorf("namespace with a foreign ConfigMap removed: %v", err)
	}

	// A namespace Krane did not create is used, never labelled, never removed.
	if err := cluster.EnsureNamespace(ctx, "preexisting"); err != nil {
		t.Fatal(err)
	}
	apply(t, p, change(t, "dep_ns_d", 1, spec("preexisting", "d", image, 1)), sdk.Applied)
	apply(t, p, deleted("dep_ns_d", 2), sdk.Deleted)
	waitUntil(t, time.Minute, "dep_ns_d's ReplicaSet gone", func() bool { return len(replicaSetsOf(t, cluster, "dep_ns_d")) == 0 })
	if ns, err := cluster.Client.CoreV1().Namespaces().Get(ctx, "preexisting", metav1.GetOptions{}); err != nil || ns.DeletionTimestamp != nil || ns.Labels[kube.ManagedByLabel] != "" {
		t.Errorf("pre-existing namespace touched: %v, labels %v", err, ns.GetLabels())
	}

	// Replicas 0 stops the deployment like a delete.
	d := spec("stopping", "e", image, 2)
	apply(t, p, change(t, "dep_ns_e", 1, d), sdk.Applied)
	d.Replicas = 0
	apply(t, p, change(t, "dep_ns_e", 2, d), sdk.Deleted)
	waitUntil(t, time.Minute, "stopped deployment and its namespace gone", func() bool {
		return len(replicaSetsOf(t, cluster, "dep_ns_e")) == 0 && len(podsOf(t, cluster, "stopping", "dep_ns_e")) == 0 && namespaceGone(t, cluster, "stopping")
	})
}

// TestNamespaceCreatedOnce: many deployments written into one new
// namespace at once (a fresh host's bootstrap) create it with one POST,
// not one per worker until the informer sees it; and a namespace deleted
// behind the plugin's back is created again by the next write into it.
func TestNamespaceCreatedOnce(t *testing.T) {
	cluster, _, _ := pluginIdentity(t)
	ctx := context.Background()
	cleanupNamespace(t, cluster, "burst")
	cleanupNamespace(t, cluster, "vanishing")
	p := startPlugin(t, `{}`)
	before := namespacePOSTs(t, cluster)
	const n = 24
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		ch := change(t, fmt.Sprintf("dep_burst_%02d", i), 1, spec("burst", fmt.Sprintf("w%02d", i), image, 1))
		wg.Go(func() {
			if got, err := plugintest.Apply(ctx, p, ch); err != nil || got != sdk.Applied {
				errs <- fmt.Errorf("Apply(%s) = %s, %v", ch.ID, got, err)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if got := namespacePOSTs(t, cluster) - before; got != 1 {
		t.Errorf("%.0f namespace POSTs for %d concurrent writes into one new namespace, want 1", got, n)
	}

	// A namespace Krane did not create (no label: the informer never sees
	// it), used, then deleted by someone else.
	if err := cluster.EnsureNamespace(ctx, "vanishing"); err != nil {
		t.Fatal(err)
	}
	apply(t, p, change(t, "dep_vanish_a", 1, spec("vanishing", "a", image, 1)), sdk.Applied)
	if err := cluster.Client.CoreV1().Namespaces().Delete(ctx, "vanishing", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 2*time.Minute, "namespace vanishing gone", func() bool { return namespaceGone(t, cluster, "vanishing") })
	// The first write may find it missing (the plugin remembered it); it
	// fails retryably, and the next creates the namespace again.
	ch := change(t, "dep_vanish_b", 1, spec("vanishing", "b", image, 1))
	waitUntil(t, 30*time.Second, "dep_vanish_b applied into a namespace created again", func() bool {
		got, err := plugintest.Apply(ctx, p, ch)
		if sdk.IsPermanent(err) {
			t.Fatalf("Apply(dep_vanish_b): %v", err)
		}
		return err == nil && got == sdk.Applied
	})
	if namespaceGone(t, cluster, "vanishing") {
		t.Fatal("namespace vanishing not created again")
	}
}

// namespacePOSTs is how many namespace creates the API server has served.
func namespacePOSTs(t *testing.T, c *kubeenv.Cluster) float64 {
	t.Helper()
	body, err := c.Client.Discovery().RESTClient().Get().AbsPath("/metrics").DoRaw(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, "apiserver_request_total{") && strings.Contains(line, `resource="namespaces"`) && strings.Contains(line, `verb="POST"`) {
			v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
			if err != nil {
				t.Fatalf("metrics line %q: %v", line, err)
			}
			n += v
		}
	}
	return n
}

// TestPrefersSentinelZones: single-replica deployments land in the zone
// where their environment's sentinel runs.
func TestPrefersSentinelZones(t *testing.T) {
	cluster, _, _ := pluginIdentity(t)
	ctx := context.Background()
	cleanupNamespace(t, cluster, "sentinel")
	cleanupNamespace(t, cluster, "near")
	if err := cluster.EnsureNamespace(ctx, "sentinel"); err != nil {
		t.Fatal(err)
	}
	sentinel := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "sentinel-env-near", Namespace: "sentinel", Labels: map[string]string{
			kube.ComponentLabel: controller.SentinelComponent, controller.LabelEnvironment: "env_near",
		}},
		Spec: corev1.PodSpec{
			Containers:   []corev1.Container{{Name: "sentinel", Image: "registry.example/sentinel:v1"}},
			NodeSelector: map[string]string{kubeenv.LabelZone: "zone-c", "node-class": "sentinel"},
			Tolerations:  []corev1.Toleration{{Key: "node-class", Operator: corev1.TolerationOpExists}},
		},
	}
	if _, err := cluster.Client.CoreV1().Pods("sentinel").Create(ctx, sentinel, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, time.Minute, "sentinel pod running", func() bool {
		p, err := cluster.Client.CoreV1().Pods("sentinel").Get(ctx, sentinel.Name, metav1.GetOptions{})
		return err == nil && p.Status.Phase == corev1.PodRunning
	})
	p := startPlugin(t, `{}`)
	for i := range 3 {
		d := spec("near", "web-"+strconv.Itoa(i), image, 1)
		d.EnvironmentId = "env_near"
		apply(t, p, change(t, "dep_near_"+strconv.Itoa(i), 1, d), sdk.Applied)
	}
	for i := range 3 {
		id := "dep_near_" + strconv.Itoa(i)
		var pods []corev1.Pod
		waitUntil(t, time.Minute, id+" scheduled", func() bool {
			pods = podsOf(t, cluster, "near", id)
			return len(pods) == 1 && pods[0].Spec.NodeName != ""
		})
		if zone := zoneOfNode(t, cluster, pods[0].Spec.NodeName); zone != "zone-c" {
			t.Errorf("%s runs in %s, want zone-c where its sentinel runs", id, zone)
		}
		apply(t, p, deleted(id, 2), sdk.Deleted)
	}
}

// TestBrokenWorkloadsAreReported: a failing image pull and a crash loop are
// reported as failed with their reason, and block nothing else.
func TestBrokenWorkloadsAreReported(t *testing.T) {
	cluster, _, _ := pluginIdentity(t)
	for _, ns := range []string{"broken-pull", "broken-crash", "healthy"} {
		cleanupNamespace(t, cluster, ns)
	}
	p := startPlugin(t, `{}`)
	st := watchStatus(t, p)
	changes := []sdk.Change{
		change(t, "dep_pull", 1, spec("broken-pull", "web", "registry.example/kwok-fail-pull:v1", 2)),
		change(t, "dep_crash", 1, spec("broken-crash", "web", "registry.example/kwok-crash-loop:v1", 1)),
		change(t, "dep_healthy", 1, spec("healthy", "web", image, 2)),
	}
	var wg sync.WaitGroup
	for _, ch := range changes {
		wg.Go(func() { apply(t, p, ch, sdk.Applied) })
	}
	wg.Wait()
	failedWith := func(n int, reason string) func(*clusterv1.DeploymentStatus) bool {
		return func(s *clusterv1.DeploymentStatus) bool {
			if len(s.Instances) != n {
				return false
			}
			for _, in := range s.Instances {
				if in.Status != clusterv1.Instance_STATUS_FAILED || in.Reason != reason || in.Message == "" {
					return false
				}
			}
			return true
		}
	}
	st.waitFor(t, "dep_healthy", time.Minute, "healthy deployment running", running(2))
	st.waitFor(t, "dep_pull", time.Minute, "2 instances failed with ImagePullBackOff", failedWith(2, "ImagePullBackOff"))
	st.waitFor(t, "dep_crash", time.Minute, "1 instance failed with CrashLoopBackOff", failedWith(1, "CrashLoopBackOff"))
	for _, ch := range changes {
		apply(t, p, deleted(ch.ID, 2), sdk.Deleted)
	}
}

func TestUnschedulableIsReported(t *testing.T) {
	cluster, _, _ := pluginIdentity(t)
	cleanupNamespace(t, cluster, "nowhere")
	p := startPlugin(t, `{"node_selector": {"node-class": "gpu"}}`)
	st := watchStatus(t, p)
	apply(t, p, change(t, "dep_nowhere", 1, spec("nowhere", "web", image, 1)), sdk.Applied)
	st.waitFor(t, "dep_nowhere", time.Minute, "a pending Unschedulable instance", func(s *clusterv1.DeploymentStatus) bool {
		return len(s.Instances) == 1 && s.Instances[0].Status == clusterv1.Instance_STATUS_PENDING &&
			s.Instances[0].Reason == "Unschedulable" && s.Instances[0].Message != ""
	})
	apply(t, p, deleted("dep_nowhere", 2), sdk.Deleted)
}

// TestStatusIsResent: with nothing changing, the full status is sent again
// every status_resync_interval, so a lost report heals.
func TestStatusIsResent(t *testing.T) {
	cluster, _, _ := pluginIdentity(t)
	cleanupNamespace(t, cluster, "resend")
	p := startPlugin(t, `{"status_resync_interval": "1s"}`)
	st := watchStatus(t, p)
	apply(t, p, change(t, "dep_resend", 1, spec("resend", "web", image, 1)), sdk.Applied)
	st.waitFor(t, "dep_resend", time.Minute, "running", running(1))
	n := len(st.of("dep_resend"))
	time.Sleep(3500 * time.Millisecond)
	if got := len(st.of("dep_resend")) - n; got < 2 {
		t.Errorf("%d reports in 3.5s of nothing happening, want >= 2 with a 1s resync", got)
	}
	apply(t, p, deleted("dep_resend", 2), sdk.Deleted)
	st.waitFor(t, "dep_resend", time.Minute, "deleted", func(s *clusterv1.DeploymentStatus) bool { return s.Deleted })
}

// TestUnchangedAppliesWriteNothing: a resync of an unchanged deployment is
// answered from the informer cache, with no API call at all.
func TestUnchangedAppliesWriteNothing(t *testing.T) {
	cluster, _, _ := pluginIdentity(t)
	cleanupNamespace(t, cluster, "quiet")
	p := startPlugin(t, `{}`)
	d := spec("quiet", "web", image, 2)
	d.Healthcheck = &clusterv1.Healthcheck{Path: "/health"}
	ch := change(t, "dep_quiet", 1, d)
	apply(t, p, ch, sdk.Applied)
	applyUntil(t, p, ch, sdk.Unchanged)

	const n = 1000
	writes, reads := p.counter.Writes(), p.counter.Reads()
	cpuBefore, wallBefore := cpuTime(t), time.Now()
	for i := range n {
		r, err := plugintest.Apply(context.Background(), p, ch)
		if err != nil || r != sdk.Unchanged {
			t.Fatalf("unchanged Apply #%d = %s, %v", i, r, err)
		}
	}
	cpu, wall := cpuTime(t)-cpuBefore, time.Since(wallBefore)
	if w := p.counter.Writes() - writes; w != 0 {
		t.Errorf("%d unchanged Applies made %d write calls, want 0", n, w)
	}
	t.Logf("%d unchanged Applies over gRPC: %d writes, %d reads, CPU %s (user+sys of the test process, plugin and caller sides), wall %s",
		n, p.counter.Writes()-writes, p.counter.Reads()-reads, cpu.Round(time.Millisecond), wall.Round(time.Millisecond))
	apply(t, p, deleted("dep_quiet", 2), sdk.Deleted)
}

func cpuTime(t *testing.T) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestDriftIsRestored: hand edits of fields Krane owns, a hand-added env
// var and a hand-deleted ReplicaSet are all taken back by the next Apply.
func TestDriftIsRestored(t *testing.T) {
	cluster, _, _ := pluginIdentity(t)
	cleanupNamespace(t, cluster, "drift")
	ctx := context.Background()
	p := startPlugin(t, `{}`)
	ch := change(t, "dep_drift", 1, spec("drift", "web", image, 2))
	apply(t, p, ch, sdk.Applied)
	applyUntil(t, p, ch, sdk.Unchanged)
	rs := replicaSetsOf(t, cluster, "dep_drift")[0]
	rsClient := cluster.Client.AppsV1().ReplicaSets("drift")
	live := func() (int32, []corev1.EnvVar, string) {
		got, err := rsClient.Get(ctx, rs.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		c := got.Spec.Template.Spec.Containers[0]
		return *got.Spec.Replicas, c.Env, c.Image
	}
	_, wantEnv, _ := live()
	patch := func(p string) {
		t.Helper()
		if _, err := rsClient.Patch(ctx, rs.Name, types.JSONPatchType, []byte(p), metav1.PatchOptions{FieldManager: "kubectl-edit"}); err != nil {
			t.Fatal(err)
		}
	}
	restored := func(what string) {
		t.Helper()
		applyUntil(t, p, ch, sdk.Applied)
		replicas, env, img := live()
		if replicas != 2 || !slices.Equal(env, wantEnv) || img != image {
			t.Errorf("after %s: replicas %d, env %v, image %s; want 2, %v, %s", what, replicas, env, img, wantEnv, image)
		}
		applyUntil(t, p, ch, sdk.Unchanged)
	}

	patch(`[{"op": "replace", "path": "/spec/replicas", "value": 5}]`)
	restored("a replica edit")
	patch(`[{"op": "replace", "path": "/spec/template/spec/containers/0/env/4/value", "value": "hacked"}]`)
	restored("an env value edit")
	patch(`[{"op": "add", "path": "/spec/template/spec/containers/0/env/-", "value": {"name": "INJECTED", "value": "1"}}]`)
	restored("an added env var")
	patch(`[{"op": "replace", "path": "/spec/template/spec/containers/0/image", "value": "registry.example/evil:latest"}]`)
	restored("an image edit")

	if err := rsClient.Delete(ctx, rs.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 30*time.Second, "hand-deleted ReplicaSet gone", func() bool {
		_, err := rsClient.Get(ctx, rs.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
	applyUntil(t, p, ch, sdk.Applied)
	waitUntil(t, time.Minute, "ReplicaSet and 2 pods back", func() bool {
		pods := podsOf(t, cluster, "drift", "dep_drift")
		return len(replicaSetsOf(t, cluster, "dep_drift")) == 1 && len(pods) == 2
	})
	apply(t, p, deleted("dep_drift", 2), sdk.Deleted)
}

// TestRBACIsLeastPrivilege: the plugin's identity can do its job (every
// other test runs with it) and nothing beyond.
func TestRBACIsLeastPrivilege(t *testing.T) {
	_, _, client := pluginIdentity(t)
	ctx := context.Background()
	forbidden := map[string]func() error{
		"read a Secret": func() error {
			_, err := client.CoreV1().Secrets("krane").Get(ctx, "any", metav1.GetOptions{})
			return err
		},
		"create a Deployment": func() error {
			_, err := client.AppsV1().Deployments("krane").Create(ctx, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "x"}}, metav1.CreateOptions{})
			return err
		},
		"delete a pod": func() error {
			return client.CoreV1().Pods("krane").Delete(ctx, "any", metav1.DeleteOptions{})
		},
		"write a ConfigMap": func() error {
			_, err := client.CoreV1().ConfigMaps("krane").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "x"}}, metav1.CreateOptions{})
			return err
		},
		"change a node": func() error {
			_, err := client.CoreV1().Nodes().Patch(ctx, "worker-zone-a-0", types.MergePatchType, []byte(`{"metadata":{"labels":{"x":"y"}}}`), metav1.PatchOptions{})
			return err
		},
		"bind a role": func() error {
			return client.RbacV1().ClusterRoleBindings().Delete(ctx, "krane-plugin-deployment", metav1.DeleteOptions{})
		},
	}
	for what, call := range forbidden {
		if err := call(); !apierrors.IsForbidden(err) {
			t.Errorf("the plugin's identity may %s: %v", what, err)
		}
	}
}
