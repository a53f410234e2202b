package cli_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"

	"krane.dev/ctrl/internal/ctrltest"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
)

const quotaSchema = `{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "type": "object",
  "additionalProperties": false,
  "required": ["namespace", "cpu"],
  "properties": {
    "namespace": {"type": "string", "minLength": 1},
    "cpu": {"type": "string"},
    "pods": {"type": "integer", "minimum": 1}
  }
}`

// resourceEnv is a ctrl (no Restate: the resource API needs none) with
// CTRL_ADDR and CTRL_TOKEN set for the CLI, and a file writer.
func resourceEnv(t *testing.T) (*ctrltest.Env, func(name, body string) string) {
	t.Helper()
	env := ctrltest.Start(t, ctrltest.Options{})
	t.Setenv("CTRL_ADDR", env.Server.GRPCAddr())
	t.Setenv("CTRL_TOKEN", env.OperatorToken(t, "resource cli test"))
	dir := t.TempDir()
	return env, func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
}

func mustRun(t *testing.T, args ...string) string {
	t.Helper()
	code, out, errOut := run(t, args...)
	if code != 0 {
		t.Fatalf("ctrl %s: exit %d\n%s%s", strings.Join(args, " "), code, out, errOut)
	}
	return out
}

func TestKindRegistrationGatesApply(t *testing.T) {
	_, file := resourceEnv(t)
	objects := file("quota.yaml", `
kind: quota.acme.example
id: team-a
regions: [eu, us]
spec:
  namespace: team-a
  cpu: "2"
`)
	// Unregistered: refused, saying how to register.
	code, _, errOut := run(t, "resource", "apply", "-f", objects)
	if code == 0 || !strings.Contains(errOut, "ctrl kind register quota.acme.example --schema") {
		t.Fatalf("apply of an unregistered kind: %d %q; want the registration command", code, errOut)
	}
	schema := file("schema.json", quotaSchema)
	if out := mustRun(t, "kind", "register", "quota.acme.example", "--schema", schema, "--description", "team quotas"); !strings.Contains(out, "registered") {
		t.Errorf("register: %q", out)
	}
	if out := mustRun(t, "kind", "list"); !strings.Contains(out, "quota.acme.example") || !strings.Contains(out, "ciliumnetworkpolicy") {
		t.Errorf("kind list:\n%s", out)
	}
	out := mustRun(t, "resource", "apply", "-f", objects)
	if !strings.Contains(out, "quota.acme.example/team-a created: eu create v") {
		t.Errorf("apply: %q", out)
	}
	// Idempotent: the same file again changes nothing.
	if out := mustRun(t, "resource", "apply", "-f", objects); !strings.Contains(out, "quota.acme.example/team-a unchanged") {
		t.Errorf("second apply: %q", out)
	}
}

func TestApplyRefusesABadSpecNamingTheField(t *testing.T) {
	env, file := resourceEnv(t)
	mustRun(t, "kind", "register", "quota.acme.example", "--schema", file("schema.json", quotaSchema))
	// A list: one good object, one whose pods is not an integer. The whole
	// file is refused; nothing is written.
	bad := file("bad.json", `[
 {"kind":"quota.acme.example","id":"good","regions":["eu"],"spec":{"namespace":"a","cpu":"1"}},
 {"kind":"quota.acme.example","id":"bad","regions":["eu"],"spec":{"namespace":"b","cpu":"1","pods":"many"}}
]`)
	code, _, errOut := run(t, "resource", "apply", "-f", bad)
	if code == 0 || !strings.Contains(errOut, "resources[1].spec/pods") || !strings.Contains(errOut, `"/pods"`) {
		t.Fatalf("bad spec: %d %q; want the field named", code, errOut)
	}
	var n int
	if err := env.Store.DB().QueryRow("SELECT COUNT(*) FROM resources").Scan(&n); err != nil || n != 0 {
		t.Errorf("%d rows written by a refused apply (%v)", n, err)
	}
	// --dry-run validates and writes nothing.
	good := file("good.yaml", "kind: quota.acme.example\nid: good\nregions: [eu]\nspec: {namespace: a, cpu: '1'}\n")
	if out := mustRun(t, "resource", "apply", "-f", good, "--dry-run"); !strings.Contains(out, "would be created") {
		t.Errorf("dry run: %q", out)
	}
	if err := env.Store.DB().QueryRow("SELECT COUNT(*) FROM resources").Scan(&n); err != nil || n != 0 {
		t.Errorf("%d rows written by a dry run (%v)", n, err)
	}
	// Unknown keys in the file are refused before any call.
	typo := file("typo.yaml", "kind: quota.acme.example\nid: x\nregion: [eu]\nspec: {}\n")
	if code, _, errOut := run(t, "resource", "apply", "-f", typo); code == 0 || !strings.Contains(errOut, `unknown field "region"`) {
		t.Errorf("typo: %d %q", code, errOut)
	}
}

