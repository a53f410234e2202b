package workflows_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"krane.dev/ctrl/workflows"
)

// TestEveryRunIsADeclaredStep keeps Steps complete: a restate.Run (or
// RunVoid, RunAsync) anywhere but in runStep would be a step the
// crash-point tests cannot see.
func TestEveryRunIsADeclaredStep(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		src, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		f, err := parser.ParseFile(fset, name, src, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			sel, ok := n.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			if x, ok := sel.X.(*ast.Ident); ok && x.Name == "restate" && strings.HasPrefix(sel.Sel.Name, "Run") && sel.Sel.Name != "RunContext" && sel.Sel.Name != "RunOption" {
				if name != "steps.go" {
					t.Errorf("%s: restate.%s outside runStep: declare the step with newStep and run it with runStep, so the crash-point tests cover it",
						fset.Position(sel.Pos()), sel.Sel.Name)
				}
			}
			return true
		})
	}
	if len(workflows.Steps()) == 0 {
		t.Fatal("no step is declared")
	}
}
