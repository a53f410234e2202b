package controller_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"

	"krane.dev/internal/testenv/kubeenv"
	"krane.dev/plugins/sentinel/controller"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
	"krane.dev/sdk"
	"krane.dev/sdk/kube"
	"krane.dev/sdk/plugintest"
	sentinelroutes "krane.dev/sentinel/routes"
)

const (
	imageV1 = "registry.example/unkey/sentinel:v1"
	imageV2 = "registry.example/unkey/sentinel:v2"
	// fullConfig sets the keys assertObjects checks.
	fullConfig = `{"env_from_secrets":[{"name":"database"},{"name":"redis","optional":true}],"liveness_path":"/_unkey/internal/health/live","readiness_path":"/_unkey/internal/health/ready"}`
)

// Create -> five objects with the specified fields, pods on sentinel nodes
// across zones, HEALTHY on the image. Then a version bump that must not
// roll pods, an image change that must roll them (and never report the new
// image as healthy early), and a delete that removes everything.
func TestCreateRolloutDelete(t *testing.T) {
	c := sharedCluster(t)
	h := start(t, c, fullConfig)
	ctx := context.Background()
	s := sentinel("snt_roll", "sentinel-roll", "env_roll", imageV1, 3)
	s.Routes = &clusterv1.SentinelRoutes{Hosts: []string{"api.example.com", "www.example.com"},
		Backend: &clusterv1.RouteBackend{DeploymentId: "dep_a", K8SNamespace: "ws-a", K8SName: "dep-a", Port: 8080}}

	begin := time.Now()
	if r := h.apply(change(t, s, 100)); r != sdk.Applied {
		t.Fatalf("first Apply = %s, want applied", r)
	}
	healthy := h.waitReport(s.Id, begin, 2*time.Minute, "HEALTHY on v1", healthyOn(imageV1))
	t.Logf("create -> HEALTHY on %s: %s", imageV1, healthy.at.Sub(begin).Round(time.Millisecond))
	if healthy.version != 100 || healthy.st.DesiredReplicas != 3 || healthy.st.AvailableReplicas != 3 || healthy.st.K8SName != s.K8SName {
		t.Errorf("healthy report: version %d, %v", healthy.version, healthy.st)
	}

	assertObjects(t, c, s, 100)
	assertPodsSpread(t, c, s, 3, imageV1)
	assertGossipEndpoints(t, c, s, 3)

	// A new version with the same spec updates annotations only: the pod
	// template is the same, so the same pods keep running. (The generation
	// does move: the API server bumps it on any annotation change of a
	// Deployment, because annotations are copied to its ReplicaSets.)
	// So does a promote: the routes name another deployment, and only the
	// routes ConfigMap changes.
	podsBefore := podUIDs(t, c, s.Id)
	s.Routes.Backend = &clusterv1.RouteBackend{DeploymentId: "dep_b", K8SNamespace: "ws-a", K8SName: "dep-b", Port: 8080}
	bumped := h.apply(change(t, s, 101))
	dep, err := c.Client.AppsV1().Deployments(ns).Get(ctx, s.K8SName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if bumped != sdk.Applied || kube.AppliedVersion(dep.Annotations) != 101 {
		t.Errorf("version bump: result %s, version annotation %q", bumped, dep.Annotations[kube.VersionAnnotation])
	}
	waitFor(t, 10*time.Second, "a report at version 101", func() (bool, error) {
		for _, r := range h.reports.of(s.Id, begin) {
			if r.version == 101 && healthyOn(imageV1)(r.st) {
				return true, nil
			}
		}
		return false, nil
	})
	for _, r := range h.reports.of(s.Id, begin) {
		if r.version == 101 && !healthyOn(imageV1)(r.st) {
			t.Errorf("a version bump without a spec change flapped the status: %s %q %s", r.st.Health, r.st.RunningImage, r.st.Reason)
		}
	}
	if after := podUIDs(t, c, s.Id); after != podsBefore {
		t.Errorf("a version bump without a spec change replaced pods: %s -> %s", podsBefore, after)
	}
	if rev := dep.Annotations["deployment.kubernetes.io/revision"]; rev != "1" {
		t.Errorf("a version bump without a spec change made revision %s", rev)
	}
	assertObjects(t, c, s, 101)

	// Image change: a rolling update. At the moment the first "HEALTHY on
	// v2" report arrives, the cluster must already run v2 everywhere.
	var (
		checkMu  sync.Mutex
		checked  bool
		problems []string
	)
	h.reports.setHook(func(r report) {
		if r.st.GetSentinelId() != s.Id || !healthyOn(imageV2)(r.st) {
			return
		}
		checkMu.Lock()
		defer checkMu.Unlock()
		if checked {
			return
		}
		checked = true
		pods, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: controller.LabelSentinel + "=" + s.Id})
		if err != nil {
			problems = append(problems, err.Error())
			return
		}
		running := 0
		for _, p := range pods.Items {
			if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
				continue
			}
			running++
			if img := p.Spec.Containers[0].Image; img != imageV2 || p.DeletionTimestamp != nil || !podReady(&p) {
				problems = append(problems, fmt.Sprintf("pod %s: image %s, terminating %v, ready %v", p.Name, img, p.DeletionTimestamp != nil, podReady(&p)))
			}
		}
		if running != 3 {
			problems = append(problems, fmt.Sprintf("%d pods running, want 3", running))
		}
	})
	s.Image = imageV2
	rollStart := time.Now()
	if r := h.apply(change(t, s, 102)); r != sdk.Applied {
		t.Fatalf("image change Apply = %s", r)
	}
	done := h.waitReport(s.Id, rollStart, 3*time.Minute, "HEALTHY on v2", healthyOn(imageV2))
	h.reports.setHook(nil)
	t.Logf("image change -> HEALTHY on %s: %s", imageV2, done.at.Sub(rollStart).Round(time.Millisecond))

	checkMu.Lock()
	if !checked {
		t.Error("the pod check at the first HEALTHY-on-v2 report did not run")
	}
	for _, p := range problems {
		t.Errorf("reported HEALTHY on %s while: %s", imageV2, p)
	}
	checkMu.Unlock()

	sawProgressing := false
	for _, r := range h.reports.of(s.Id, rollStart) {
		st := r.st
		t.Logf("  +%6s  v%d gen %d  %-16s updated %d available %d ready %d/%d  image %q  %s",
			r.at.Sub(rollStart).Round(10*time.Millisecond), r.version, st.ObservedGeneration, st.Health, st.UpdatedReplicas,
			st.AvailableReplicas, st.ReadyReplicas, st.DesiredReplicas, st.RunningImage, st.Reason)
		if st.RunningImage != "" && (st.UpdatedReplicas != 3 || st.AvailableReplicas != 3) {
			t.Errorf("running_image %q reported with %d updated, %d available of 3", st.RunningImage, st.UpdatedReplicas, st.AvailableReplicas)
		}
		if st.Health == clusterv1.Health_HEALTH_UNHEALTHY && strings.Contains(st.Reason, "progressing") {
			sawProgressing = true
			if st.RunningImage != "" {
				t.Errorf("progressing report names running image %q", st.RunningImage)
			}
		}
		if healthyOn(imageV2)(st) {
			break
		}
	}
	if !sawProgressing {
		t.Error("no report showed the rollout progressing before HEALTHY on v2")
	}
	if done.st.ObservedGeneration <= healthy.st.ObservedGeneration {
		t.Errorf("observed_generation %d after the rollout, %d before: want it to advance", done.st.ObservedGeneration, healthy.st.ObservedGeneration)
	}
	assertPodsSpread(t, c, s, 3, imageV2)

	// Delete removes all five objects, and the status says so.
	delStart := time.Now()
	h.delete(s.Id, 103)
	objectsGone(t, c, s.K8SName)
	gone := h.waitReport(s.Id, delStart, 10*time.Second, "deleted", func(st *clusterv1.SentinelStatus) bool { return st.Deleted })
	if gone.version != 103 {
		t.Errorf("deleted report at version %d, want 103", gone.version)
	}
	waitFor(t, 30*time.Second, "the sentinel's pods to go", func() (bool, error) {
		pods, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: controller.LabelSentinel + "=" + s.Id})
		return err == nil && len(pods.Items) == 0, err
	})
}

