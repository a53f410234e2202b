package bench

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestDocsMatchResults: every figure block of README.md and docs/ is what
// bench/results.json says, and every section there has its provenance.
func TestDocsMatchResults(t *testing.T) {
	r, err := ReadResults("../../bench/results.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := CheckDocs("../..", r); err != nil {
		t.Fatal(err)
	}
	// The tables are blocks: README's Performance table and scaling's
	// fleet table among them.
	for _, f := range []string{"README.md", "docs/scaling.md"} {
		b, err := os.ReadFile(filepath.Join("../..", f))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), markerStart+"figures") && !strings.Contains(string(b), markerStart+"pivot") {
			t.Errorf("%s has no bench figure block", f)
		}
	}
}

func testResults() *Results {
	prov := Provenance{Commit: "0123456789abcdef", Started: time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC), Seconds: 42, Cores: 2, LoadAvg: 1.5, BusyCores: 1.2, Command: "go run ./cmd/bench -bin bin"}
	figs := []Figure{{Key: "p99", Name: "p99", Value: 40, Unit: "ms", Target: Below(500)}, {Key: "p50", Name: "p50", Value: 20.5, Unit: "ms"}}
	grid := []Figure{{Key: "streaming/100/p99", Name: "streaming, 100 clusters: delivery p99", Value: 70, Unit: "ms"},
		{Key: "polling/100/p99", Name: "polling, 100 clusters: delivery p99", Value: 4608, Unit: "ms", Target: Below(100)}}
	settle(figs)
	settle(grid)
	return &Results{Sections: []Section{{Name: "propagation", Provenance: prov, Figures: figs}, {Name: "fleet", Provenance: prov, Figures: grid}}}
}

