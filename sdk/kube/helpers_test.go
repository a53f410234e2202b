package kube

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"krane.dev/sdk"
)

func TestValidateImage(t *testing.T) {
	for _, ok := range []string{"nginx", "nginx:1.27", "registry.example.com:5000/team/app:v1.2.3", "ghcr.io/a/b@sha256:" + strings.Repeat("a", 64)} {
		if err := ValidateImage("image", ok); err != nil {
			t.Errorf("%q refused: %v", ok, err)
		}
	}
	for _, bad := range []string{"", " nginx", "Registry/UPPER:v1", "nginx:latest; rm -rf /", "nginx@sha256:short", "r.example/" + strings.Repeat("a", 250)} {
		err := ValidateImage("image", bad)
		var pe *sdk.PermanentError
		if !errors.As(err, &pe) || pe.Field != "image" {
			t.Errorf("%q: %v, want a permanent error on field image", bad, err)
		}
	}
}

func TestValidateNamesAndID(t *testing.T) {
	if ValidateName("name", "ok.name-1") != nil || ValidateName("name", "Not_OK") == nil {
		t.Error("ValidateName")
	}
	if ValidateNamespace("namespace", "team-a") != nil || ValidateNamespace("namespace", "a.b") == nil {
		t.Error("ValidateNamespace")
	}
	if ValidateID("res_1.a") != nil || ValidateID("") == nil || ValidateID(strings.Repeat("a", 64)) == nil {
		t.Error("ValidateID")
	}
}

func cm(name, id string, version uint64, deleting bool) *corev1.ConfigMap {
	c := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{IDLabel: id}, Annotations: VersionAnnotations(version, "h"+fmt.Sprint(version))}}
	if deleting {
		c.DeletionTimestamp = &metav1.Time{}
	}
	return c
}

func TestInventoryOneItemPerIDNewestWins(t *testing.T) {
	resp := Inventory("k", IDLabel, []*corev1.ConfigMap{
		cm("b-new", "b", 9, false), cm("b-old", "b", 4, false), cm("a", "a", 3, false),
		cm("c", "c", 5, true), {ObjectMeta: metav1.ObjectMeta{Name: "unlabelled"}},
	})
	got := fmt.Sprint(resp.Items)
	if got != "[{k a 3 h3} {k b 9 h9}]" {
		t.Errorf("inventory %s", got)
	}
}

func TestUncovered(t *testing.T) {
	rules := []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list"}},
		{APIGroups: []string{""}, Resources: []string{"namespaces"}, ResourceNames: []string{"mine"}, Verbs: []string{"patch"}},
		{APIGroups: []string{"apps"}, Resources: []string{"*"}, Verbs: []string{"*"}},
	}
	perms := []sdk.Permission{
		{Resource: "configmaps", Verbs: []string{"get", "list", "delete"}},
		{Resource: "namespaces", Verbs: []string{"patch"}, Name: "mine"},
		{Resource: "namespaces", Verbs: []string{"patch"}},
		{Group: "apps", Resource: "deployments", Verbs: []string{"create"}},
	}
	var got []string
	for _, m := range Uncovered(rules, perms) {
		got = append(got, m.String())
	}
	if fmt.Sprint(got) != "[delete configmaps in every namespace patch namespaces in every namespace]" {
		t.Errorf("uncovered: %q", got)
	}
}

func TestClassify(t *testing.T) {
	gr := schema.GroupResource{Resource: "configmaps"}
	invalid := apierrors.NewInvalid(schema.GroupKind{Kind: "ConfigMap"}, "x", nil)
	if !sdk.IsPermanent(Classify(fmt.Errorf("apply: %w", invalid))) {
		t.Error("invalid is not permanent")
	}
	if !sdk.IsPermanent(Classify(apierrors.NewForbidden(gr, "x", errors.New("no")))) {
		t.Error("forbidden is not permanent")
	}
	ns := apierrors.NewNotFound(schema.GroupResource{Resource: "namespaces"}, "team-a")
	if err := Classify(ns); sdk.IsPermanent(err) || !strings.Contains(err.Error(), "namespace does not exist") {
		t.Errorf("missing namespace: %v", err)
	}
	if err := Classify(apierrors.NewServiceUnavailable("busy")); sdk.IsPermanent(err) {
		t.Errorf("unavailable is permanent: %v", err)
	}
}
