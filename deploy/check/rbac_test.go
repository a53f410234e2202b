package check

import (
	"slices"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
)

func TestExpand(t *testing.T) {
	got := Expand([]rbacv1.PolicyRule{
		{APIGroups: []string{"", "apps"}, Resources: []string{"pods/log"}, Verbs: []string{"get"}},
		{APIGroups: []string{""}, Resources: []string{"namespaces"}, ResourceNames: []string{"a", "b"}, Verbs: []string{"patch"}},
		{NonResourceURLs: []string{"/apis/*"}, Verbs: []string{"get"}},
	}, "ns")
	want := []Permission{
		{Verb: "get", Resource: "pods", Subresource: "log", Namespace: "ns"},
		{Verb: "get", Group: "apps", Resource: "pods", Subresource: "log", Namespace: "ns"},
		{Verb: "patch", Resource: "namespaces", Name: "a", Namespace: "ns"},
		{Verb: "patch", Resource: "namespaces", Name: "b", Namespace: "ns"},
		{Verb: "get", Path: "/apis/*"},
	}
	if !slices.Equal(got, want) {
		t.Errorf("Expand =\n%v\nwant\n%v", got, want)
	}
}

func TestCovers(t *testing.T) {
	granted := []Permission{
		{Verb: "list", Resource: "secrets"},
		{Verb: "patch", Resource: "namespaces", Name: "sentinel"},
		{Verb: "update", Group: "coordination.k8s.io", Resource: "leases", Namespace: "krane"},
		{Verb: "get", Path: "/apis/*"},
	}
	for _, tc := range []struct {
		p    Permission
		want bool
	}{
		{Permission{Verb: "list", Resource: "secrets", Namespace: "ws-1"}, true}, // every namespace covers one
		{Permission{Verb: "get", Resource: "secrets", Namespace: "ws-1"}, false},
		{Permission{Verb: "list", Group: "apps", Resource: "secrets"}, false},
		{Permission{Verb: "patch", Resource: "namespaces", Name: "sentinel"}, true},
		{Permission{Verb: "patch", Resource: "namespaces", Name: "kube-system"}, false},
		{Permission{Verb: "patch", Resource: "namespaces"}, false}, // a name does not cover every name
		{Permission{Verb: "update", Group: "coordination.k8s.io", Resource: "leases", Namespace: "krane"}, true},
		{Permission{Verb: "update", Group: "coordination.k8s.io", Resource: "leases", Namespace: "kube-system"}, false},
		{Permission{Verb: "update", Group: "coordination.k8s.io", Resource: "leases"}, false}, // one namespace does not cover all
		{Permission{Verb: "list", Resource: "secrets", Subresource: "status"}, false},
		{Permission{Verb: "get", Path: "/apis/cilium.io/v2"}, true},
		{Permission{Verb: "get", Path: "/api"}, false},
	} {
		if got := Covers(granted, tc.p); got != tc.want {
			t.Errorf("Covers(%s) = %v, want %v", tc.p, got, tc.want)
		}
	}
	if !Covers([]Permission{{Verb: "*", Group: "*", Resource: "*"}}, Permission{Verb: "delete", Group: "apps", Resource: "deployments", Namespace: "x"}) {
		t.Error("wildcards do not cover a permission")
	}
}

func TestNegatives(t *testing.T) {
	allowed := Expand([]rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"list", "watch", "create", "patch", "delete"}},
		{APIGroups: []string{""}, Resources: []string{"namespaces"}, Verbs: []string{"create"}},
		{APIGroups: []string{""}, Resources: []string{"namespaces"}, ResourceNames: []string{"sentinel"}, Verbs: []string{"patch"}},
	}, "")
	allowed = append(allowed, Expand([]rbacv1.PolicyRule{{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"get"}}}, "krane")...)
	got := Negatives(allowed)
	for _, p := range got {
		if Covers(allowed, p) {
			t.Errorf("Negatives includes %s, which is allowed", p)
		}
	}
	for _, want := range []Permission{
		{Verb: "get", Resource: "secrets"},
		{Verb: "update", Resource: "secrets"},
		{Verb: "deletecollection", Resource: "secrets"},
		{Verb: "patch", Resource: "namespaces", Name: "krane-check-other-name"},
		{Verb: "delete", Resource: "namespaces"},
		{Verb: "get", Group: "coordination.k8s.io", Resource: "leases", Namespace: "krane-check-elsewhere"},
		{Verb: "update", Group: "coordination.k8s.io", Resource: "leases", Namespace: "krane"},
	} {
		if !slices.Contains(got, want) {
			t.Errorf("Negatives lacks %s", want)
		}
	}
	for _, notWant := range []Permission{
		{Verb: "create", Resource: "namespaces"},
		{Verb: "patch", Resource: "namespaces"}, // granted for one name: the unnamed patch is not a verb "never granted"
	} {
		if slices.Contains(got, notWant) {
			t.Errorf("Negatives includes %s", notWant)
		}
	}
}
