package e2e

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"krane.dev/internal/stack"
)

// step is one command of docs/plugin-authoring.md's walkthrough and what
// the guide says it does.
type step struct {
	line    int
	command string
	// fails/prints: the command must fail (or succeed) with output that
	// contains this text; "" means it must just succeed.
	fails, prints string
}

// walkthrough reads the commands of the guide's walkthrough: every line of
// the ```sh blocks between the walkthrough markers, with the `# fails:`
// and `# prints:` lines that follow a command.
func walkthrough(t *testing.T, path string) []step {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var steps []step
	in, block := false, false
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		switch {
		case strings.TrimSpace(line) == "<!-- walkthrough -->":
			in = true
		case strings.TrimSpace(line) == "<!-- /walkthrough -->":
			in = false
		case !in:
		case strings.HasPrefix(line, "```sh"):
			block = true
		case strings.HasPrefix(line, "```"):
			block = false
		case !block || strings.TrimSpace(line) == "":
		case strings.HasPrefix(line, "# fails: "):
			steps[len(steps)-1].fails = strings.TrimPrefix(line, "# fails: ")
		case strings.HasPrefix(line, "# prints: "):
			steps[len(steps)-1].prints = strings.TrimPrefix(line, "# prints: ")
		case strings.HasPrefix(line, "#"):
			t.Fatalf("%s:%d: a comment in a walkthrough block must be `# fails:` or `# prints:`: %q", path, n, line)
		default:
			steps = append(steps, step{line: n, command: line})
		}
	}
	return steps
}

// authorSources copies the quota plugin's Go files out of this
// repository, without its go.mod and go.sum: the guide's walkthrough makes
// the module itself.
func authorSources(t *testing.T) string {
	t.Helper()
	dir := authorModule(t)
	for _, f := range []string{"go.mod", "go.sum"} {
		if err := os.Remove(filepath.Join(dir, f)); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// authorModule copies the quota plugin's module out of this repository,
// as its author's checkout would be, requiring this checkout's sdk.
func authorModule(t *testing.T) string {
	t.Helper()
	src, err := filepath.Abs("testdata/quota-plugin")
	if err != nil {
		t.Fatal(err)
	}
	sdkDir, err := filepath.Abs("../sdk")
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "krane-plugin-quota")
	if err := os.CopyFS(dir, os.DirFS(src)); err != nil {
		t.Fatal(err)
	}
	gomod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	gomod = bytes.ReplaceAll(gomod, []byte("=> ../../../sdk"), []byte("=> "+sdkDir))
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), gomod, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// walkEnv is the environment the guide assumes: krane's own settings (as
// `krane validate` reads them), ctrl's address and an operator token,
// kubectl's access, and the variables the guide names.
func walkEnv(t *testing.T, st *stack.Stack, region string) []string {
	t.Helper()
	bin := t.TempDir()
	for _, name := range []string{"ctrl", "krane"} {
		if err := os.Symlink(st.Bin(name), filepath.Join(bin, name)); err != nil {
			t.Fatal(err)
		}
	}
	hcl, err := st.KraneConfigPath(region)
	if err != nil {
		t.Fatal(err)
	}
	sdkDir, err := filepath.Abs("../sdk")
	if err != nil {
		t.Fatal(err)
	}
	env := append(os.Environ(), st.KraneProcessEnv(region)...)
	return append(env,
		"PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"),
		"CTRL_ADDR="+st.CtrlAddr,
		"CTRL_TOKEN="+st.OperatorToken,
		"KUBECONFIG="+st.Clusters[region].Kubeconfig,
		"KRANE_HCL="+hcl,
		"PLUGIN_DIR="+st.PluginDir(),
		fmt.Sprintf("KRANE_PID=%d", st.Krane(region).Pid()),
		"KRANE_HTTP="+st.KraneHTTP[region],
		"KRANE_SDK="+sdkDir,
		// An author's module, outside this repository's settings.
		"GOWORK=off", "GOFLAGS=-mod=mod",
	)
}

