package deployspec_test

//lint:file-ignore SA1019 legacy-workload: removed no earlier than v0.3.0 (docs/compatibility.md); this file builds or reads the deprecated top-level workload fields

import (
	"encoding/json"
	"math/rand/v2"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"krane.dev/ctrl/deployspec"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
	ctrlv1 "krane.dev/proto/krane/ctrl/v1"
)

func TestIDsAndNames(t *testing.T) {
	id := deployspec.NewDeploymentID()
	if len(id) != 24 || !strings.HasPrefix(id, "dep_") || id == deployspec.NewDeploymentID() {
		t.Fatalf("deployment id %q", id)
	}
	if k := deployspec.K8sName(id); k != "dep-"+id[4:] {
		t.Fatalf("k8s name %q", k)
	}
	for in, want := range map[string]string{
		"acme":    "ws-acme",
		"ws_ACME": "ws-ws-acme-",
		"":        "ws-",
	} {
		got := deployspec.Namespace(in)
		if !strings.HasPrefix(got, want) || len(got) > 63 {
			t.Errorf("Namespace(%q) = %q, want a DNS label starting %q", in, got, want)
		}
	}
	if deployspec.Namespace("ws_a") == deployspec.Namespace("ws-a") {
		t.Fatal("two workspace ids share a namespace")
	}
	long := deployspec.Namespace(strings.Repeat("x", 64))
	if len(long) > 63 {
		t.Fatalf("namespace %q is longer than 63", long)
	}
}

func TestSpecValidationNamesTheField(t *testing.T) {
	good := func() deployspec.Spec {
		return deployspec.Spec{ID: "dep_x", WorkspaceID: "ws", ProjectID: "p", EnvironmentID: "e", AppID: "a", K8sName: "dep-x", K8sNamespace: "ws-ws",
			Replicas: 1, Workload: &clusterv1.Workload{Image: "registry.example.com:5000/team/app:1.2.3", CpuMillicores: 100, MemoryMib: 128, Port: 8080}}
	}
	if err := good().Validate(); err != nil {
		t.Fatal(err)
	}
	for field, mutate := range map[string]func(*deployspec.Spec){
		"image":              func(s *deployspec.Spec) { s.Workload.Image = "Registry/App:latest" },
		"replicas":           func(s *deployspec.Spec) { s.Replicas = 0 },
		"environment_id":     func(s *deployspec.Spec) { s.EnvironmentID = "bad env" },
		"env_vars":           func(s *deployspec.Spec) { s.Workload.EnvVars = map[string]string{"1X": "y"} },
		"port":               func(s *deployspec.Spec) { s.Workload.Port = 70000 },
		"shutdown_signal":    func(s *deployspec.Spec) { s.Workload.ShutdownSignal = "SIGHUP" },
		"healthcheck.path":   func(s *deployspec.Spec) { s.Workload.Healthcheck = &clusterv1.Healthcheck{Path: "healthz"} },
		"healthcheck.method": func(s *deployspec.Spec) { s.Workload.Healthcheck = &clusterv1.Healthcheck{Method: "PUT", Path: "/"} },
		"workload":           func(s *deployspec.Spec) { s.Workload = nil },
	} {
		s := good()
		mutate(&s)
		err := s.Validate()
		if err == nil || !strings.HasPrefix(err.Error(), field+": ") {
			t.Errorf("%s: error %v, want one naming the field", field, err)
		}
	}
}

// TestSpecJournalsItsWorkload: a Spec's JSON (what the deploy workflow
// journals) round-trips its workload, and a Spec journaled by the
// previous release (the workload's fields at its top level) reads back
// with them as its workload.
func TestSpecJournalsItsWorkload(t *testing.T) {
	s := deployspec.Spec{ID: "dep_x", Replicas: 2, Workload: &clusterv1.Workload{Image: "img:1", Command: []string{"run", "--fast"},
		EnvVars: map[string]string{"A": "1"}, CpuMillicores: 300, MemoryMib: 512, Port: 9000, ShutdownSignal: "SIGINT",
		Healthcheck: &clusterv1.Healthcheck{Method: "GET", Path: "/healthz", PeriodSeconds: 5}}}
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	var back deployspec.Spec
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if back.ID != s.ID || back.Replicas != 2 || !proto.Equal(back.Workload, s.Workload) {
		t.Fatalf("round trip of %s: %+v", b, back)
	}
	old := `{"id":"dep_x","replicas":2,"image":"img:1","cpu_millicores":300,"memory_mib":512,"env_vars":{"A":"1"},` +
		`"healthcheck":{"method":"GET","path":"/healthz","period_seconds":5},"port":9000,"command":["run","--fast"],"shutdown_signal":"SIGINT","k8s_name":"dep-x"}`
	var fromOld deployspec.Spec
	if err := json.Unmarshal([]byte(old), &fromOld); err != nil {
		t.Fatal(err)
	}
	if fromOld.K8sName != "dep-x" || !proto.Equal(fromOld.Workload, s.Workload) {
		t.Fatalf("the previous release's form read as %+v, workload %v", fromOld, fromOld.Workload)
	}
}