// TestGetShowsRegionsStatusAndParkedErrors: what clusters report is what
// `ctrl resource get` shows, and --wait fails with a parked error.
func TestGetShowsRegionsStatusAndParkedErrors(t *testing.T) {
	env, file := resourceEnv(t)
	mustRun(t, "kind", "register", "quota.acme.example", "--schema", file("schema.json", quotaSchema))
	mustRun(t, "resource", "apply", "-f", file("q.yaml", "kind: quota.acme.example\nid: team-a\nregions: [eu, us]\nspec: {namespace: team-a, cpu: '2'}\n"))
	versions := map[string]uint64{}
	for _, region := range []string{"eu", "us"} {
		c, err := env.Store.Desired(context.Background(), "quota.acme.example", region, "team-a")
		if err != nil {
			t.Fatal(err)
		}
		versions[region] = c.Version
	}
	ctx := context.Background()
	eu := env.FakeCluster(t, "eu", "eu-1")
	eu.Serve(t, "quota.acme.example")
	st, _ := structpb.NewStruct(map[string]any{"used": "0"})
	packed, _ := anypb.New(st)
	if _, err := eu.Client.ReportStatus(ctx, &clusterv1.ReportStatusRequest{Kind: "quota.acme.example", Id: "team-a", ObservedVersion: versions["eu"], Status: packed}); err != nil {
		t.Fatal(err)
	}
	us := env.FakeCluster(t, "us", "us-1")
	us.Serve(t, "quota.acme.example")
	if _, err := us.Client.ReportStatus(ctx, &clusterv1.ReportStatusRequest{Kind: "quota.acme.example", Id: "team-a",
		ApplyError: &clusterv1.ApplyError{Version: versions["us"], Message: "cpu: \"2\" exceeds this cluster's limit of 1", Field: "cpu", Permanent: true}}); err != nil {
		t.Fatal(err)
	}
	out := mustRun(t, "resource", "get", "quota.acme.example", "team-a")
	for _, want := range []string{"desired in eu, us", `{"used":"0"}`, "cluster us-1 parked", "exceeds this cluster's limit"} {
		if !strings.Contains(out, want) {
			t.Errorf("get does not show %q:\n%s", want, out)
		}
	}
	var js struct {
		Regions []struct {
			Region  string
			Applied bool
		}
	}
	if err := json.Unmarshal([]byte(mustRun(t, "resource", "get", "quota.acme.example", "team-a", "-o", "json")), &js); err != nil {
		t.Fatal(err)
	}
	if len(js.Regions) != 2 || !js.Regions[0].Applied || js.Regions[1].Applied {
		t.Errorf("-o json regions: %+v", js.Regions)
	}
	if out := mustRun(t, "resource", "get", "quota.acme.example", "team-a", "-o", "yaml"); !strings.Contains(out, "region: eu") {
		t.Errorf("-o yaml:\n%s", out)
	}
	code, _, errOut := run(t, "resource", "get", "quota.acme.example", "team-a", "--wait", "--poll-interval", "20ms")
	if code == 0 || !strings.Contains(errOut, "parked") || !strings.Contains(errOut, "eu: applied") {
		t.Errorf("--wait with a parked region: %d %q", code, errOut)
	}
	// A new version replaces the parked one; when the clusters report it
	// applied, --wait succeeds.
	mustRun(t, "resource", "apply", "-f", file("q2.yaml", "kind: quota.acme.example\nid: team-a\nregions: [eu, us]\nspec: {namespace: team-a, cpu: '1'}\n"))
	for _, fc := range []*ctrltest.FakeCluster{eu, us} {
		c, _ := env.Store.Desired(ctx, "quota.acme.example", fc.Region, "team-a")
		if _, err := fc.Client.ReportStatus(ctx, &clusterv1.ReportStatusRequest{Kind: "quota.acme.example", Id: "team-a", ObservedVersion: c.Version, Status: packed,
			ApplyError: &clusterv1.ApplyError{Version: c.Version}}); err != nil {
			t.Fatal(err)
		}
	}
	if code, _, errOut := run(t, "resource", "get", "quota.acme.example", "team-a", "--wait", "--poll-interval", "20ms"); code != 0 || !strings.Contains(errOut, "every region applied") {
		t.Errorf("--wait once applied: %d %q", code, errOut)
	}
	// Delete in one region; list shows what is left.
	if out := mustRun(t, "resource", "delete", "quota.acme.example", "team-a", "--region", "us"); !strings.Contains(out, "us delete v") {
		t.Errorf("delete: %q", out)
	}
	if out := mustRun(t, "resource", "list", "quota.acme.example"); !strings.Contains(out, "team-a") || strings.Contains(out, "eu,us") {
		t.Errorf("list after deleting in us:\n%s", out)
	}
}