// TestPluginAuthorWalkthrough runs docs/plugin-authoring.md's walkthrough
// as a new plugin author would: a plugin for a kind this repository does
// not ship (quota.acme.example), built from a module of its own that
// imports only the sdk, its kind registered with the schema it publishes,
// objects published with `ctrl resource apply` and found in the cluster, a
// spec the schema refuses named by ctrl, a spec only the plugin refuses
// reported back and shown by `ctrl resource get`, a delete, the plugin's
// missing ServiceAccount named at start and, once its rbac.yaml is
// applied, the plugin running as that account and refused what it was not
// granted; the host and ctrl are the binaries of this checkout, unchanged.
func TestPluginAuthorWalkthrough(t *testing.T) {
	if _, err := exec.LookPath("kubectl"); err != nil {
		t.Fatal("the guide uses kubectl: install it (Debian: apt-get install kubernetes-client) or put it in PATH")
	}
	st := sharedStack(t)
	const region = "local-a"
	steps := walkthrough(t, "../docs/plugin-authoring.md")
	if len(steps) < 20 {
		t.Fatalf("the guide's walkthrough has %d commands; the walkthrough markers or its sh blocks are missing", len(steps))
	}
	dir := authorSources(t)
	env := walkEnv(t, st, region)
	hcl, _ := st.KraneConfigPath(region)
	before, err := os.ReadFile(hcl)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// The shared stack's other tests run without this controller.
		_ = st.EditKraneConfig(region, func(string) string { return string(before) })
	})

	for i, s := range steps {
		begin := time.Now()
		out := runStep(t, dir, env, s)
		t.Logf("step %d (guide line %d, %s): %s", i+1, s.line, time.Since(begin).Round(10*time.Millisecond), s.command)
		if testing.Verbose() && len(out) > 0 {
			t.Logf("%s", strings.TrimSpace(out))
		}
	}

	// Beyond what the guide's commands print: the module linked only the
	// sdk of this repository, and the cluster holds exactly the quotas
	// desired state names.
	deps := runIn(t, dir, env, "go", "list", "-deps", ".")
	for _, dep := range strings.Fields(deps) {
		if strings.HasPrefix(dep, "krane.dev/") && !strings.HasPrefix(dep, "krane.dev/sdk") {
			t.Errorf("the plugin's module depends on %s: only krane.dev/sdk/... is public", dep)
		}
	}
	c := st.Clusters[region]
	quotas, err := c.Client.CoreV1().ResourceQuotas("").List(context.Background(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=acme-quota"})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, q := range quotas.Items {
		got = append(got, q.Namespace+"/"+q.Labels["krane.dev/id"])
	}
	if fmt.Sprint(got) != "[team-b/team-b team-c/team-c]" {
		t.Errorf("quotas in the cluster: %v, want team-b and team-c (team-a deleted, team-d refused)", got)
	}
}

// stepBound bounds how long a step with an expectation is retried: the
// clusters converge, a plugin restarts with backoff, a loaded machine is
// slow; a step that holds returns at once.
const stepBound = 3 * time.Minute

func runStep(t *testing.T, dir string, env []string, s step) string {
	t.Helper()
	deadline := time.Now().Add(stepBound)
	for {
		cmd := exec.Command("bash", "-c", s.command)
		cmd.Dir, cmd.Env = dir, env
		out, err := cmd.CombinedOutput()
		var problem string
		switch {
		case s.fails != "" && err == nil:
			problem = "succeeded; the guide says it fails"
		case s.fails != "" && !bytes.Contains(out, []byte(s.fails)):
			problem = fmt.Sprintf("failed without saying %q", s.fails)
		case s.fails == "" && err != nil:
			problem = fmt.Sprintf("failed: %v", err)
		case s.prints != "" && !bytes.Contains(out, []byte(s.prints)):
			problem = fmt.Sprintf("did not print %q", s.prints)
		}
		if problem == "" {
			return string(out)
		}
		if s.fails == "" && s.prints == "" || time.Now().After(deadline) {
			t.Fatalf("guide line %d: `%s` %s:\n%s", s.line, s.command, problem, out)
		}
		time.Sleep(time.Second)
	}
}

func runIn(t *testing.T, dir string, env []string, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir, cmd.Env = dir, env
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}
