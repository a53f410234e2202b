package check

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/distribution/reference"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"

	"krane.dev/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// repoRoot is the repository, seen from this package's directory.
const repoRoot = "../.."

// install is what the checks learn about one overlay: its objects, its
// components (nil when the overlay does not install them) and the
// connections their configuration makes.
type install struct {
	name    string
	dir     string // files the checks write (rendered config files), for the whole overlay's test
	o       *Objects
	ctrl    *ctrlInstall
	restate *restateInstall
	krane   *kraneInstall
	conns   []connection
}

// workDir makes a fresh directory for one component's files.
func (in *install) workDir(t *testing.T, what string) string {
	d, err := os.MkdirTemp(in.dir, what+"-")
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// connection is one component calling another, as its configuration
// says (a URL, an address list). A private one must be closed to
// everyone else.
type connection struct {
	what    string
	from    Workload
	to      Endpoint
	private bool
}

// TestOverlays renders every overlay under deploy/overlays, checks what can
// be checked from the objects and the programs' own configuration loaders,
// then installs it into a real API server (see cluster_test.go).
func TestOverlays(t *testing.T) {
	dirs, err := Overlays(filepath.Join(repoRoot, "deploy", "overlays"))
	if err != nil {
		t.Fatal(err)
	}
	if len(dirs) == 0 {
		t.Fatal("no overlay found under deploy/overlays")
	}
	for _, dir := range dirs {
		name, _ := filepath.Rel(filepath.Join(repoRoot, "deploy", "overlays"), dir)
		// "ha/cluster" runs as TestOverlays/ha-cluster: -run patterns split
		// at slashes.
		t.Run(strings.ReplaceAll(name, "/", "-"), func(t *testing.T) {
			rendered, err := Render(dir)
			if err != nil {
				t.Fatal(err)
			}
			o, err := Parse(rendered)
			if err != nil {
				t.Fatal(err)
			}
			in := &install{name: name, dir: t.TempDir(), o: o}
			t.Run("static", func(t *testing.T) { checkStatic(t, in) })
			if t.Failed() {
				t.Skip("not installing an overlay that fails its static checks")
			}
			if in.restate != nil {
				t.Run("restate-cluster", func(t *testing.T) { checkRestateCluster(t, in) })
			}
			t.Run("cluster", func(t *testing.T) { checkCluster(t, in) })
		})
	}
}

func checkStatic(t *testing.T, in *install) {
	o := in.o
	for ns, l := range o.Namespaces {
		if l["pod-security.kubernetes.io/enforce"] != "restricted" {
			t.Errorf("Namespace %s lacks the label pod-security.kubernetes.io/enforce=restricted: the API server would hold its pods to no standard", ns)
		}
	}
	checkImages(t, o)
	checkPodTemplates(t, o)
	checkSelectors(t, o)
	checkRBACObjects(t, o)
	checkSecretsDocumented(t, o)
	in.restate = checkRestate(t, in)
	in.ctrl = checkCtrl(t, in)
	in.krane = checkKrane(t, in)
	if in.ctrl == nil && in.restate == nil && in.krane == nil {
		t.Error("the overlay installs none of ctrl, Restate and krane")
	}
	checkNetwork(t, in)
}

// checkImages: every image is pinned (a tag other than latest, or a
// digest), so an overlay must set the images its base leaves bare; the
// Restate image is the version the tests run against.
func checkImages(t *testing.T, o *Objects) {
	for _, w := range o.Workloads {
		for _, c := range append(slices.Clone(w.Template.Spec.InitContainers), w.Template.Spec.Containers...) {
			ref, err := reference.ParseNormalizedNamed(c.Image)
			if err != nil {
				t.Errorf("%s, container %s: image %q: %v", w, c.Name, c.Image, err)
				continue
			}
			tagged, hasTag := ref.(reference.Tagged)
			_, hasDigest := ref.(reference.Digested)
			switch {
			case !hasTag && !hasDigest:
				t.Errorf("%s, container %s: image %q has no tag or digest: the overlay must set it (kustomize `images:`)", w, c.Name, c.Image)
			case hasTag && tagged.Tag() == "latest":
				t.Errorf("%s, container %s: image %q: pin a version, not latest", w, c.Name, c.Image)
			}
			if c.Name == "restate" && (!hasTag || tagged.Tag() != testenv.RestateVersion) {
				t.Errorf("%s: Restate image %q: want tag %s, the version the tests run against (internal/testenv, Makefile)", w, c.Image, testenv.RestateVersion)
			}
		}
	}
}

// checkPodTemplates: each pod gets no Service environment (the Services
// "ctrl" and "restate" would inject CTRL_* and RESTATE_* variables, where
// the programs read settings), mounts a token only when its ServiceAccount
// is bound to a role, sizes every container, has a readiness probe on a
// port it exposes, and names only objects the overlay creates (Secrets
// aside: see checkSecretsDocumented).
func checkPodTemplates(t *testing.T, o *Objects) {
	bound := map[string]bool{}
	for _, b := range o.RoleBindings {
		for _, s := range b.Subjects {
			bound[s.Namespace+"/"+s.Name] = true
		}
	}
	for _, b := range o.ClusterBindings {
		for _, s := range b.Subjects {
			bound[s.Namespace+"/"+s.Name] = true
		}
	}
	for _, w := range o.Workloads {
		spec := w.Template.Spec
		if spec.EnableServiceLinks == nil || *spec.EnableServiceLinks {
			t.Errorf("%s: set enableServiceLinks: false (Service variables would mix with the programs' settings)", w)
		}
		sa := spec.ServiceAccountName
		var account *corev1.ServiceAccount
		for i := range o.ServiceAccounts {
			if s := &o.ServiceAccounts[i]; s.Namespace == w.Namespace && s.Name == sa {
				account = s
			}
		}
		if sa == "" || account == nil {
			t.Errorf("%s: serviceAccountName %q names no ServiceAccount the overlay creates", w, sa)
			continue
		}
		automount := true
		for _, v := range []*bool{account.AutomountServiceAccountToken, spec.AutomountServiceAccountToken} {
			if v != nil {
				automount = *v
			}
		}
		switch {
		case bound[w.Namespace+"/"+sa] && !automount:
			t.Errorf("%s: ServiceAccount %s is bound to roles but its token is not mounted", w, sa)
		case !bound[w.Namespace+"/"+sa] && automount:
			t.Errorf("%s: ServiceAccount %s has no roles: set automountServiceAccountToken: false", w, sa)
		}
		var spreads []string
		for _, sc := range spec.TopologySpreadConstraints {
			if slices.Contains(spreads, sc.TopologyKey) {
				t.Errorf("%s: two topology spread constraints on %s (an overlay added one instead of replacing the base's?)", w, sc.TopologyKey)
			}
			spreads = append(spreads, sc.TopologyKey)
		}
		for _, c := range append(slices.Clone(spec.InitContainers), spec.Containers...) {
			r := c.Resources
			if r.Requests.Cpu().IsZero() || r.Requests.Memory().IsZero() || r.Limits.Memory().IsZero() {
				t.Errorf("%s, container %s: set CPU and memory requests and a memory limit", w, c.Name)
			}
		}
		for _, c := range spec.Containers {
			if c.ReadinessProbe == nil {
				t.Errorf("%s, container %s: no readiness probe", w, c.Name)
			}
			for what, p := range map[string]*corev1.Probe{"readiness": c.ReadinessProbe, "liveness": c.LivenessProbe, "startup": c.StartupProbe} {
				if p == nil || p.HTTPGet == nil {
					continue
				}
				if !exposes(c, p.HTTPGet.Port) {
					t.Errorf("%s, container %s: %s probe port %s is not a container port", w, c.Name, what, p.HTTPGet.Port.String())
				}
			}
		}
		for _, v := range spec.Volumes {
			if v.ConfigMap != nil {
				if _, ok := o.ConfigMap(w.Namespace, v.ConfigMap.Name); !ok {
					t.Errorf("%s: volume %s names ConfigMap %s, which the overlay does not create", w, v.Name, v.ConfigMap.Name)
				}
			}
		}
		for _, c := range spec.Containers {
			if _, err := o.PodEnv(w, c, podFields(w)); err != nil {
				t.Error(err)
			}
		}
	}
}

// podFields are the pod fields the checks give a container's environment:
// the first pod's name.
func podFields(w Workload) map[string]string {
	return map[string]string{"metadata.name": w.Name + "-0", "metadata.namespace": w.Namespace, "metadata.uid": "00000000-0000-0000-0000-000000000000"}
}

func exposes(c corev1.Container, port intstr.IntOrString) bool {
	for _, p := range c.Ports {
		if (port.Type == intstr.String && p.Name == port.StrVal) || (port.Type == intstr.Int && p.ContainerPort == port.IntVal) {
			return true
		}
	}
	return false
}

// checkSelectors: every Service leads to a workload's port, every
// workload of more than one replica has a PodDisruptionBudget that lets
// at most replicas-1 go at once, and every budget selects a workload.
func checkSelectors(t *testing.T, o *Objects) {
	for _, s := range o.Services {
		for _, p := range s.Spec.Ports {
			if _, _, err := o.resolveService(s.Namespace, s.Name, p.Port); err != nil {
				t.Error(err)
			}
		}
	}
	var pdbs []policyv1.PodDisruptionBudget
	for _, u := range o.All {
		if u.GetKind() == "PodDisruptionBudget" {
			if err := appendAs(u, &pdbs); err != nil {
				t.Fatal(err)
			}
		}
	}
	covered := map[string]bool{}
	for _, p := range pdbs {
		sel, err := metav1.LabelSelectorAsSelector(p.Spec.Selector)
		if err != nil {
			t.Errorf("PodDisruptionBudget %s/%s: %v", p.Namespace, p.Name, err)
			continue
		}
		n := 0
		for _, w := range o.Workloads {
			if w.Namespace == p.Namespace && sel.Matches(labels.Set(w.Template.Labels)) {
				n++
				covered[w.String()] = true
				if mu := p.Spec.MaxUnavailable; mu == nil || mu.Type != intstr.Int || (w.Replicas > 1 && mu.IntVal >= w.Replicas) {
					t.Errorf("PodDisruptionBudget %s/%s: want maxUnavailable below the %d replicas of %s", p.Namespace, p.Name, w.Replicas, w)
				}
			}
		}
		if n != 1 {
			t.Errorf("PodDisruptionBudget %s/%s selects %d workloads, want 1", p.Namespace, p.Name, n)
		}
	}
	for _, w := range o.Workloads {
		if w.Replicas > 1 && !covered[w.String()] {
			t.Errorf("%s: %d replicas and no PodDisruptionBudget", w, w.Replicas)
		}
	}
}

// checkRBACObjects: no wildcard in any rule, every binding's role and
// ServiceAccounts exist in the overlay.
func checkRBACObjects(t *testing.T, o *Objects) {
	for _, r := range o.ClusterRoles {
		noWildcards(t, "ClusterRole "+r.Name, r.Rules)
	}
	for _, r := range o.Roles {
		noWildcards(t, "Role "+r.Namespace+"/"+r.Name, r.Rules)
	}
	roleExists := func(ns, kind, name string) bool {
		for _, r := range o.ClusterRoles {
			if kind == "ClusterRole" && r.Name == name {
				return true
			}
		}
		for _, r := range o.Roles {
			if kind == "Role" && r.Namespace == ns && r.Name == name {
				return true
			}
		}
		return false
	}
	saExists := func(ns, name string) bool {
		for _, s := range o.ServiceAccounts {
			if s.Namespace == ns && s.Name == name {
				return true
			}
		}
		return false
	}
	check := func(what, ns string, ref rbacv1.RoleRef, subjects []rbacv1.Subject) {
		if !roleExists(ns, ref.Kind, ref.Name) {
			t.Errorf("%s: %s %s is not in the overlay", what, ref.Kind, ref.Name)
		}
		for _, s := range subjects {
			if s.Kind != "ServiceAccount" || !saExists(s.Namespace, s.Name) {
				t.Errorf("%s: subject %s %s/%s is not a ServiceAccount of the overlay", what, s.Kind, s.Namespace, s.Name)
			}
		}
	}
	for _, b := range o.RoleBindings {
		check("RoleBinding "+b.Namespace+"/"+b.Name, b.Namespace, b.RoleRef, b.Subjects)
	}
	for _, b := range o.ClusterBindings {
		check("ClusterRoleBinding "+b.Name, "", b.RoleRef, b.Subjects)
	}
}

func noWildcards(t *testing.T, what string, rules []rbacv1.PolicyRule) {
	for _, r := range rules {
		for _, list := range [][]string{r.APIGroups, r.Resources, r.Verbs, r.NonResourceURLs} {
			for _, v := range list {
				if v == "*" {
					t.Errorf("%s: a rule grants %q; name what the component uses", what, v)
				}
			}
		}
	}
}

// checkSecretsDocumented: the Secrets an install needs are created by
// hand, so docs/operating.md must name every one the pods reference.
func checkSecretsDocumented(t *testing.T, o *Objects) {
	doc, err := os.ReadFile(filepath.Join(repoRoot, "docs", "operating.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range secretsReferenced(o) {
		if !strings.Contains(string(doc), name) {
			t.Errorf("the pods use Secret %s, which docs/operating.md does not tell operators to create", name)
		}
	}
}

func secretsReferenced(o *Objects) []string {
	var names []string
	add := func(n string) {
		if !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	for _, w := range o.Workloads {
		for _, v := range w.Template.Spec.Volumes {
			if v.Secret != nil {
				add(v.Secret.SecretName)
			}
		}
		for _, c := range append(slices.Clone(w.Template.Spec.InitContainers), w.Template.Spec.Containers...) {
			for _, e := range c.Env {
				if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
					add(e.ValueFrom.SecretKeyRef.Name)
				}
			}
		}
	}
	return names
}

// sortedKinds orders objects for applying: what others refer to first.
func sortedKinds(all []*unstructured.Unstructured) []*unstructured.Unstructured {
	rank := func(kind string) int {
		order := []string{"Namespace", "CustomResourceDefinition", "ServiceAccount", "ClusterRole", "Role", "ClusterRoleBinding", "RoleBinding", "ConfigMap", "Secret", "Service"}
		if i := slices.Index(order, kind); i >= 0 {
			return i
		}
		return len(order)
	}
	out := slices.Clone(all)
	slices.SortStableFunc(out, func(a, b *unstructured.Unstructured) int { return rank(a.GetKind()) - rank(b.GetKind()) })
	return out
}