// TestCreateRequestSetsItsWorkloadOnce: the workload comes from workload
// or from the previous release's top-level fields, never from both, and
// gets its defaults.
func TestCreateRequestSetsItsWorkloadOnce(t *testing.T) {
	w := &clusterv1.Workload{Image: "img:1", Port: 9000}
	for _, req := range []*ctrlv1.CreateDeploymentRequest{{Workload: w}, {Image: "img:1", Port: 9000}} {
		s, err := deployspec.FromCreateRequest("dep_x", req)
		if err != nil {
			t.Fatal(err)
		}
		want := &clusterv1.Workload{Image: "img:1", Port: 9000, CpuMillicores: deployspec.DefaultCPUMillicores, MemoryMib: deployspec.DefaultMemoryMiB,
			ShutdownSignal: deployspec.DefaultShutdownSignal}
		if !proto.Equal(s.Workload, want) || s.Replicas != deployspec.DefaultReplicas {
			t.Fatalf("%v: workload %v, replicas %d; want %v", req, s.Workload, s.Replicas, want)
		}
	}
	if _, err := deployspec.FromCreateRequest("dep_x", &ctrlv1.CreateDeploymentRequest{Workload: w, Image: "img:2"}); err == nil || !strings.HasPrefix(err.Error(), "workload: ") {
		t.Fatalf("workload and a top-level field: %v, want an error naming workload", err)
	}
}

// TestDomainImportsNoStore: the domain model depends on no table, not even
// through another package; the store depends on it.
func TestDomainImportsNoStore(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "krane.dev/ctrl/deployspec").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, pkg := range strings.Fields(string(out)) {
		if pkg == "krane.dev/ctrl/store" || strings.HasPrefix(pkg, "krane.dev/ctrl/store/") {
			t.Errorf("ctrl/deployspec depends on %s; the domain model imports no store", pkg)
		}
	}
}

// TestNamespaceNeverShared: two distinct workspace ids never map to one
// namespace, whatever they look like: the reported pairs (an id shaped like
// another's hashed form), then random ids built to collide (cleaned prefixes
// equal, case and punctuation varied, hash-like tails copied from another
// id's namespace). Every namespace is a DNS-1123 label of at most 63.
func TestNamespaceNeverShared(t *testing.T) {
	for _, pair := range [][2]string{
		{"Acme", "acme-g4bwzwhz"},
		{"acme_prod", strings.TrimPrefix(deployspec.Namespace("acme_prod"), "ws-")},
		{"team.a", strings.TrimPrefix(deployspec.Namespace("team.a"), "ws-")},
		{"ws_a", "ws-a"},
	} {
		if a, b := deployspec.Namespace(pair[0]), deployspec.Namespace(pair[1]); a == b {
			t.Errorf("workspaces %q and %q share namespace %q", pair[0], pair[1], a)
		}
	}
	seen := map[string]string{}
	check := func(id string) {
		ns := deployspec.Namespace(id)
		if len(ns) > 63 || !dnsLabel.MatchString(ns) {
			t.Fatalf("Namespace(%q) = %q: not a DNS-1123 label of at most 63", id, ns)
		}
		if other, ok := seen[ns]; ok && other != id {
			t.Fatalf("workspaces %q and %q share namespace %q", other, id, ns)
		}
		seen[ns] = id
	}
	rng := rand.New(rand.NewPCG(1, 2))
	const alphabet = "aAbB09-_.zZ"
	for range 20000 {
		n := 1 + rng.IntN(70)
		b := make([]byte, n)
		for i := range b {
			b[i] = alphabet[rng.IntN(len(alphabet))]
		}
		id := string(b)
		check(id)
		// The namespace's tail as an id of its own, and the namespace
		// itself: both the shapes that collided.
		ns := deployspec.Namespace(id)
		check(strings.TrimPrefix(ns, "ws-"))
		check(ns)
	}
}

// FuzzNamespace: for any two ids, different ids give different namespaces,
// and each is a DNS-1123 label.
func FuzzNamespace(f *testing.F) {
	f.Add("Acme", "acme-g4bwzwhz")
	f.Add("acme_prod", "acme-prod")
	f.Add("team.a", "team-a")
	f.Fuzz(func(t *testing.T, a, b string) {
		na, nb := deployspec.Namespace(a), deployspec.Namespace(b)
		for _, ns := range []string{na, nb} {
			if len(ns) > 63 || !dnsLabel.MatchString(ns) {
				t.Fatalf("namespace %q is not a DNS-1123 label of at most 63", ns)
			}
		}
		if a != b && na == nb {
			t.Fatalf("workspaces %q and %q share namespace %q", a, b, na)
		}
		// The shape that collided: an id equal to another's namespace tail.
		if tail := strings.TrimPrefix(na, "ws-"); tail != a && deployspec.Namespace(tail) == na {
			t.Fatalf("workspaces %q and %q share namespace %q", a, tail, na)
		}
	})
}

var dnsLabel = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
