package plugintest

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"krane.dev/sdk"
	"krane.dev/sdk/kube"
)

// RBACGrants fails the test unless the ClusterRoles of the manifest at
// path (the rbac.yaml a plugin ships) grant every permission the plugin
// declares, so the two cannot drift apart.
func RBACGrants(t testing.TB, path string, perms []sdk.Permission) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var rules []rbacv1.PolicyRule
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		var role rbacv1.ClusterRole
		if err := dec.Decode(&role); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if role.Kind == "ClusterRole" {
			rules = append(rules, role.Rules...)
		}
	}
	for _, m := range kube.Uncovered(rules, perms) {
		t.Errorf("%s does not grant what the plugin declares it needs: %s", path, m)
	}
}

// RBACGrantsOnly is RBACGrants in both directions, namespaces included:
// the manifest at path must grant the plugin's ServiceAccount (the one it
// defines) every permission the plugin declares, and nothing beyond them.
// A rule reaches as far as its binding: a ClusterRoleBinding grants its
// role in every namespace, a RoleBinding in its own. So a permission the
// plugin declares in one namespace but the manifest binds cluster-wide is
// reported, as is any verb, resource or name the plugin does not declare.
// Non-resource URLs (discovery) are not checked. Roles bound to other
// subjects (the host's right to request the plugin's tokens) are ignored.
func RBACGrantsOnly(t testing.TB, path string, perms []sdk.Permission) {
	t.Helper()
	grants, err := manifestGrants(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range perms {
		for _, verb := range p.Verbs {
			if !slices.ContainsFunc(grants, func(g grant) bool { return g.covers(p, verb) }) {
				t.Errorf("%s does not grant what the plugin declares it needs: %s", path, kube.Missing{Verb: verb, Group: p.Group, Resource: p.Resource, Namespace: p.Namespace, Name: p.Name})
			}
		}
	}
	for _, g := range grants {
		for _, e := range g.expand() {
			if !slices.ContainsFunc(perms, func(p sdk.Permission) bool { return e.within(p) }) {
				t.Errorf("%s grants more than the plugin declares: %s (%s); grant it only where the plugin declares it, or declare it", path, e, g.source)
			}
		}
	}
}

// grant is one rule of a role as bound to the plugin's account: namespace
// "" when bound cluster-wide.
type grant struct {
	rule      rbacv1.PolicyRule
	namespace string
	source    string
}

// covers reports whether the grant allows verb of p.
func (g grant) covers(p sdk.Permission, verb string) bool {
	has := func(list []string, v string) bool { return slices.Contains(list, v) || slices.Contains(list, "*") }
	if g.namespace != "" && g.namespace != p.Namespace {
		return false
	}
	return has(g.rule.APIGroups, p.Group) && has(g.rule.Resources, p.Resource) && has(g.rule.Verbs, verb) &&
		(len(g.rule.ResourceNames) == 0 || p.Name != "" && slices.Contains(g.rule.ResourceNames, p.Name))
}

// granted is one verb on one resource (one name, or all) in one namespace
// (or all).
type granted struct {
	group, resource, verb, namespace, name string
}

func (e granted) String() string {
	s := e.verb + " " + e.resource
	if e.group != "" {
		s += "." + e.group
	}
	if e.name != "" {
		s += " " + e.name
	}
	if e.namespace == "" {
		return s + " in every namespace"
	}
	return s + " in namespace " + e.namespace
}

// within reports whether a declared permission allows all of e.
func (e granted) within(p sdk.Permission) bool {
	return p.Group == e.group && p.Resource == e.resource && slices.Contains(p.Verbs, e.verb) &&
		(p.Namespace == "" || p.Namespace == e.namespace && e.namespace != "") &&
		(p.Name == "" || p.Name == e.name && e.name != "")
}

func (g grant) expand() []granted {
	var out []granted
	names := g.rule.ResourceNames
	if len(names) == 0 {
		names = []string{""}
	}
	for _, group := range g.rule.APIGroups {
		for _, res := range g.rule.Resources {
			for _, verb := range g.rule.Verbs {
				for _, name := range names {
					out = append(out, granted{group: group, resource: res, verb: verb, namespace: g.namespace, name: name})
				}
			}
		}
	}
	return out
}

// manifestGrants reads a manifest's roles and bindings and returns the
// rules bound to the ServiceAccounts it defines, each with its reach.
func manifestGrants(path string) ([]grant, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	type object struct {
		metav1.TypeMeta   `json:",inline"`
		metav1.ObjectMeta `json:"metadata"`
		Rules             []rbacv1.PolicyRule `json:"rules"`
		RoleRef           rbacv1.RoleRef      `json:"roleRef"`
		Subjects          []rbacv1.Subject    `json:"subjects"`
	}
	var objs []object
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		var o object
		if err := dec.Decode(&o); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		objs = append(objs, o)
	}
	accounts := map[string]bool{}
	for _, o := range objs {
		if o.Kind == "ServiceAccount" {
			accounts[o.Namespace+"/"+o.Name] = true
		}
	}
	if len(accounts) == 0 {
		return nil, fmt.Errorf("%s defines no ServiceAccount: it must define the plugin's", path)
	}
	role := func(kind, namespace, name string) *object {
		for i, o := range objs {
			if o.Kind == kind && o.Name == name && (kind == "ClusterRole" || o.Namespace == namespace) {
				return &objs[i]
			}
		}
		return nil
	}
	var out []grant
	for _, b := range objs {
		if b.Kind != "ClusterRoleBinding" && b.Kind != "RoleBinding" {
			continue
		}
		if !slices.ContainsFunc(b.Subjects, func(s rbacv1.Subject) bool {
			return s.Kind == "ServiceAccount" && accounts[s.Namespace+"/"+s.Name]
		}) {
			continue
		}
		r := role(b.RoleRef.Kind, b.Namespace, b.RoleRef.Name)
		if r == nil {
			return nil, fmt.Errorf("%s: %s %s binds %s %s, which the file does not define", path, b.Kind, b.Name, b.RoleRef.Kind, b.RoleRef.Name)
		}
		ns := ""
		if b.Kind == "RoleBinding" {
			ns = b.Namespace
		}
		for _, rule := range r.Rules {
			if len(rule.NonResourceURLs) > 0 {
				continue
			}
			out = append(out, grant{rule: rule, namespace: ns, source: fmt.Sprintf("%s %s via %s %s", r.Kind, r.Name, b.Kind, b.Name)})
		}
	}
	return out, nil
}
