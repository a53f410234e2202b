// Package examples_test proves the example plugins are what their READMEs
// say: a folder a plugin author copies out of this repository and builds
// as a module of their own, by the README's own commands.
package examples_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// walkthrough is the shell script of a README's walkthrough: the lines of
// the ```sh blocks between `<!-- walkthrough -->` and
// `<!-- /walkthrough -->`, as an author pastes them.
func walkthrough(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var script strings.Builder
	in, block := false, false
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "<!-- walkthrough -->":
			in = true
		case line == "<!-- /walkthrough -->":
			in = false
		case !in:
		case strings.HasPrefix(line, "```sh"):
			block = true
		case strings.HasPrefix(line, "```"):
			block = false
		case block:
			script.WriteString(line + "\n")
		}
	}
	if script.Len() == 0 {
		t.Fatalf("%s has no walkthrough (a ```sh block between `<!-- walkthrough -->` and `<!-- /walkthrough -->`)", path)
	}
	return script.String()
}

// TestConfigmapExampleREADMEWorksAsWritten runs the "Copy, build, test"
// commands of sdk/examples/configmap/README.md as written, in an empty
// directory with KRANE naming this checkout: the folder is copied out of
// the repository, made a module of its own against this checkout's sdk,
// tidied, tested (the conformance suite against a real API server), built
// and asked for --describe. Then what the README goes on to use holds: the
// module links nothing of this repository but the sdk, at the sdk's own
// Kubernetes versions; describe.json names the kind with a spec schema;
// and the objects.yaml it applies exists and passes that schema.
func TestConfigmapExampleREADMEWorksAsWritten(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a module and starts a cluster")
	}
	repo, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	script := walkthrough(t, "configmap/README.md")
	work := t.TempDir()
	// Outside this repository's module settings: as an author's checkout.
	env := append(os.Environ(), "KRANE="+repo, "GOWORK=off", "GOFLAGS=-mod=mod")
	cmd := exec.Command("bash", "-euo", "pipefail", "-c", script)
	cmd.Dir, cmd.Env = work, env
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the README's commands:\n%s\nfailed: %v\n%s", script, err, out)
	}
	dir := filepath.Join(work, "krane-plugin-mything")

	deps := run(t, dir, env, "go", "list", "-deps", ".")
	for _, dep := range strings.Fields(deps) {
		if strings.HasPrefix(dep, "krane.dev/") && !strings.HasPrefix(dep, "krane.dev/sdk") {
			t.Errorf("the copied example depends on %s: it may import only krane.dev/sdk/...", dep)
		}
	}
	// The Kubernetes modules are the sdk's own versions.
	for _, mod := range []string{"k8s.io/client-go", "k8s.io/api", "k8s.io/apimachinery"} {
		want := strings.TrimSpace(run(t, filepath.Join(repo, "sdk"), env, "go", "list", "-m", "-f", "{{.Version}}", mod))
		if got := strings.TrimSpace(run(t, dir, env, "go", "list", "-m", "-f", "{{.Version}}", mod)); got != want {
			t.Errorf("the copied example builds with %s %s; the sdk requires %s", mod, got, want)
		}
	}

	var describe struct {
		Kinds []struct {
			Kind       string `json:"kind"`
			SpecSchema string `json:"spec_schema"`
		} `json:"kinds"`
	}
	data, err := os.ReadFile(filepath.Join(dir, "describe.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &describe); err != nil || len(describe.Kinds) != 1 || describe.Kinds[0].Kind != "configmap.example.krane.dev" || describe.Kinds[0].SpecSchema == "" {
		t.Fatalf("describe.json (%v) does not publish kind configmap.example.krane.dev with a spec schema:\n%s", err, data)
	}
	schemaDoc, err := jsonschema.UnmarshalJSON(strings.NewReader(describe.Kinds[0].SpecSchema))
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource("spec.json", schemaDoc); err != nil {
		t.Fatal(err)
	}
	schema, err := c.Compile("spec.json")
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(dir, "objects.yaml"))
	if err != nil {
		t.Fatalf("the README applies objects.yaml, which the folder must hold: %v", err)
	}
	objJSON, err := utilyaml.ToJSON(raw)
	if err != nil {
		t.Fatal(err)
	}
	var obj struct {
		Kind    string          `json:"kind"`
		ID      string          `json:"id"`
		Regions []string        `json:"regions"`
		Spec    json.RawMessage `json:"spec"`
	}
	if err := json.Unmarshal(objJSON, &obj); err != nil || obj.Kind != describe.Kinds[0].Kind || obj.ID == "" || len(obj.Regions) == 0 {
		t.Fatalf("objects.yaml is not one object of kind %s with an id and regions (%v): %s", describe.Kinds[0].Kind, err, objJSON)
	}
	spec, err := jsonschema.UnmarshalJSON(bytes.NewReader(obj.Spec))
	if err != nil {
		t.Fatal(err)
	}
	if err := schema.Validate(spec); err != nil {
		t.Errorf("objects.yaml's spec fails the kind's schema, so `ctrl resource apply` would refuse it: %v", err)
	}
}

func run(t *testing.T, dir string, env []string, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir, cmd.Env = dir, env
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s (in %s): %v\n%s", name, strings.Join(args, " "), dir, err, out.String())
	}
	return out.String()
}
