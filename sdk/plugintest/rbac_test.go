package plugintest

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"krane.dev/sdk"
)

// recorder is a testing.TB that keeps what a check reports.
type recorder struct {
	testing.TB
	errs []string
}

func (r *recorder) Errorf(format string, args ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}
func (r *recorder) Helper() {}

const account = `apiVersion: v1
kind: ServiceAccount
metadata: {name: krane-plugin-x, namespace: krane}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: krane-token-x, namespace: krane}
rules:
  - {apiGroups: [""], resources: ["serviceaccounts/token"], resourceNames: ["krane-plugin-x"], verbs: ["create"]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: krane-token-x, namespace: krane}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: krane-token-x}
subjects: [{kind: ServiceAccount, name: krane, namespace: krane}]
---
`

func binding(kind, role string) string {
	if kind == "RoleBinding" {
		return fmt.Sprintf(`apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: x, namespace: objs}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: %s}
subjects: [{kind: ServiceAccount, name: krane-plugin-x, namespace: krane}]
`, role)
	}
	return fmt.Sprintf(`apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: x}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: %s}
subjects: [{kind: ServiceAccount, name: krane-plugin-x, namespace: krane}]
`, role)
}

// TestRBACGrantsOnly: a manifest that binds exactly the declared
// permissions passes; each way of granting more (cluster-wide instead of
// in the declared namespace, a verb, a resource, all names instead of one)
// and of granting less is reported. The host's token Role in the same file
// is not the plugin's and is ignored.
func TestRBACGrantsOnly(t *testing.T) {
	declared := []sdk.Permission{
		{Resource: "configmaps", Verbs: []string{"list", "watch", "patch"}, Namespace: "objs"},
		{Resource: "namespaces", Verbs: []string{"get"}, Name: "objs"},
	}
	role := func(kind, ns, verbs, resources string) string {
		meta := "{name: r}"
		if ns != "" {
			meta = "{name: r, namespace: " + ns + "}"
		}
		return fmt.Sprintf("apiVersion: rbac.authorization.k8s.io/v1\nkind: %s\nmetadata: %s\nrules:\n  - {apiGroups: [\"\"], resources: [%s], verbs: [%s]}\n---\n", kind, meta, resources, verbs)
	}
	namespaces := "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {name: ns}\nrules:\n  - {apiGroups: [\"\"], resources: [\"namespaces\"], resourceNames: [\"objs\"], verbs: [\"get\"]}\n  - {nonResourceURLs: [\"/apis\"], verbs: [\"get\"]}\n---\n" + binding("ClusterRoleBinding", "ns") + "---\n"
	exact := role("Role", "objs", `"list", "watch", "patch"`, `"configmaps"`) + binding("RoleBinding", "r")
	for _, c := range []struct {
		name, manifest string
		want           string // "" for no report
	}{
		{"exact", exact, ""},
		{"cluster-wide instead of its namespace", role("ClusterRole", "", `"list", "watch", "patch"`, `"configmaps"`) + binding("ClusterRoleBinding", "r"), "list configmaps in every namespace"},
		{"a verb more", role("Role", "objs", `"list", "watch", "patch", "delete"`, `"configmaps"`) + binding("RoleBinding", "r"), "delete configmaps in namespace objs"},
		{"a resource more", role("Role", "objs", `"list", "watch", "patch"`, `"configmaps", "secrets"`) + binding("RoleBinding", "r"), "list secrets in namespace objs"},
		{"a verb less", role("Role", "objs", `"list", "watch"`, `"configmaps"`) + binding("RoleBinding", "r"), "does not grant what the plugin declares it needs: patch configmaps"},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "rbac.yaml")
			if err := os.WriteFile(path, []byte(account+namespaces+c.manifest), 0o644); err != nil {
				t.Fatal(err)
			}
			r := &recorder{TB: t}
			RBACGrantsOnly(r, path, declared)
			got := strings.Join(r.errs, "\n")
			switch {
			case c.want == "" && got != "":
				t.Errorf("reported:\n%s", got)
			case c.want != "" && !strings.Contains(got, c.want):
				t.Errorf("reported:\n%s\nwant it to say %q", got, c.want)
			}
		})
	}
	// All names where one is declared.
	path := filepath.Join(t.TempDir(), "rbac.yaml")
	wide := strings.Replace(namespaces, `resourceNames: ["objs"], `, "", 1)
	if err := os.WriteFile(path, []byte(account+wide+exact), 0o644); err != nil {
		t.Fatal(err)
	}
	r := &recorder{TB: t}
	RBACGrantsOnly(r, path, declared)
	if got := strings.Join(r.errs, "\n"); !strings.Contains(got, "get namespaces in every namespace") {
		t.Errorf("a rule for every namespace object where one is declared: reported %q", got)
	}
}