// assertObjects checks every specified field of the five objects of a
// sentinel applied with fullConfig.
func assertObjects(t *testing.T, c *kubeenv.Cluster, s *clusterv1.Sentinel, version uint64) *appsv1.Deployment {
	t.Helper()
	ctx := context.Background()
	wantLabels := map[string]string{
		"app.kubernetes.io/managed-by": "krane", "app.kubernetes.io/component": "sentinel",
		"unkey.com/workspace.id": s.WorkspaceId, "unkey.com/project.id": s.ProjectId, "unkey.com/app.id": s.AppId,
		"unkey.com/environment.id": s.EnvironmentId, "unkey.com/sentinel.id": s.Id,
	}
	checkMeta := func(kind string, m metav1.Object, owner *appsv1.Deployment) {
		t.Helper()
		for k, v := range wantLabels {
			if m.GetLabels()[k] != v {
				t.Errorf("%s %s: label %s = %q, want %q", kind, m.GetName(), k, m.GetLabels()[k], v)
			}
		}
		if kube.AppliedVersion(m.GetAnnotations()) != version || m.GetAnnotations()[kube.SpecHashAnnotation] == "" {
			t.Errorf("%s %s: annotations %v, want version %d and a spec hash", kind, m.GetName(), m.GetAnnotations(), version)
		}
		applied := false
		for _, mf := range m.GetManagedFields() {
			if mf.Manager == "krane" && mf.Operation == metav1.ManagedFieldsOperationApply {
				applied = true
			}
		}
		if !applied {
			t.Errorf("%s %s: not server-side applied by field manager krane", kind, m.GetName())
		}
		if owner != nil {
			refs := m.GetOwnerReferences()
			if len(refs) != 1 || refs[0].Kind != "Deployment" || refs[0].Name != owner.Name || refs[0].UID != owner.UID || refs[0].Controller == nil || !*refs[0].Controller {
				t.Errorf("%s %s: ownerReferences %v, want the Deployment %s (%s)", kind, m.GetName(), refs, owner.Name, owner.UID)
			}
		}
	}

	dep, err := c.Client.AppsV1().Deployments(ns).Get(ctx, s.K8SName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	checkMeta("Deployment", dep, nil)
	spec := dep.Spec
	if *spec.Replicas != s.Replicas || spec.MinReadySeconds != 5 || spec.Strategy.Type != appsv1.RollingUpdateDeploymentStrategyType ||
		spec.Strategy.RollingUpdate.MaxUnavailable.String() != "0" || spec.Strategy.RollingUpdate.MaxSurge.String() != "1" {
		t.Errorf("Deployment replicas %d minReady %d strategy %+v", *spec.Replicas, spec.MinReadySeconds, spec.Strategy)
	}
	if len(spec.Template.Annotations) != 0 {
		t.Errorf("pod template annotations %v: a version bump would roll the pods", spec.Template.Annotations)
	}
	for k, v := range wantLabels {
		if spec.Template.Labels[k] != v {
			t.Errorf("pod template label %s = %q", k, spec.Template.Labels[k])
		}
	}
	pod := spec.Template.Spec
	if len(pod.Tolerations) != 1 || pod.Tolerations[0] != (corev1.Toleration{Key: "node-class", Operator: corev1.TolerationOpEqual, Value: "sentinel", Effect: corev1.TaintEffectNoSchedule}) {
		t.Errorf("tolerations %+v", pod.Tolerations)
	}
	terms := pod.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	if len(terms) != 1 || terms[0].MatchExpressions[0].Key != "node-class" || terms[0].MatchExpressions[0].Operator != corev1.NodeSelectorOpIn || terms[0].MatchExpressions[0].Values[0] != "sentinel" {
		t.Errorf("node affinity %+v", terms)
	}
	if len(pod.TopologySpreadConstraints) != 1 {
		t.Fatalf("spread %+v", pod.TopologySpreadConstraints)
	}
	tsc := pod.TopologySpreadConstraints[0]
	if tsc.MaxSkew != 1 || tsc.TopologyKey != "topology.kubernetes.io/zone" || tsc.WhenUnsatisfiable != corev1.ScheduleAnyway || tsc.LabelSelector.MatchLabels["unkey.com/sentinel.id"] != s.Id {
		t.Errorf("spread %+v", tsc)
	}
	ctr := pod.Containers[0]
	if ctr.Name != "sentinel" || ctr.Image != s.Image {
		t.Errorf("container %s image %s", ctr.Name, ctr.Image)
	}
	ports := map[string]corev1.ContainerPort{}
	for _, p := range ctr.Ports {
		ports[p.Name] = p
	}
	if ports["http"].ContainerPort != 8040 || ports["gossip-tcp"].ContainerPort != 7946 || ports["gossip-tcp"].Protocol != corev1.ProtocolTCP ||
		ports["gossip-udp"].ContainerPort != 7946 || ports["gossip-udp"].Protocol != corev1.ProtocolUDP {
		t.Errorf("ports %+v", ctr.Ports)
	}
	for name, probe := range map[string]*corev1.Probe{"/_unkey/internal/health/live": ctr.LivenessProbe, "/_unkey/internal/health/ready": ctr.ReadinessProbe} {
		if probe == nil || probe.HTTPGet == nil || probe.HTTPGet.Path != name || probe.HTTPGet.Port.IntValue() != 8040 {
			t.Errorf("probe %s: %+v", name, probe)
		}
	}
	if ctr.Resources.Requests.Cpu().String() != "250m" || ctr.Resources.Limits.Cpu().String() != "250m" ||
		ctr.Resources.Requests.Memory().String() != "256Mi" || ctr.Resources.Limits.Memory().String() != "256Mi" {
		t.Errorf("resources %+v", ctr.Resources)
	}
	if len(ctr.EnvFrom) != 2 || ctr.EnvFrom[0].SecretRef.Name != "database" || ctr.EnvFrom[0].SecretRef.Optional != nil ||
		ctr.EnvFrom[1].SecretRef.Name != "redis" || !*ctr.EnvFrom[1].SecretRef.Optional {
		t.Errorf("envFrom %+v", ctr.EnvFrom)
	}

	svc, err := c.Client.CoreV1().Services(ns).Get(ctx, s.K8SName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	checkMeta("Service", svc, dep)
	if svc.Spec.Type != corev1.ServiceTypeClusterIP || svc.Spec.ClusterIP == "" || svc.Spec.ClusterIP == corev1.ClusterIPNone ||
		len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Port != 8040 || svc.Spec.Ports[0].TargetPort.String() != "http" ||
		svc.Spec.Selector["unkey.com/sentinel.id"] != s.Id {
		t.Errorf("Service spec %+v", svc.Spec)
	}

	pdb, err := c.Client.PolicyV1().PodDisruptionBudgets(ns).Get(ctx, s.K8SName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	checkMeta("PodDisruptionBudget", pdb, dep)
	wantPDB := "maxUnavailable=1"
	if s.Replicas <= 1 {
		wantPDB = "minAvailable=1"
	}
	gotPDB := ""
	if pdb.Spec.MinAvailable != nil {
		gotPDB += "minAvailable=" + pdb.Spec.MinAvailable.String()
	}
	if pdb.Spec.MaxUnavailable != nil {
		gotPDB += "maxUnavailable=" + pdb.Spec.MaxUnavailable.String()
	}
	if gotPDB != wantPDB || pdb.Spec.Selector.MatchLabels["unkey.com/sentinel.id"] != s.Id || *pdb.Spec.UnhealthyPodEvictionPolicy != "AlwaysAllow" {
		t.Errorf("PDB %s (want %s), spec %+v", gotPDB, wantPDB, pdb.Spec)
	}

	gossip, err := c.Client.CoreV1().Services(ns).Get(ctx, s.K8SName+"-gossip", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	checkMeta("gossip Service", gossip, dep)
	gs := gossip.Spec
	if gs.ClusterIP != corev1.ClusterIPNone || !gs.PublishNotReadyAddresses || gs.Selector["unkey.com/environment.id"] != s.EnvironmentId ||
		gs.Selector["unkey.com/sentinel.id"] != "" || len(gs.Ports) != 2 || gs.Ports[0].Port != 7946 || gs.Ports[0].Protocol != corev1.ProtocolTCP ||
		gs.Ports[1].Port != 7946 || gs.Ports[1].Protocol != corev1.ProtocolUDP {
		t.Errorf("gossip Service spec %+v", gs)
	}

	// The routes: what the sentinel process reads (hosts, live backend),
	// named in its environment, read as the pods' own account.
	routes, err := c.Client.CoreV1().ConfigMaps(ns).Get(ctx, s.K8SName+"-routes", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	checkMeta("routes ConfigMap", routes, dep)
	doc, err := sentinelroutes.Parse([]byte(routes.Data[controller.RoutesKey]))
	if err != nil {
		t.Fatalf("routes %q: %v", routes.Data[controller.RoutesKey], err)
	}
	if doc.SentinelID != s.Id || doc.EnvironmentID != s.EnvironmentId || doc.Version != version || !slices.Equal(doc.Hosts, s.GetRoutes().GetHosts()) {
		t.Errorf("routes %+v, want sentinel %s environment %s version %d hosts %v", doc, s.Id, s.EnvironmentId, version, s.GetRoutes().GetHosts())
	}
	if b := s.GetRoutes().GetBackend(); b != nil && (doc.Backend == nil || doc.Backend.DeploymentID != b.DeploymentId || doc.Backend.Namespace != b.K8SNamespace || doc.Backend.Service != b.K8SName || doc.Backend.Port != b.Port) {
		t.Errorf("routes backend %+v, want %v", doc.Backend, b)
	}
	env := map[string]string{}
	for _, e := range ctr.Env {
		env[e.Name] = e.Value
	}
	if env["KRANE_SENTINEL_ROUTES"] != ns+"/"+s.K8SName+"-routes" || env["KRANE_SENTINEL_ADMIN_ADDR"] != ":9091" || ports["admin"].ContainerPort != 9091 {
		t.Errorf("routes env %q admin %q port %+v", env["KRANE_SENTINEL_ROUTES"], env["KRANE_SENTINEL_ADMIN_ADDR"], ports["admin"])
	}
	if pod.ServiceAccountName != "krane-sentinel" || pod.AutomountServiceAccountToken == nil || !*pod.AutomountServiceAccountToken {
		t.Errorf("service account %q automount %v, want krane-sentinel with its token", pod.ServiceAccountName, pod.AutomountServiceAccountToken)
	}

	policy, err := c.Dynamic.Resource(controller.PolicyGVR).Namespace(ns).Get(ctx, s.K8SName+"-gossip", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	checkMeta("CiliumNetworkPolicy", policy, dep)
	assertPolicyRules(t, policy, s.EnvironmentId)
	return dep
}

func assertPolicyRules(t *testing.T, policy *unstructured.Unstructured, env string) {
	t.Helper()
	sel, _, _ := unstructured.NestedStringMap(policy.Object, "spec", "endpointSelector", "matchLabels")
	if sel["unkey.com/environment.id"] != env || sel["app.kubernetes.io/component"] != "sentinel" {
		t.Errorf("policy endpointSelector %v", sel)
	}
	if dd, _, _ := unstructured.NestedMap(policy.Object, "spec", "enableDefaultDeny"); dd["ingress"] != false || dd["egress"] != false {
		t.Errorf("policy enableDefaultDeny %v: the gossip policy must not put sentinels into default-deny", dd)
	}
	for _, dir := range []struct{ rules, peers string }{{"ingress", "fromEndpoints"}, {"egress", "toEndpoints"}} {
		rules, _, _ := unstructured.NestedSlice(policy.Object, "spec", dir.rules)
		if len(rules) != 1 {
			t.Errorf("policy %s rules: %v", dir.rules, rules)
			continue
		}
		rule := rules[0].(map[string]any)
		peers, _ := rule[dir.peers].([]any)
		if len(peers) != 1 || peers[0].(map[string]any)["matchLabels"].(map[string]any)["unkey.com/environment.id"] != env {
			t.Errorf("policy %s peers: %v", dir.rules, peers)
		}
		var got []string
		for _, tp := range rule["toPorts"].([]any) {
			for _, p := range tp.(map[string]any)["ports"].([]any) {
				pm := p.(map[string]any)
				got = append(got, fmt.Sprint(pm["port"], "/", pm["protocol"]))
			}
		}
		if strings.Join(got, ",") != "7946/TCP,7946/UDP" {
			t.Errorf("policy %s ports %v, want 7946/TCP and 7946/UDP", dir.rules, got)
		}
	}
}

// assertPodsSpread waits for n Running, Ready pods on image and checks they
// sit on sentinel nodes, one zone each.
func assertPodsSpread(t *testing.T, c *kubeenv.Cluster, s *clusterv1.Sentinel, n int, image string) {
	t.Helper()
	ctx := context.Background()
	var pods []corev1.Pod
	waitFor(t, 60*time.Second, fmt.Sprintf("%d ready pods on %s", n, image), func() (bool, error) {
		list, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: controller.LabelSentinel + "=" + s.Id})
		if err != nil {
			return false, err
		}
		pods = list.Items
		if len(pods) != n {
			return false, fmt.Errorf("%d pods", len(pods))
		}
		for _, p := range pods {
			if p.Status.Phase != corev1.PodRunning || !podReady(&p) || p.Spec.Containers[0].Image != image || p.DeletionTimestamp != nil {
				return false, fmt.Errorf("pod %s not yet running %s", p.Name, image)
			}
		}
		return true, nil
	})
	zones := map[string]bool{}
	for _, p := range pods {
		node, err := c.Client.CoreV1().Nodes().Get(ctx, p.Spec.NodeName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if node.Labels[kubeenv.LabelNodeClass] != kubeenv.NodeClassSentry {
			t.Errorf("pod %s on node %s of class %q, want a sentinel node", p.Name, node.Name, node.Labels[kubeenv.LabelNodeClass])
		}
		zones[node.Labels[kubeenv.LabelZone]] = true
	}
	if len(zones) != n {
		t.Errorf("%d pods in zones %v, want one per zone", n, zones)
	}
}

// assertGossipEndpoints checks that the gossip Service resolves to the pods.
func assertGossipEndpoints(t *testing.T, c *kubeenv.Cluster, s *clusterv1.Sentinel, n int) {
	t.Helper()
	ctx := context.Background()
	waitFor(t, 30*time.Second, "gossip endpoints", func() (bool, error) {
		slices, err := c.Client.DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + s.K8SName + "-gossip"})
		if err != nil {
			return false, err
		}
		addrs := 0
		for _, sl := range slices.Items {
			for _, ep := range sl.Endpoints {
				addrs += len(ep.Addresses)
			}
		}
		return addrs == n, fmt.Errorf("%d addresses", addrs)
	})
}

// podUIDs is the sorted UIDs of a sentinel's pods, as one string.
func podUIDs(t *testing.T, c *kubeenv.Cluster, id string) string {
	t.Helper()
	pods, err := c.Client.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{LabelSelector: controller.LabelSentinel + "=" + id})
	if err != nil {
		t.Fatal(err)
	}
	var uids []string
	for _, p := range pods.Items {
		uids = append(uids, string(p.UID))
	}
	slices.Sort(uids)
	return strings.Join(uids, ",")
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// 500 Applies of an unchanged sentinel make zero API writes.
func TestUnchangedAppliesMakeNoWrites(t *testing.T) {
	c := sharedCluster(t)
	h := start(t, c, `{"status_resync_interval":"1s"}`)
	s := sentinel("snt_quiet", "sentinel-quiet", "env_quiet", imageV1, 2)
	ch := change(t, s, 200)
	if r := h.apply(ch); r != sdk.Applied {
		t.Fatalf("first Apply = %s", r)
	}
	waitFor(t, 10*time.Second, "the caches to hold the applied objects", func() (bool, error) { return h.apply(ch) == sdk.Unchanged, nil })

	const n = 500
	writes, reads := h.calls.Writes(), h.calls.Reads()
	cpu, wall := cpuTime(t), time.Now()
	for i := range n {
		if r := h.apply(ch); r != sdk.Unchanged {
			t.Fatalf("unchanged Apply #%d = %s", i+1, r)
		}
	}
	cpu, elapsed := cpuTime(t)-cpu, time.Since(wall)
	dw, dr := h.calls.Writes()-writes, h.calls.Reads()-reads
	t.Logf("%d unchanged Applies: %d API writes, %d API reads, CPU %s (%s per Apply, host and plugin sides), wall %s",
		n, dw, dr, cpu.Round(time.Millisecond), (cpu / n).Round(time.Microsecond), elapsed.Round(time.Millisecond))
	if dw != 0 {
		t.Errorf("%d unchanged Applies made %d API writes, want 0", n, dw)
	}

	// Nothing changes, yet the status is sent again every
	// status_resync_interval, so a report lost on its way is not final.
	h.waitReport(s.Id, time.Time{}, time.Minute, "HEALTHY", healthyOn(imageV1))
	since := time.Now()
	waitFor(t, 30*time.Second, "3 re-sent reports", func() (bool, error) { return len(h.reports.of(s.Id, since)) >= 3, nil })
	resent := h.reports.of(s.Id, since)
	for i, r := range resent {
		if !healthyOn(imageV1)(r.st) || r.version != 200 {
			t.Errorf("re-sent report differs: v%d %v", r.version, r.st)
		}
		if i > 0 && r.at.Sub(resent[i-1].at) < 700*time.Millisecond {
			t.Errorf("reports %s apart with nothing changed and a 1s resync interval", r.at.Sub(resent[i-1].at))
		}
	}
	h.delete(s.Id, 201)
	objectsGone(t, c, s.K8SName)
}

// A field edited by hand on any of the five objects is taken back, and an
// object deleted by hand comes back.
func TestDriftIsCorrected(t *testing.T) {
	c := sharedCluster(t)
	h := start(t, c, `{}`)
	ctx := context.Background()
	s := sentinel("snt_drift", "sentinel-drift", "env_drift", imageV1, 2)
	ch := change(t, s, 300)
	h.apply(ch)
	waitFor(t, 10*time.Second, "unchanged", func() (bool, error) { return h.apply(ch) == sdk.Unchanged, nil })

	patch := func(res dynamic.ResourceInterface, name, body string) {
		t.Helper()
		if _, err := res.Patch(ctx, name, types.MergePatchType, []byte(body), metav1.PatchOptions{FieldManager: "someone"}); err != nil {
			t.Fatalf("patch %s: %v", name, err)
		}
	}
	gvr := func(group, version, resource string) dynamic.ResourceInterface {
		return c.Dynamic.Resource(schema.GroupVersionResource{Group: group, Version: version, Resource: resource}).Namespace(ns)
	}
	cases := []struct {
		what     string
		mutate   func()
		restored func() (bool, error)
	}{
		{"Deployment replicas", func() { patch(gvr("apps", "v1", "deployments"), s.K8SName, `{"spec":{"replicas":5}}`) }, func() (bool, error) {
			d, err := c.Client.AppsV1().Deployments(ns).Get(ctx, s.K8SName, metav1.GetOptions{})
			return err == nil && *d.Spec.Replicas == 2, err
		}},
		{"Service port", func() {
			patch(gvr("", "v1", "services"), s.K8SName, `{"spec":{"ports":[{"name":"http","port":9999,"targetPort":"http"}]}}`)
		}, func() (bool, error) {
			svc, err := c.Client.CoreV1().Services(ns).Get(ctx, s.K8SName, metav1.GetOptions{})
			return err == nil && len(svc.Spec.Ports) == 1 && svc.Spec.Ports[0].Port == 8040, err
		}},
		{"PodDisruptionBudget deleted", func() {
			if err := c.Client.PolicyV1().PodDisruptionBudgets(ns).Delete(ctx, s.K8SName, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
		}, func() (bool, error) {
			_, err := c.Client.PolicyV1().PodDisruptionBudgets(ns).Get(ctx, s.K8SName, metav1.GetOptions{})
			return err == nil, err
		}},
		{"gossip Service publishNotReadyAddresses", func() {
			patch(gvr("", "v1", "services"), s.K8SName+"-gossip", `{"spec":{"publishNotReadyAddresses":false}}`)
		}, func() (bool, error) {
			svc, err := c.Client.CoreV1().Services(ns).Get(ctx, s.K8SName+"-gossip", metav1.GetOptions{})
			return err == nil && svc.Spec.PublishNotReadyAddresses, err
		}},
		{"CiliumNetworkPolicy default deny", func() {
			patch(gvr("cilium.io", "v2", "ciliumnetworkpolicies"), s.K8SName+"-gossip", `{"spec":{"enableDefaultDeny":{"ingress":true}}}`)
		}, func() (bool, error) {
			p, err := c.Dynamic.Resource(controller.PolicyGVR).Namespace(ns).Get(ctx, s.K8SName+"-gossip", metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			v, _, _ := unstructured.NestedBool(p.Object, "spec", "enableDefaultDeny", "ingress")
			return !v, nil
		}},
	}
	for _, cs := range cases {
		cs.mutate()
		// The caches see the edit a moment later; Apply then re-applies.
		waitFor(t, 10*time.Second, cs.what+" drift to be re-applied", func() (bool, error) { return h.apply(ch) == sdk.Applied, nil })
		waitFor(t, 5*time.Second, cs.what+" restored", cs.restored)
		waitFor(t, 10*time.Second, "unchanged after correcting "+cs.what, func() (bool, error) { return h.apply(ch) == sdk.Unchanged, nil })
	}

	// Replicas 0 pauses the sentinel: objects stay, the status says PAUSED.
	s.Replicas = 0
	since := time.Now()
	if r := h.apply(change(t, s, 301)); r != sdk.Applied {
		t.Fatalf("scale to zero = %s", r)
	}
	h.waitReport(s.Id, since, 30*time.Second, "PAUSED", func(st *clusterv1.SentinelStatus) bool {
		return st.Health == clusterv1.Health_HEALTH_PAUSED && st.DesiredReplicas == 0
	})
	if _, err := c.Client.CoreV1().Services(ns).Get(ctx, s.K8SName, metav1.GetOptions{}); err != nil {
		t.Errorf("Service of a paused sentinel: %v", err)
	}
	h.delete(s.Id, 302)
	objectsGone(t, c, s.K8SName)
}

// A rollout to an image that crash-loops never reduces capacity (maxUnavailable
// 0), is reported with the reason, and recovers when the image is fixed.
func TestCrashLoopingRolloutReported(t *testing.T) {
	c := sharedCluster(t)
	h := start(t, c, `{}`)
	s := sentinel("snt_crash", "sentinel-crash", "env_crash", imageV1, 2)
	begin := time.Now()
	h.apply(change(t, s, 400))
	h.waitReport(s.Id, begin, 2*time.Minute, "HEALTHY on v1", healthyOn(imageV1))

	broken := "registry.example/unkey/kwok-crash-loop:v2"
	s.Image = broken
	since := time.Now()
	h.apply(change(t, s, 401))
	rep := h.waitReport(s.Id, since, time.Minute, "crash-looping", func(st *clusterv1.SentinelStatus) bool {
		return st.Health == clusterv1.Health_HEALTH_UNHEALTHY && strings.Contains(st.Reason, "crash-looping")
	})
	t.Logf("crash-looping rollout reported: %s", rep.st.Reason)
	time.Sleep(3 * time.Second) // let it stay broken a while
	for _, r := range h.reports.of(s.Id, since) {
		if r.st.RunningImage == broken || r.st.Health == clusterv1.Health_HEALTH_HEALTHY {
			t.Errorf("broken rollout reported %s on %q", r.st.Health, r.st.RunningImage)
		}
		if r.st.AvailableReplicas < 2 {
			t.Errorf("capacity dropped to %d available during a broken rollout", r.st.AvailableReplicas)
		}
	}

	s.Image = imageV1
	since = time.Now()
	h.apply(change(t, s, 402))
	h.waitReport(s.Id, since, 2*time.Minute, "HEALTHY on v1 again", healthyOn(imageV1))
	h.delete(s.Id, 403)
	objectsGone(t, c, s.K8SName)
}

// Without the CiliumNetworkPolicy CRD the other four objects are applied and
// the status says why the policy is missing; installing the CRD later
// converges without a restart.
func TestWithoutPolicyCRD(t *testing.T) {
	c := kubeenv.Start(t, kubeenv.Options{Name: "no-cilium", WithoutCiliumCRD: true, WorkerNodesPerZone: 1})
	h := start(t, c, `{}`, controller.WithDiscoveryInterval(500*time.Millisecond))
	ctx := context.Background()
	const missingLine = "CiliumNetworkPolicy CRD (cilium.io/v2) is not served by this cluster"
	if n := h.logs.count(missingLine); n != 1 {
		t.Errorf("%d log lines say the CRD is missing, want exactly 1", n)
	}

	s := sentinel("snt_nocrd", "sentinel-nocrd", "env_nocrd", imageV1, 2)
	ch := change(t, s, 500)
	begin := time.Now()
	if r := h.apply(ch); r != sdk.Applied {
		t.Fatalf("Apply = %s", r)
	}
	for what, get := range map[string]func() error{
		"Deployment": func() error {
			_, err := c.Client.AppsV1().Deployments(ns).Get(ctx, s.K8SName, metav1.GetOptions{})
			return err
		},
		"Service": func() error {
			_, err := c.Client.CoreV1().Services(ns).Get(ctx, s.K8SName, metav1.GetOptions{})
			return err
		},
		"PodDisruptionBudget": func() error {
			_, err := c.Client.PolicyV1().PodDisruptionBudgets(ns).Get(ctx, s.K8SName, metav1.GetOptions{})
			return err
		},
		"gossip Service": func() error {
			_, err := c.Client.CoreV1().Services(ns).Get(ctx, s.K8SName+"-gossip", metav1.GetOptions{})
			return err
		},
	} {
		if err := get(); err != nil {
			t.Errorf("%s not applied without the CRD: %v", what, err)
		}
	}
	rep := h.waitReport(s.Id, begin, 2*time.Minute, "the rollout complete and the policy reported missing", func(st *clusterv1.SentinelStatus) bool {
		return st.RunningImage == imageV1 && st.Health == clusterv1.Health_HEALTH_UNHEALTHY && strings.Contains(st.Reason, "CiliumNetworkPolicy CRD (cilium.io/v2) is not installed")
	})
	t.Logf("status without the CRD: %s: %s", rep.st.Health, rep.st.Reason)
	waitFor(t, 10*time.Second, "unchanged", func() (bool, error) { return h.apply(ch) == sdk.Unchanged, nil })
	if n := h.logs.count(missingLine); n != 1 {
		t.Errorf("after Applies, %d log lines say the CRD is missing, want still 1", n)
	}

	installed := time.Now()
	if err := c.InstallCiliumCRD(ctx); err != nil {
		t.Fatal(err)
	}
	healthy := h.waitReport(s.Id, installed, time.Minute, "HEALTHY once the CRD is served", healthyOn(imageV1))
	t.Logf("CRD installed -> HEALTHY: %s", healthy.at.Sub(installed).Round(time.Millisecond))
	policy, err := c.Dynamic.Resource(controller.PolicyGVR).Namespace(ns).Get(ctx, s.K8SName+"-gossip", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("policy after the CRD appeared: %v", err)
	}
	assertPolicyRules(t, policy, s.EnvironmentId)
	if kube.AppliedVersion(policy.GetAnnotations()) != 500 {
		t.Errorf("policy version annotation %v, want 500", policy.GetAnnotations())
	}
	if n := h.logs.count("CiliumNetworkPolicy CRD is now served"); n != 1 {
		t.Errorf("%d log lines say the CRD appeared, want 1", n)
	}
	// The next resync finds everything in place.
	waitFor(t, 10*time.Second, "unchanged with the policy", func() (bool, error) { return h.apply(ch) == sdk.Unchanged, nil })

	h.delete(s.Id, 501)
	objectsGone(t, c, s.K8SName)
}

// A sentinel renamed in ctrl moves to its new objects and leaves none under
// the old name; a k8s_name taken by another sentinel is refused.
func TestRenameAndNameCollision(t *testing.T) {
	c := sharedCluster(t)
	h := start(t, c, fullConfig)
	ctx := context.Background()
	s := sentinel("snt_move", "sentinel-old-name", "env_move", imageV1, 1)
	h.apply(change(t, s, 600))
	s.K8SName = "sentinel-new-name"
	if r := h.apply(change(t, s, 601)); r != sdk.Applied {
		t.Fatalf("rename Apply = %s", r)
	}
	objectsGone(t, c, "sentinel-old-name")
	assertObjects(t, c, s, 601)
	waitFor(t, 10*time.Second, "one inventory entry at the new version", func() (bool, error) {
		items, err := plugintest.Inventory(ctx, h.ctl, "sentinel")
		n := 0
		for _, it := range items {
			if it.ID == s.Id {
				n++
				if it.Version != 601 {
					return false, fmt.Errorf("version %d", it.Version)
				}
			}
		}
		return n == 1, err
	})

	other := sentinel("snt_squatter", s.K8SName, "env_other", imageV1, 1)
	_, err := plugintest.Apply(ctx, h.ctl, change(t, other, 602))
	var pe *sdk.PermanentError
	if !errors.As(err, &pe) || pe.Field != "k8s_name" || !strings.Contains(err.Error(), "snt_move") {
		t.Errorf("Apply of a sentinel onto another's k8s_name = %v, want a permanent k8s_name error naming snt_move", err)
	}
	h.delete(s.Id, 603)
	objectsGone(t, c, s.K8SName)
}

// TestPodsAccountIsCreated: the account sentinel pods run as is created by
// the plugin when it is missing (a namespace the manifests did not
// prepare, or an account deleted by hand): without it no pod could start.
func TestPodsAccountIsCreated(t *testing.T) {
	c := sharedCluster(t)
	ctx := context.Background()
	accounts := c.Client.CoreV1().ServiceAccounts(ns)
	if err := accounts.Delete(ctx, controller.DefaultServiceAccount, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	h := start(t, c, `{}`)
	s := sentinel("snt_account", "sentinel-account", "env_account", imageV1, 1)
	waitFor(t, 10*time.Second, "the cache to see the account gone", func() (bool, error) {
		return h.apply(change(t, s, 300)) == sdk.Applied, nil
	})
	sa, err := accounts.Get(ctx, controller.DefaultServiceAccount, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the pods' account was not created: %v", err)
	}
	if sa.Labels["app.kubernetes.io/managed-by"] != "krane" {
		t.Errorf("account labels %v, want Krane's", sa.Labels)
	}
	h.waitReport(s.Id, time.Time{}, 2*time.Minute, "HEALTHY: its pods started as the account", healthyOn(imageV1))
	h.delete(s.Id, 301)
	objectsGone(t, c, s.K8SName)
}
