package check

import (
	"context"
	"fmt"
	"slices"
	"strings"

	authorizationv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Permission is one kind of request to the API server, as a
// SubjectAccessReview asks about it: a verb on a resource (optionally a
// subresource and one object's name) in a namespace ("" means every
// namespace, or a cluster-scoped resource), or a verb on a non-resource
// URL path.
type Permission struct {
	Verb        string
	Group       string
	Resource    string
	Subresource string
	Name        string
	Namespace   string
	Path        string
}

func (p Permission) String() string {
	if p.Path != "" {
		return p.Verb + " " + p.Path
	}
	res := p.Resource
	if p.Group != "" {
		res += "." + p.Group
	}
	if p.Subresource != "" {
		res += "/" + p.Subresource
	}
	if p.Name != "" {
		res += " " + p.Name
	}
	where := "in every namespace"
	if p.Namespace != "" {
		where = "in namespace " + p.Namespace
	}
	return p.Verb + " " + res + " " + where
}

// Expand turns RBAC rules into the permissions they grant, one per verb,
// API group, resource and name; namespace is where they apply ("" for a
// ClusterRole bound by a ClusterRoleBinding).
func Expand(rules []rbacv1.PolicyRule, namespace string) []Permission {
	var out []Permission
	for _, r := range rules {
		for _, v := range r.Verbs {
			for _, path := range r.NonResourceURLs {
				out = append(out, Permission{Verb: v, Path: path})
			}
			for _, g := range r.APIGroups {
				for _, res := range r.Resources {
					resource, sub, _ := strings.Cut(res, "/")
					names := r.ResourceNames
					if len(names) == 0 {
						names = []string{""}
					}
					for _, n := range names {
						out = append(out, Permission{Verb: v, Group: g, Resource: resource, Subresource: sub, Name: n, Namespace: namespace})
					}
				}
			}
		}
	}
	return out
}

// Covers reports whether p is among the granted permissions: the same
// request, or one a granted permission includes (a grant in every
// namespace covers each namespace; a grant without a name covers every
// name; a path ending in "*" covers the paths below it).
func Covers(granted []Permission, p Permission) bool {
	for _, g := range granted {
		if g.Verb != p.Verb && g.Verb != "*" {
			continue
		}
		if p.Path != "" || g.Path != "" {
			if g.Path == p.Path || (strings.HasSuffix(g.Path, "*") && strings.HasPrefix(p.Path, strings.TrimSuffix(g.Path, "*"))) {
				return true
			}
			continue
		}
		if (g.Group == p.Group || g.Group == "*") && (g.Resource == p.Resource || g.Resource == "*") &&
			g.Subresource == p.Subresource && (g.Name == "" || g.Name == p.Name) &&
			(g.Namespace == "" || g.Namespace == p.Namespace) {
			return true
		}
	}
	return false
}

// standardVerbs are the verbs of a resource's REST API.
var standardVerbs = []string{"get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"}

// Negatives derives what must be denied from what is allowed: on every
// resource the allowed permissions name, each standard verb none of them
// grants; each permission limited to one name, on another name; each
// permission limited to one namespace, in another namespace.
func Negatives(allowed []Permission) []Permission {
	type key struct{ group, resource, sub, ns string }
	verbs := map[key][]string{}
	var order []key
	var out []Permission
	for _, p := range allowed {
		if p.Path != "" {
			continue
		}
		k := key{p.Group, p.Resource, p.Subresource, p.Namespace}
		if _, ok := verbs[k]; !ok {
			order = append(order, k)
		}
		verbs[k] = append(verbs[k], p.Verb)
		if p.Name != "" {
			q := p
			q.Name = "krane-check-other-name"
			out = append(out, q)
		}
		if p.Namespace != "" {
			q := p
			q.Namespace = "krane-check-elsewhere"
			out = append(out, q)
		}
	}
	for _, k := range order {
		for _, v := range standardVerbs {
			if !slices.Contains(verbs[k], v) {
				out = append(out, Permission{Verb: v, Group: k.group, Resource: k.resource, Subresource: k.sub, Namespace: k.ns})
			}
		}
	}
	var kept []Permission
	for _, p := range out {
		if !Covers(allowed, p) && !slices.Contains(kept, p) {
			kept = append(kept, p)
		}
	}
	return kept
}

// Dangerous is a sample of what no component may do, whatever else it
// is granted: run code in other pods, mint tokens, read other
// namespaces' Secrets, grant itself more, act as someone else, change
// nodes, extend the API or its admission.
var Dangerous = []Permission{
	{Verb: "*", Group: "*", Resource: "*"},
	{Verb: "create", Resource: "pods", Subresource: "exec", Namespace: "kube-system"},
	{Verb: "create", Resource: "serviceaccounts", Subresource: "token", Namespace: "kube-system"},
	{Verb: "get", Resource: "secrets", Namespace: "kube-system"},
	{Verb: "update", Resource: "configmaps", Namespace: "kube-system"},
	{Verb: "escalate", Group: "rbac.authorization.k8s.io", Resource: "clusterroles"},
	{Verb: "bind", Group: "rbac.authorization.k8s.io", Resource: "clusterroles"},
	{Verb: "create", Group: "rbac.authorization.k8s.io", Resource: "clusterrolebindings"},
	{Verb: "create", Group: "rbac.authorization.k8s.io", Resource: "rolebindings", Namespace: "kube-system"},
	{Verb: "impersonate", Resource: "users"},
	{Verb: "impersonate", Resource: "serviceaccounts"},
	{Verb: "patch", Resource: "nodes"},
	{Verb: "create", Group: "apiextensions.k8s.io", Resource: "customresourcedefinitions"},
	{Verb: "create", Group: "admissionregistration.k8s.io", Resource: "validatingwebhookconfigurations"},
	{Verb: "update", Group: "certificates.k8s.io", Resource: "certificatesigningrequests", Subresource: "approval"},
	{Verb: "update", Group: "coordination.k8s.io", Resource: "leases", Namespace: "kube-system"},
}

// ServiceAccountUser is the user name and groups the API server gives a
// ServiceAccount's tokens.
func ServiceAccountUser(namespace, name string) (string, []string) {
	return "system:serviceaccount:" + namespace + ":" + name,
		[]string{"system:serviceaccounts", "system:serviceaccounts:" + namespace, "system:authenticated"}
}

// Allowed asks the API server (a SubjectAccessReview) whether user, in
// groups, may do p.
func Allowed(ctx context.Context, c kubernetes.Interface, user string, groups []string, p Permission) (bool, error) {
	sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{User: user, Groups: groups}}
	if p.Path != "" {
		sar.Spec.NonResourceAttributes = &authorizationv1.NonResourceAttributes{Path: p.Path, Verb: p.Verb}
	} else {
		sar.Spec.ResourceAttributes = &authorizationv1.ResourceAttributes{
			Verb: p.Verb, Group: p.Group, Resource: p.Resource, Subresource: p.Subresource, Name: p.Name, Namespace: p.Namespace,
		}
	}
	got, err := c.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
	if err != nil {
		return false, fmt.Errorf("SubjectAccessReview for %s, %s: %w", user, p, err)
	}
	return got.Status.Allowed, nil
}