// docRoot writes a repository of the doc files with blocks, generated
// from r, and returns its root.
func docRoot(t *testing.T, r *Results) string {
	t.Helper()
	root := t.TempDir()
	for _, f := range DocFiles {
		text := "# Title\n\nProse.\n\n<!-- bench:figures propagation -->\nstale\n<!-- bench:end -->\n\n<!-- bench:pivot fleet -->\n<!-- bench:end -->\n<!-- bench:provenance -->\n<!-- bench:end -->\n<!-- bench:cited -->\n<!-- bench:end -->\nMore prose.\n"
		p := filepath.Join(root, f)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := UpdateDocs(root, r); err != nil {
		t.Fatal(err)
	}
	return root
}

// TestCheckDocsFindsAChangedFigure: a figure edited in a block, or in
// results.json, fails the check; regenerated blocks pass it.
func TestCheckDocsFindsAChangedFigure(t *testing.T) {
	r := testResults()
	root := docRoot(t, r)
	if err := CheckDocs(root, r); err != nil {
		t.Fatalf("freshly generated blocks: %v", err)
	}
	readme := filepath.Join(root, "README.md")
	b, _ := os.ReadFile(readme)
	text := string(b)
	for _, want := range []string{"| propagation | p99 | 40.0 ms | < 500 ms: holds |", "| polling, 100 clusters | 4,608 |", "polling, 100 clusters: delivery p99: 4,608 ms; target < 100 ms: **missed**",
		"| propagation | 0123456789ab | 2026-11-27 12:00 | 42s | load 1.5, 1.20 of 2 cores busy | `go run ./cmd/bench -bin bin` |", "karmada.io", "More prose."} {
		if !strings.Contains(text, want) {
			t.Errorf("README lacks %q:\n%s", want, text)
		}
	}
	if strings.Contains(text, "stale") {
		t.Errorf("a block kept its old content:\n%s", text)
	}
	// A hand edit of a figure in a block.
	if err := os.WriteFile(readme, []byte(strings.Replace(text, "40.0 ms", "30.0 ms", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := CheckDocs(root, r); err == nil || !strings.Contains(err.Error(), "README.md") {
		t.Fatalf("a hand-edited figure passed the check: %v", err)
	}
	// A figure of results.json that changed since the blocks were made.
	root = docRoot(t, r)
	r.Sections[0].Figures[1].Value = 21
	if err := CheckDocs(root, r); err == nil {
		t.Fatal("blocks older than results.json passed the check")
	}
}

// TestCheckRefusesSectionsWithoutProvenance: a section without the run
// behind it, or whose holds disagrees with its target, is refused.
func TestCheckRefusesSectionsWithoutProvenance(t *testing.T) {
	r := testResults()
	if err := r.Check(); err != nil {
		t.Fatal(err)
	}
	r.Sections[1].Provenance.Commit = ""
	if err := r.Check(); err == nil || !strings.Contains(err.Error(), `"fleet" lacks provenance`) {
		t.Fatalf("a section without provenance: %v", err)
	}
	r = testResults()
	no := false
	r.Sections[0].Figures[0].Holds = &no
	if err := r.Check(); err == nil || !strings.Contains(err.Error(), "holds") {
		t.Fatalf("a figure whose holds contradicts its target: %v", err)
	}
}

// TestPutKeepsOtherSections: a run of some measurements replaces their
// sections and keeps every other with its provenance, through the file.
func TestPutKeepsOtherSections(t *testing.T) {
	path := filepath.Join(t.TempDir(), "results.json")
	r := testResults()
	if err := r.Write(path); err != nil {
		t.Fatal(err)
	}
	again, err := ReadResults(path)
	if err != nil {
		t.Fatal(err)
	}
	later := Provenance{Commit: "fedcba", Started: time.Date(2026, 11, 28, 0, 0, 0, 0, time.UTC), Cores: 2, Command: "go run ./cmd/bench -only propagation"}
	again.Put(Section{Name: "propagation", Provenance: later, Figures: []Figure{{Key: "p99", Name: "p99", Value: 50, Unit: "ms"}}})
	if err := again.Write(path); err != nil {
		t.Fatal(err)
	}
	got, err := ReadResults(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Sections) != 2 {
		t.Fatalf("%d sections, want 2", len(got.Sections))
	}
	p, _ := got.Section("propagation")
	f, _ := got.Section("fleet")
	if p.Provenance.Commit != "fedcba" || p.Figures[0].Value != 50 || len(p.Figures) != 1 {
		t.Errorf("propagation not replaced: %+v", p)
	}
	if f.Provenance.Commit != "0123456789abcdef" || len(f.Figures) != 2 || !f.Provenance.Started.Equal(r.Sections[1].Provenance.Started) {
		t.Errorf("fleet not kept with its provenance: %+v", f)
	}
}

func TestParseBenchmarks(t *testing.T) {
	out := `goos: linux
goarch: amd64
pkg: krane.dev/sdk/kube
cpu: some cpu
BenchmarkSpecHash-2         	    2000	     11234 ns/op	    1234 B/op	      12 allocs/op
BenchmarkUnchangedCheck     	    2000	     88000 ns/op
PASS
pkg: krane.dev/plugins/deployment/controller
BenchmarkReplicaSetsOfDeployment/index-2   	    2000	       490.5 ns/op
ok  	krane.dev/sdk/kube	1.2s
`
	figs, err := parseBenchmarks(out)
	if err != nil {
		t.Fatal(err)
	}
	want := []Figure{
		{Key: "sdk/kube.SpecHash", Name: "krane.dev/sdk/kube BenchmarkSpecHash", Value: 11.234, Unit: "µs/op", Note: "1234 B/op, 12 allocs/op"},
		{Key: "sdk/kube.UnchangedCheck", Name: "krane.dev/sdk/kube BenchmarkUnchangedCheck", Value: 88, Unit: "µs/op"},
		{Key: "plugins/deployment/controller.ReplicaSetsOfDeployment/index", Name: "krane.dev/plugins/deployment/controller BenchmarkReplicaSetsOfDeployment/index", Value: 0.4905, Unit: "µs/op"},
	}
	if len(figs) != len(want) {
		t.Fatalf("got %+v", figs)
	}
	for i := range want {
		if figs[i] != want[i] {
			t.Errorf("figure %d: got %+v, want %+v", i, figs[i], want[i])
		}
	}
}

func TestFormat(t *testing.T) {
	for v, want := range map[float64]string{0: "0", 0.004: "0.004", 1.234: "1.23", 26.94: "26.9", 453.9: "454", 2514.2: "2,514", 100000: "100,000", 1234567: "1,234,567"} {
		if got := Format(v); got != want {
			t.Errorf("Format(%v) = %q, want %q", v, got, want)
		}
	}
}
