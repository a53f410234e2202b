package ctrl_test

import (
	"go/parser"
	"go/token"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"krane.dev/ctrl/workflows"
)

// packageDoc is ctrl/doc.go's package comment.
func packageDoc(t *testing.T) string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "doc.go", nil, parser.ParseComments|parser.PackageClauseOnly)
	if err != nil {
		t.Fatal(err)
	}
	if f.Doc == nil {
		t.Fatal("ctrl/doc.go has no package comment")
	}
	return f.Doc.Text()
}

// TestDocListsEveryPackage: every package under ctrl/ (from go list) is a
// "- path:" item of ctrl/doc.go, and every item is a package, so a reader
// of the package docs finds each one and none that is gone.
func TestDocListsEveryPackage(t *testing.T) {
	out, err := exec.Command("go", "list", "./...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	listed := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^\s*- ([a-z0-9/]+):`).FindAllStringSubmatch(packageDoc(t), -1) {
		listed[m[1]] = true
	}
	exist := map[string]bool{}
	for _, pkg := range strings.Fields(string(out)) {
		rel, ok := strings.CutPrefix(pkg, "krane.dev/ctrl/")
		if !ok {
			continue // krane.dev/ctrl itself
		}
		exist[rel] = true
		if !listed[rel] {
			t.Errorf("ctrl/doc.go does not list package %s", rel)
		}
	}
	for rel := range listed {
		if !exist[rel] {
			t.Errorf("ctrl/doc.go lists %s, which is not a package under ctrl/", rel)
		}
	}
}

// TestDocNamesEveryRestateService: ctrl/doc.go names every Restate
// service ctrl serves (from the one declaration, workflows.ServiceNames).
func TestDocNamesEveryRestateService(t *testing.T) {
	doc := strings.Join(strings.Fields(packageDoc(t)), " ")
	names := workflows.ServiceNames()
	if len(names) == 0 {
		t.Fatal("workflows declares no service")
	}
	for _, name := range names {
		if !regexp.MustCompile(`\b` + name + `\b`).MatchString(doc) {
			t.Errorf("ctrl/doc.go does not name the Restate service %s", name)
		}
	}
}
