package check

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"

	"krane.dev/host/config"
	"krane.dev/internal/testenv"
	"krane.dev/internal/testenv/kubeenv"
	sentinel "krane.dev/plugins/sentinel/controller"
)

// singleNode names the overlays made for a one-node cluster; the others
// are installed on two nodes per zone, in three zones.
var singleNode = map[string]bool{"demo": true}

// waitBound bounds every wait for the cluster to act: generous, for a
// loaded machine; the waits themselves poll a condition.
const waitBound = 3 * time.Minute

// checkCluster installs the overlay into a fresh Kubernetes control plane
// (kwok nodes) and checks that it runs and that each component holds
// exactly the permissions it needs.
func checkCluster(t *testing.T, in *install) {
	c := kubeenv.Start(t, kubeenv.Options{Name: "deploy-" + strings.ReplaceAll(in.name, "/", "-")})
	ctx := t.Context()
	addNodes(t, ctx, c, singleNode[in.name])
	provideStorage(t, ctx, c, in.o)
	applyAll(t, ctx, c, in.o)
	if t.Failed() {
		return
	}
	waitWorkloads(t, ctx, c, in.o)
	checkRBAC(t, ctx, c, in)
	if in.krane != nil {
		runKrane(t, ctx, c, in)
	}
}

// addNodes adds untainted nodes for the control plane and agents (the
// test cluster's own nodes are tainted for workloads and sentinels).
func addNodes(t *testing.T, ctx context.Context, c *kubeenv.Cluster, single bool) {
	zones, perZone := []string{"zone-a", "zone-b", "zone-c"}, 2
	if single {
		zones, perZone = zones[:1], 1
	}
	for _, z := range zones {
		for i := range perZone {
			if err := c.AddNode(ctx, fmt.Sprintf("system-%s-%d", z, i), z, "system"); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// provideStorage stands in for a cluster's volume provisioner: a default
// StorageClass and, for every claim the StatefulSets will make, a volume
// that satisfies it (kwok runs the pods; nothing is mounted).
func provideStorage(t *testing.T, ctx context.Context, c *kubeenv.Cluster, o *Objects) {
	mode := storagev1.VolumeBindingWaitForFirstConsumer
	sc := &storagev1.StorageClass{
		ObjectMeta:        metav1.ObjectMeta{Name: "standard", Annotations: map[string]string{"storageclass.kubernetes.io/is-default-class": "true"}},
		Provisioner:       "kubernetes.io/no-provisioner",
		VolumeBindingMode: &mode,
	}
	if _, err := c.Client.StorageV1().StorageClasses().Create(ctx, sc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, w := range o.Workloads {
		for _, claim := range w.Claims {
			for i := range w.Replicas {
				pv := &corev1.PersistentVolume{
					ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%s-%s-%d", w.Namespace, claim.Name, w.Name, i)},
					Spec: corev1.PersistentVolumeSpec{
						Capacity:               corev1.ResourceList{corev1.ResourceStorage: claim.Spec.Resources.Requests[corev1.ResourceStorage]},
						AccessModes:            claim.Spec.AccessModes,
						StorageClassName:       sc.Name,
						PersistentVolumeSource: corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/var/lib/krane-check/" + fmt.Sprint(i)}},
					},
				}
				if _, err := c.Client.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
}

// warnings collects what the API server warns about (deprecated APIs, pods
// the namespace's Pod Security level would refuse).
type warnings struct {
	mu  sync.Mutex
	got []string
}

func (w *warnings) HandleWarningHeader(_ int, _ string, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.got = append(w.got, text)
}

// applyAll server-side applies every object, as `kubectl apply
// --server-side` would, twice: the first must draw no warning, the
// second must change nothing (the manifests agree with the API server's
// defaults, so a re-apply is a no-op): the same generation for objects
// with a spec, the same resourceVersion for the others.
func applyAll(t *testing.T, ctx context.Context, c *kubeenv.Cluster, o *Objects) {
	cfg := rest.CopyConfig(c.Config)
	warned := &warnings{}
	cfg.WarningHandler = warned
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(c.Client.Discovery()))
	apply := func(obj *unstructured.Unstructured) (string, error) {
		gvk := obj.GroupVersionKind()
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			return "", fmt.Errorf("%s %s: %w", gvk.Kind, obj.GetName(), err)
		}
		var res dynamic.ResourceInterface = dyn.Resource(m.Resource)
		if m.Scope.Name() == meta.RESTScopeNameNamespace {
			res = dyn.Resource(m.Resource).Namespace(obj.GetNamespace())
		}
		data, err := obj.MarshalJSON()
		if err != nil {
			return "", err
		}
		force := true
		got, err := res.Patch(ctx, obj.GetName(), types.ApplyPatchType, data, metav1.PatchOptions{FieldManager: "krane-deploy-check", Force: &force})
		if err != nil {
			return "", fmt.Errorf("apply %s %s/%s: %w", gvk.Kind, obj.GetNamespace(), obj.GetName(), err)
		}
		if g := got.GetGeneration(); g > 0 {
			return fmt.Sprintf("generation %d", g), nil
		}
		return "resourceVersion " + got.GetResourceVersion(), nil
	}
	versions := map[string]string{}
	for _, obj := range sortedKinds(o.All) {
		v, err := apply(obj)
		if err != nil {
			t.Fatal(err)
		}
		versions[obj.GetKind()+"/"+obj.GetNamespace()+"/"+obj.GetName()] = v
	}
	for _, w := range warned.got {
		t.Errorf("the API server warned while applying: %s", w)
	}
	for _, obj := range sortedKinds(o.All) {
		id := obj.GetKind() + "/" + obj.GetNamespace() + "/" + obj.GetName()
		v, err := apply(obj)
		if err != nil {
			t.Fatal(err)
		}
		if v != versions[id] {
			t.Errorf("applying %s a second time changed it (%s, then %s): a field fights the API server's defaults", id, versions[id], v)
		}
	}
}

// waitWorkloads waits until every Deployment is available with all its
// replicas and every StatefulSet has all its pods ready: the pods passed
// admission (Pod Security), scheduling (spread, anti-affinity, volumes)
// and run on the simulated nodes.
func waitWorkloads(t *testing.T, ctx context.Context, c *kubeenv.Cluster, o *Objects) {
	ctx, cancel := context.WithTimeout(ctx, waitBound)
	defer cancel()
	for _, w := range o.Workloads {
		var last string
		for {
			ready, state, err := workloadReady(ctx, c.Client, w)
			if err == nil && ready {
				break
			}
			if err != nil {
				state = err.Error()
			}
			last = state
			select {
			case <-ctx.Done():
				t.Errorf("%s did not become ready within %s: %s\n%s", w, waitBound, last, describePods(c.Client, w.Namespace))
				return
			case <-time.After(250 * time.Millisecond):
			}
		}
	}
}

func workloadReady(ctx context.Context, c kubernetes.Interface, w Workload) (bool, string, error) {
	switch w.Kind {
	case "Deployment":
		d, err := c.AppsV1().Deployments(w.Namespace).Get(ctx, w.Name, metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		s := d.Status
		return s.ObservedGeneration >= d.Generation && s.UpdatedReplicas == w.Replicas && s.AvailableReplicas == w.Replicas,
			fmt.Sprintf("%d updated, %d available of %d", s.UpdatedReplicas, s.AvailableReplicas, w.Replicas), nil
	case "StatefulSet":
		st, err := c.AppsV1().StatefulSets(w.Namespace).Get(ctx, w.Name, metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		s := st.Status
		return s.ObservedGeneration >= st.Generation && s.ReadyReplicas == w.Replicas && s.UpdatedReplicas == w.Replicas,
			fmt.Sprintf("%d ready, %d updated of %d", s.ReadyReplicas, s.UpdatedReplicas, w.Replicas), nil
	}
	return false, "", fmt.Errorf("unknown workload kind %s", w.Kind)
}

// describePods says why pods are missing or not ready: each pod's phase
// and conditions, and the namespace's warning events.
func describePods(c kubernetes.Interface, ns string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var b strings.Builder
	pods, err := c.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err == nil {
		for _, p := range pods.Items {
			fmt.Fprintf(&b, "  pod %s on %q: %s", p.Name, p.Spec.NodeName, p.Status.Phase)
			for _, cond := range p.Status.Conditions {
				if cond.Status != corev1.ConditionTrue {
					fmt.Fprintf(&b, "; %s: %s %s", cond.Type, cond.Reason, cond.Message)
				}
			}
			b.WriteString("\n")
		}
	}
	events, err := c.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "type=Warning"})
	if err == nil {
		for _, e := range events.Items {
			fmt.Fprintf(&b, "  event %s/%s: %s: %s\n", e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Reason, e.Message)
		}
	}
	return b.String()
}

// identity is a ServiceAccount and the permissions its component's code
// uses (see the package documentation for where they come from).
type identity struct {
	namespace, name string
	uses            []Permission
	source          string
}

// checkRBAC proves each ServiceAccount's permissions with
// SubjectAccessReviews: every permission its code uses is allowed;
// everything its allowed set implies it must not do, a sample of
// dangerous permissions and the other components' permissions are
// denied; and the API server's own list of what it may do in each
// namespace (SelfSubjectRulesReview) holds nothing beyond what it uses and
// what every authenticated user may.
func checkRBAC(t *testing.T, ctx context.Context, c *kubeenv.Cluster, in *install) {
	runsAs := map[string]string{} // ServiceAccount -> the container of the pods running as it
	for _, w := range in.o.Workloads {
		runsAs[w.Namespace+"/"+w.Template.Spec.ServiceAccountName] = w.Template.Spec.Containers[0].Name
	}
	var ids []identity
	seen := map[string]bool{}
	add := func(sa corev1.ServiceAccount, plugin bool) {
		key := sa.Namespace + "/" + sa.Name
		if seen[key] {
			return
		}
		seen[key] = true
		id := identity{namespace: sa.Namespace, name: sa.Name}
		ctl, enabled := pluginRunsAs(in.krane, sa)
		switch {
		case runsAs[key] == "krane":
			uses, err := kraneUses(in.krane)
			if err != nil {
				t.Fatal(err)
			}
			id.uses, id.source = uses, "the host's leader-election Lease and the enabled plugins' tokens"
		case runsAs[key] == "ctrl":
			id.source = "ctrl links no Kubernetes client"
		case runsAs[key] == "restate":
			id.source = "Restate does not call the Kubernetes API"
		case sentinelPodsRunAs(in.krane, sa):
			uses, err := sentinelPodUses()
			if err != nil {
				t.Fatal(err)
			}
			id.uses, id.source = uses, "plugins/sentinel/pods.yaml: the sentinel plugin runs its sentinels' pods as this account"
		case enabled:
			uses, err := pluginUses(ctl.Name)
			if err != nil {
				t.Fatal(err)
			}
			id.uses, id.source = uses, "plugins/"+ctl.Name+"/rbac.yaml: krane runs the plugin as this account"
		case plugin:
			id.source = "the account of a plugin this overlay does not enable"
		default:
			id.source = "no pod of the overlay runs as it"
		}
		ids = append(ids, id)
	}
	plugins := pluginTestIdentities(t)
	for _, sa := range in.o.ServiceAccounts {
		add(sa, slices.ContainsFunc(plugins, func(p corev1.ServiceAccount) bool { return p.Namespace == sa.Namespace && p.Name == sa.Name }))
	}
	if in.krane != nil {
		for _, sa := range plugins {
			add(sa, true)
		}
	}
	var everyone []Permission
	for _, id := range ids {
		everyone = append(everyone, id.uses...)
	}
	namespaces := []string{"default", "kube-system"}
	for ns := range in.o.Namespaces {
		namespaces = append(namespaces, ns)
	}
	// What every authenticated user may do (discovery, reviewing its own
	// access): never a component's doing.
	baseline := map[string][]Permission{}
	var granted []Permission
	for _, ns := range namespaces {
		user, groups := ServiceAccountUser("krane-check-nobody", "nobody")
		perms, err := effective(ctx, c.Config, user, groups, ns)
		if err != nil {
			t.Fatal(err)
		}
		baseline[ns] = perms
		granted = append(granted, perms...)
	}
	checked := 0
	denied := map[string][]Permission{} // identity -> others' uses it was refused
	for _, id := range ids {
		user, groups := ServiceAccountUser(id.namespace, id.name)
		for _, p := range id.uses {
			ok, err := Allowed(ctx, c.Client, user, groups, p)
			if err != nil {
				t.Fatal(err)
			}
			checked++
			if !ok {
				t.Errorf("%s may not %s, which its code uses (%s)", user, p, id.source)
			}
		}
		must := slices.Concat(Negatives(id.uses), Dangerous, everyone)
		for _, p := range must {
			if Covers(id.uses, p) || Covers(granted, p) {
				continue
			}
			ok, err := Allowed(ctx, c.Client, user, groups, p)
			if err != nil {
				t.Fatal(err)
			}
			checked++
			if ok {
				t.Errorf("%s may %s, which it does not use (%s)", user, p, id.source)
			} else if slices.Contains(everyone, p) {
				denied[id.name] = append(denied[id.name], p)
			}
		}
		for _, ns := range namespaces {
			perms, err := effective(ctx, c.Config, user, groups, ns)
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range perms {
				if !Covers(id.uses, p) && !Covers(baseline[ns], p) {
					t.Errorf("%s may %s (the API server's rules for namespace %s), which it does not use (%s)", user, p, ns, id.source)
				}
			}
		}
	}
	t.Logf("%d SubjectAccessReviews for %d identities", checked, len(ids))
	if in.krane != nil {
		checkPluginSeparation(t, ctx, c, in.krane, denied)
	}
}

// mustBeSeparate names, per built-in plugin, what another plugin needs and
// it must never hold: the reason each plugin runs as its own account. The
// reviews above refuse each of these already (every component's uses are
// denied to the others); naming them keeps the separation from resting on
// how the roles happen to differ today.
var mustBeSeparate = map[string][]Permission{
	"deployment": {
		{Verb: "create", Group: "cilium.io", Resource: "ciliumnetworkpolicies"},
		{Verb: "create", Group: "apps", Resource: "deployments"},
	},
	"sentinel": {
		{Verb: "create", Group: "apps", Resource: "replicasets"},
		{Verb: "list", Resource: "nodes"},
		{Verb: "delete", Resource: "namespaces"},
	},
	"cilium": {
		{Verb: "list", Resource: "secrets"},
		{Verb: "list", Resource: "secrets", Namespace: "ws-check"},
		{Verb: "watch", Resource: "secrets"},
		{Verb: "list", Resource: "pods"},
		{Verb: "create", Group: "apps", Resource: "replicasets"},
	},
}

// checkPluginSeparation asks, for each enabled plugin's account, that
// what only another plugin needs is denied (mustBeSeparate), and logs what
// each account was refused of the other components' uses.
func checkPluginSeparation(t *testing.T, ctx context.Context, c *kubeenv.Cluster, k *kraneInstall, denied map[string][]Permission) {
	ns := k.cfg.Kubernetes.PluginIdentities.Namespace
	for _, ctl := range k.cfg.Enabled() {
		user, groups := ServiceAccountUser(ns, ctl.ServiceAccount)
		refused := denied[ctl.ServiceAccount]
		for _, p := range mustBeSeparate[ctl.Name] {
			ok, err := Allowed(ctx, c.Client, user, groups, p)
			if err != nil {
				t.Fatal(err)
			}
			if ok {
				t.Errorf("%s may %s, which only another plugin needs", user, p)
				continue
			}
			refused = append(refused, p)
		}
		var names []string
		for _, p := range refused {
			names = append(names, p.String())
		}
		slices.Sort(names)
		names = slices.Compact(names)
		t.Logf("plugin %s runs as %s, which is denied %d permissions only other components use: %s", ctl.Name, user, len(names), strings.Join(names, "; "))
	}
}

// effective lists what user may do in namespace, as the API server's rule
// resolver sees it (a SelfSubjectRulesReview made as that user).
func effective(ctx context.Context, admin *rest.Config, user string, groups []string, namespace string) ([]Permission, error) {
	cfg := rest.CopyConfig(admin)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: groups}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	r, err := cs.AuthorizationV1().SelfSubjectRulesReviews().Create(ctx, &authorizationv1.SelfSubjectRulesReview{Spec: authorizationv1.SelfSubjectRulesReviewSpec{Namespace: namespace}}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("SelfSubjectRulesReview as %s in %s: %w", user, namespace, err)
	}
	if r.Status.Incomplete {
		return nil, fmt.Errorf("SelfSubjectRulesReview as %s in %s is incomplete: %s", user, namespace, r.Status.EvaluationError)
	}
	var out []Permission
	for _, rr := range r.Status.ResourceRules {
		out = append(out, Expand([]rbacv1.PolicyRule{{Verbs: rr.Verbs, APIGroups: rr.APIGroups, Resources: rr.Resources, ResourceNames: rr.ResourceNames}}, namespace)...)
	}
	for _, nr := range r.Status.NonResourceRules {
		out = append(out, Expand([]rbacv1.PolicyRule{{Verbs: nr.Verbs, NonResourceURLs: nr.NonResourceURLs}}, "")...)
	}
	return out, nil
}

// leaseUses is what client-go's LeaseLock, the host's leader election,
// does with the Lease: read it, create it, update it (renew, release).
var leaseUses = []rbacv1.PolicyRule{{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"get", "create", "update"}}}

// kraneUses is what the host's own code uses: the leader-election Lease
// in leader_election.namespace when leader election is on, and a token of
// each enabled plugin's ServiceAccount (TokenRequest), by name.
func kraneUses(k *kraneInstall) ([]Permission, error) {
	var out []Permission
	if pi := k.cfg.Kubernetes.PluginIdentities; pi.Enabled {
		for _, ctl := range k.cfg.Enabled() {
			out = append(out, Permission{Verb: "create", Resource: "serviceaccounts", Subresource: "token", Name: ctl.ServiceAccount, Namespace: pi.Namespace})
		}
		// The Secret the plugins' tokens are bound to (the manifests give
		// krane its pod's name and uid).
		if k.cfg.Kubernetes.PluginIdentities.PodName != "" {
			out = append(out, Permission{Verb: "create", Resource: "secrets", Namespace: pi.Namespace})
		}
	} else {
		for _, ctl := range k.cfg.Enabled() {
			uses, err := pluginUses(ctl.Name)
			if err != nil {
				return nil, err
			}
			out = append(out, uses...)
		}
	}
	if k.cfg.Leader.Enabled {
		out = append(out, Expand(leaseUses, k.cfg.Leader.Namespace)...)
	}
	return out, nil
}

// pluginUses is what a built-in plugin's code uses: the ClusterRole of its
// plugins/NAME/rbac.yaml (cluster-wide), exact because the plugin's own
// integration tests run under it.
func pluginUses(name string) ([]Permission, error) {
	out, clusterRoles, err := manifestUses(filepath.Join("plugins", name, "rbac.yaml"))
	if err == nil && clusterRoles == 0 {
		err = fmt.Errorf("plugins/%s/rbac.yaml holds no ClusterRole", name)
	}
	return out, err
}

// manifestUses are the rules of a manifest's roles, where they reach: a
// ClusterRole's everywhere, a Role's in its namespace (the host's
// krane-token-NAME Roles, which are not the plugin's, left out). It also
// counts the ClusterRoles.
func manifestUses(rel string) (out []Permission, clusterRoles int, err error) {
	objs, err := readManifest(filepath.Join(repoRoot, rel))
	if err != nil {
		return nil, 0, err
	}
	for _, u := range objs {
		switch u.GetKind() {
		case "ClusterRole":
			var r rbacv1.ClusterRole
			if err := convert(u, &r); err != nil {
				return nil, 0, err
			}
			out = append(out, Expand(r.Rules, "")...)
			clusterRoles++
		case "Role":
			var r rbacv1.Role
			if err := convert(u, &r); err != nil {
				return nil, 0, err
			}
			if !strings.HasPrefix(r.Name, "krane-token-") {
				out = append(out, Expand(r.Rules, r.Namespace)...)
			}
		}
	}
	return out, clusterRoles, nil
}

// sentinelPodsRunAs reports whether sa is the account the enabled sentinel
// plugin runs sentinel pods as (its default namespace and service_account,
// the names plugins/sentinel/pods.yaml uses).
func sentinelPodsRunAs(k *kraneInstall, sa corev1.ServiceAccount) bool {
	if k == nil || sa.Namespace != sentinel.DefaultNamespace || sa.Name != sentinel.DefaultServiceAccount {
		return false
	}
	for _, ctl := range k.cfg.Enabled() {
		if ctl.Name == "sentinel" {
			return true
		}
	}
	return false
}

// sentinelPodUses are the rules plugins/sentinel/pods.yaml grants the
// sentinel pods: what the sentinel process reads (its e2e runs it as that
// account), cluster-wide (ClusterRole) and in its namespace (Role).
func sentinelPodUses() ([]Permission, error) {
	out, _, err := manifestUses(filepath.Join("plugins", "sentinel", "pods.yaml"))
	return out, err
}

// pluginRunsAs reports which enabled controller of the overlay's krane.hcl
// runs as ServiceAccount sa, if any.
func pluginRunsAs(k *kraneInstall, sa corev1.ServiceAccount) (config.Controller, bool) {
	if k == nil || !k.cfg.Kubernetes.PluginIdentities.Enabled || sa.Namespace != k.cfg.Kubernetes.PluginIdentities.Namespace {
		return config.Controller{}, false
	}
	for _, ctl := range k.cfg.Enabled() {
		if ctl.ServiceAccount == sa.Name {
			return ctl, true
		}
	}
	return config.Controller{}, false
}

// pluginTestIdentities are the ServiceAccounts the plugins' rbac.yaml
// files create: the accounts krane runs them as, which their own tests
// also run as.
func pluginTestIdentities(t *testing.T) []corev1.ServiceAccount {
	files, err := filepath.Glob(filepath.Join(repoRoot, "plugins", "*", "rbac.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var out []corev1.ServiceAccount
	for _, f := range files {
		objs, err := readManifest(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, u := range objs {
			if u.GetKind() == "ServiceAccount" {
				if err := appendAs(u, &out); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	return out
}

func readManifest(path string) ([]*unstructured.Unstructured, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var out []*unstructured.Unstructured
	for {
		var obj map[string]any
		if err := dec.Decode(&obj); err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if len(obj) > 0 {
			out = append(out, &unstructured.Unstructured{Object: obj})
		}
	}
}

// runKrane runs the real krane host as the overlay's krane
// ServiceAccount, with the overlay's krane.hcl and environment (ctrl's
// address and the pod's paths aside); the host requests each enabled
// plugin's tokens and runs it as its own account. The host must win the
// Lease, every plugin must configure itself (discovery, its checks, its
// informers' first list), nothing may be refused by the API server, and
// stopping must release the Lease.
func runKrane(t *testing.T, ctx context.Context, c *kubeenv.Cluster, in *install) {
	k := in.krane
	bin := func(pkg, name string) string {
		if dir := os.Getenv("KRANE_BIN_DIR"); dir != "" {
			p := filepath.Join(dir, name)
			if _, err := os.Stat(p); err != nil {
				t.Fatalf("%s not found in KRANE_BIN_DIR %s: run `make build`", name, dir)
			}
			return p
		}
		p, err := testenv.BuildBinary(pkg, name)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	krane := bin("krane.dev/cmd/krane", "krane")
	pluginDir := t.TempDir()
	for _, ctl := range k.cfg.Enabled() {
		name := "krane-plugin-" + ctl.Name
		if err := os.Symlink(bin("krane.dev/plugins/"+ctl.Name, name), filepath.Join(pluginDir, name)); err != nil {
			t.Fatal(err)
		}
	}
	_, kubeconfig, err := c.ServiceAccountConfig(ctx, k.w.Namespace, k.w.Template.Spec.ServiceAccountName)
	if err != nil {
		t.Fatal(err)
	}
	ports, err := testenv.FreePorts(2)
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{}
	for name, v := range k.env {
		env[name] = v
	}
	identity := "deploy-check"
	for name, v := range map[string]string{
		"KRANE_KUBERNETES__KUBECONFIG":    kubeconfig,
		"KRANE_PLUGIN_DIR":                pluginDir,
		"KRANE_SERVER__LISTEN":            fmt.Sprintf("127.0.0.1:%d", ports[0]),
		"KRANE_CONTROL_PLANE__URL":        fmt.Sprintf("http://127.0.0.1:%d", ports[1]), // nobody listens: ctrl is not part of this check
		"KRANE_LEADER_ELECTION__IDENTITY": identity,
		"TMPDIR":                          t.TempDir(),
	} {
		env[name] = v
	}
	if te := k.cfg.ControlPlane.TokenEnv; te != "" {
		env[te] = "deploy-check-token"
	}
	// The plugins' tokens are bound to a Secret krane's pod owns: the pod
	// must exist (a process here stands in for it; the node is never
	// there, so nothing runs it).
	if env["KRANE_KUBERNETES__PLUGIN_IDENTITIES__POD_NAME"] != "" {
		spec := k.w.Template.Spec.DeepCopy()
		spec.NodeName = "deploy-check-no-node"
		pod, err := c.Client.CoreV1().Pods(k.w.Namespace).Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{GenerateName: "krane-deploy-check-", Namespace: k.w.Namespace},
			Spec:       *spec,
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		env["KRANE_KUBERNETES__PLUGIN_IDENTITIES__POD_NAME"], env["KRANE_KUBERNETES__PLUGIN_IDENTITIES__POD_UID"] = pod.Name, string(pod.UID)
	}
	var environ []string
	for name, v := range env {
		environ = append(environ, name+"="+v)
	}
	validate := exec.CommandContext(ctx, krane, "validate", "-c", k.hclPath)
	validate.Env = append(os.Environ(), environ...)
	if out, err := validate.CombinedOutput(); err != nil {
		t.Errorf("krane validate refuses the overlay's krane.hcl (%v):\n%s", err, out)
	}
	dir := t.TempDir()
	p, err := testenv.StartProcess(dir, "krane", krane, []string{"run", "-c", k.hclPath}, environ)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{}
	if k.cfg.Leader.Enabled {
		want = append(want, "krane_host_leader 1")
	}
	for _, ctl := range k.cfg.Enabled() {
		want = append(want, fmt.Sprintf("krane_host_plugin_up{controller=%q} 1", ctl.Name))
	}
	waitCtx, cancel := context.WithTimeout(ctx, waitBound)
	defer cancel()
	var missing []string
	for {
		missing = missingMetrics(waitCtx, fmt.Sprintf("http://127.0.0.1:%d/metrics", ports[0]), want)
		if len(missing) == 0 {
			break
		}
		select {
		case <-p.Done():
			t.Fatalf("krane exited while starting:\n%s", p.Tail(30))
		case <-waitCtx.Done():
			t.Fatalf("krane, as the overlay's ServiceAccount, did not get to %v within %s:\n%s", missing, waitBound, p.Tail(30))
		case <-time.After(250 * time.Millisecond):
		}
	}
	p.Stop(30 * time.Second)
	if k.cfg.Leader.Enabled {
		lease, err := c.Client.CoordinationV1().Leases(k.cfg.Leader.Namespace).Get(ctx, k.cfg.Leader.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			t.Errorf("krane held the Lease %s/%s, but it does not exist", k.cfg.Leader.Namespace, k.cfg.Leader.Name)
		case err != nil:
			t.Fatal(err)
		case lease.Spec.HolderIdentity != nil && *lease.Spec.HolderIdentity == identity:
			t.Errorf("krane did not release the Lease %s/%s when stopped (update refused?)", k.cfg.Leader.Namespace, k.cfg.Leader.Name)
		}
	}
	log, err := os.ReadFile(p.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(log)) {
		if strings.Contains(strings.ToLower(line), "forbidden") {
			t.Errorf("the API server refused krane something: %s", strings.TrimSpace(line))
		}
	}
}

// missingMetrics returns the lines of want that url's metrics do not
// contain (all of them while it does not answer).
func missingMetrics(ctx context.Context, url string, want []string) []string {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return want
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return want
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return want
	}
	var missing []string
	for _, w := range want {
		if !slices.Contains(strings.Split(string(body), "\n"), w) {
			missing = append(missing, w)
		}
	}
	return missing
}