func TestBuiltInKindsAreRefusedOrServed(t *testing.T) {
	_, file := resourceEnv(t)
	dep := file("dep.yaml", "kind: deployment\nid: d1\nregions: [eu]\nspec: {}\n")
	if code, _, errOut := run(t, "resource", "apply", "-f", dep); code == 0 || !strings.Contains(errOut, "ctrl deploy") {
		t.Errorf("deployment through the resource API: %d %q", code, errOut)
	}
	pol := file("pol.yaml", "kind: ciliumnetworkpolicy\nid: allow-web\nregions: [eu]\nspec:\n  namespace: team-a\n  name: allow-web\n  policy: {endpointSelector: {}}\n")
	if out := mustRun(t, "resource", "apply", "-f", pol); !strings.Contains(out, "created") {
		t.Errorf("policy: %q", out)
	}
	two := file("pol2.yaml", "kind: ciliumnetworkpolicy\nid: allow-web\nregions: [eu, us]\nspec:\n  namespace: team-a\n  name: allow-web\n  policy: {}\n")
	if code, _, errOut := run(t, "resource", "apply", "-f", two); code == 0 || !strings.Contains(errOut, "exactly one region") {
		t.Errorf("policy in two regions: %d %q", code, errOut)
	}
}

func TestKindRegisterRefusesABadSchema(t *testing.T) {
	_, file := resourceEnv(t)
	bad := file("bad.json", `{"type": "object", "properties": {"x": {"type": "no-such-type"}}}`)
	if code, _, errOut := run(t, "kind", "register", "bad.acme.example", "--schema", bad); code == 0 || !strings.Contains(errOut, "spec_schema: not a usable JSON Schema") {
		t.Errorf("bad schema: %d %q", code, errOut)
	}
	if code, _, errOut := run(t, "kind", "register", "deployment", "--schema", file("s.json", `{}`)); code == 0 || !strings.Contains(errOut, "built in") {
		t.Errorf("built-in kind: %d %q", code, errOut)
	}
	desc := file("describe.json", `{"name":"noschema","kinds":[{"kind":"x.acme.example","spec_type":"google.protobuf.Struct"}]}`)
	if code, _, errOut := run(t, "kind", "register", "--describe", desc); code == 0 || !strings.Contains(errOut, "publishes no spec schema") {
		t.Errorf("describe without schemas: %d %q", code, errOut)
	}
}

// TestWaitEndsAtOnceWhereNoLiveClusterRunsTheKind: `resource apply --wait`
// for a kind no live cluster of a region runs a controller for ends at
// once, as a deploy to such a region is refused, naming each region and
// what its clusters run, instead of waiting out its five minutes. The
// object stays desired: it is applied once a cluster there runs the kind.
func TestWaitEndsAtOnceWhereNoLiveClusterRunsTheKind(t *testing.T) {
	env, file := resourceEnv(t)
	mustRun(t, "kind", "register", "quota.acme.example", "--schema", file("schema.json", quotaSchema))
	// eu: a live cluster whose host runs a controller for another kind;
	// us: no cluster at all.
	eu := env.FakeCluster(t, "eu", "eu-1")
	eu.Serve(t, "other.acme.example")
	objects := file("q.yaml", "kind: quota.acme.example\nid: team-a\nregions: [eu, us]\nspec: {namespace: team-a, cpu: '2'}\n")

	begin := time.Now()
	code, out, errOut := run(t, "resource", "apply", "-f", objects, "--wait", "--timeout", "1m", "--poll-interval", "20ms")
	took := time.Since(begin)
	if code == 0 {
		t.Fatalf("apply --wait where no cluster runs the kind succeeded:\n%s%s", out, errOut)
	}
	for _, want := range []string{
		"no live cluster can apply the change",
		`quota.acme.example/team-a eu: region "eu": no live cluster runs a controller for kind "quota.acme.example" (cluster eu-1 runs:`,
		`quota.acme.example/team-a us: region "us": no live cluster runs a controller for kind "quota.acme.example" (no cluster with a valid token is registered there)`,
	} {
		if !strings.Contains(errOut, want) {
			t.Errorf("apply --wait does not say %q:\n%s", want, errOut)
		}
	}
	// Ending at once means one round of reads, well before --timeout,
	// bounded loosely for a loaded machine.
	if took > 30*time.Second {
		t.Errorf("apply --wait took %s to give up; want at once", took)
	}
	if !strings.Contains(out, "quota.acme.example/team-a created") {
		t.Errorf("the apply itself: %q", out)
	}

	// Once eu's cluster runs the kind, only us is named.
	eu.Serve(t, "quota.acme.example")
	code, _, errOut = run(t, "resource", "get", "quota.acme.example", "team-a", "--wait", "--timeout", "1m", "--poll-interval", "20ms")
	if code == 0 || strings.Contains(errOut, `region "eu"`) || !strings.Contains(errOut, `region "us"`) {
		t.Errorf("get --wait with eu served: exit %d, want us alone named:\n%s", code, errOut)
	}
}
