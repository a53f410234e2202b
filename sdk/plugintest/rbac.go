package plugintest

import (
	"bytes"
	"errors"
	"io"
	"os"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
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
