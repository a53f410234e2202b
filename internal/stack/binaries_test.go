package stack

import (
	"os"
	"path/filepath"
	"slices"
	"sort"
	"testing"
)

func TestStackNeedsOnlyTheEnabledPlugins(t *testing.T) {
	repo, err := repoFile("krane.hcl")
	if err != nil {
		t.Fatal(err)
	}
	none := filepath.Join(t.TempDir(), "krane.hcl")
	if err := os.WriteFile(none, []byte(`
control_plane {
  url       = "http://127.0.0.1:7070"
  token_env = "KRANE_TOKEN"
}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	names := func(o Options) []string {
		t.Helper()
		need, err := neededBinaries(o)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for n := range need {
			out = append(out, n)
		}
		sort.Strings(out)
		return out
	}
	for _, tc := range []struct {
		name string
		o    Options
		want []string
	}{
		{"no controller enabled", Options{KraneConfig: none, Regions: []string{"a"}}, []string{"ctrl", "krane"}},
		{"the repository's krane.hcl", Options{KraneConfig: repo, Regions: []string{"a"}},
			[]string{"ctrl", "krane", "krane-plugin-cilium", "krane-plugin-deployment", "krane-plugin-sentinel"}},
		{"cilium off in every region", Options{KraneConfig: repo, Regions: []string{"a", "b"}, KraneEnv: map[string][]string{
			"a": {"KRANE_CONTROLLER__CILIUM__ENABLED=false"}, "b": {"KRANE_CONTROLLER__CILIUM__ENABLED=false"}}},
			[]string{"ctrl", "krane", "krane-plugin-deployment", "krane-plugin-sentinel"}},
		{"cilium off in one region", Options{KraneConfig: repo, Regions: []string{"a", "b"}, KraneEnv: map[string][]string{
			"a": {"KRANE_CONTROLLER__CILIUM__ENABLED=false"}}},
			[]string{"ctrl", "krane", "krane-plugin-cilium", "krane-plugin-deployment", "krane-plugin-sentinel"}},
		{"ctrl only", Options{KraneConfig: repo, CtrlOnly: true}, []string{"ctrl"}},
	} {
		if got := names(tc.o); !slices.Equal(got, tc.want) {
			t.Errorf("%s: needs %v, want %v", tc.name, got, tc.want)
		}
	}

	// A bin directory with only ctrl and krane serves a krane.hcl that
	// enables no controller.
	bin := t.TempDir()
	for _, n := range []string{"ctrl", "krane"} {
		if err := os.WriteFile(filepath.Join(bin, n), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	s := &Stack{opts: Options{KraneConfig: none, Regions: []string{"a"}, BinDir: bin}, dir: t.TempDir(), bin: map[string]string{}}
	if err := s.findBinaries(); err != nil {
		t.Fatalf("a stack whose krane.hcl enables no controller asks for more than ctrl and krane: %v", err)
	}
}
