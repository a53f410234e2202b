package compat_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"krane.dev/internal/compat"
)

// TestWireOnlyGrows: buf breaking (WIRE_JSON, buf.yaml) finds nothing
// between the baseline's protocols and this tree's.
func TestWireOnlyGrows(t *testing.T) {
	root, src, r := baseline(t)
	buf, err := compat.Buf(root)
	if err != nil {
		t.Fatal(err)
	}
	found, err := compat.BufBreaking(context.Background(), buf, root, src)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range found {
		t.Errorf("against %s: %s", r.Version, f)
	}
}

// TestNoBoundTightensOnWhatHostsSend: no bound on a field krane hosts send
// refuses what the baseline accepted, unless tightenings.txt allows it
// (and every entry there is used).
func TestNoBoundTightensOnWhatHostsSend(t *testing.T) {
	root, src, r := baseline(t)
	got := tightenings(t, root, src, root)
	allowed, err := compat.AllowedTightenings(root)
	if err != nil {
		t.Fatal(err)
	}
	used := map[string]bool{}
	for _, tt := range got {
		if _, ok := allowed[tt.String()]; ok {
			used[tt.String()] = true
			continue
		}
		t.Errorf("against %s, a bound tightened on a field krane hosts send: %s (hosts of %s may send what it now refuses: loosen it, or if every host in the window sends within it, say so in internal/compat/tightenings.txt)", r.Version, tt, r.Version)
	}
	for entry := range allowed {
		if !used[entry] {
			t.Errorf("internal/compat/tightenings.txt allows %q, which no longer tightens anything: remove the entry", entry)
		}
	}
}

func tightenings(t *testing.T, root, baseTree, curTree string) []compat.Tightening {
	t.Helper()
	buf, err := compat.Buf(root)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	base, err := compat.Descriptors(ctx, buf, baseTree)
	if err != nil {
		t.Fatal(err)
	}
	cur, err := compat.Descriptors(ctx, buf, curTree)
	if err != nil {
		t.Fatal(err)
	}
	got, err := compat.Tightenings(base, cur)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// protoCopy copies this tree's protocols (buf.yaml, proto/, third_party/)
// into a temporary directory with edit applied to cluster.proto.
func protoCopy(t *testing.T, root string, edit func(string) string) string {
	t.Helper()
	dir := t.TempDir()
	for _, rel := range []string{"proto", "third_party"} {
		if err := os.CopyFS(filepath.Join(dir, rel), os.DirFS(filepath.Join(root, rel))); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(filepath.Join(root, "buf.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "buf.yaml"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "proto", "krane", "cluster", "v1", "cluster.proto")
	src, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	edited := edit(string(src))
	if edited == string(src) {
		t.Fatal("the edit changed nothing")
	}
	if err := os.WriteFile(p, []byte(edited), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestWireGatesNegativeControls: a removed field fails buf breaking, and a
// tightened bound on a field hosts send fails the bounds gate.
func TestWireGatesNegativeControls(t *testing.T) {
	root, src, _ := baseline(t)
	buf, err := compat.Buf(root)
	if err != nil {
		t.Fatal(err)
	}
	removed := protoCopy(t, root, func(s string) string {
		return strings.Replace(s, "  bool host_report = 5;\n", "", 1)
	})
	found, err := compat.BufBreaking(context.Background(), buf, removed, src)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(strings.Join(found, "\n"), "host_report") {
		t.Errorf("a removed field: buf breaking said %v; want it named", found)
	}
	noRPC := protoCopy(t, root, func(s string) string {
		i := strings.Index(s, "  rpc Heartbeat(")
		if i < 0 {
			return s
		}
		return s[:i] + s[i+strings.Index(s[i:], "\n")+1:]
	})
	found, err = compat.BufBreaking(context.Background(), buf, noRPC, src)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(strings.Join(found, "\n"), "Heartbeat") {
		t.Errorf("a removed RPC: buf breaking said %v; want it named", found)
	}
	tightened := protoCopy(t, root, func(s string) string {
		return strings.Replace(s, "string agent_version = 1 [(buf.validate.field).string.max_bytes = 128];", "string agent_version = 1 [(buf.validate.field).string.max_bytes = 64];", 1)
	})
	got := tightenings(t, root, src, tightened)
	if len(got) != 1 || got[0].String() != "krane.cluster.v1.HeartbeatRequest.agent_version: string.max_bytes 128 -> 64" {
		t.Errorf("a tightened max_bytes: the gate found %v", got)
	}
	loosened := protoCopy(t, root, func(s string) string {
		return strings.Replace(s, "string agent_version = 1 [(buf.validate.field).string.max_bytes = 128];", "string agent_version = 1 [(buf.validate.field).string.max_bytes = 256];", 1)
	})
	if got := tightenings(t, root, src, loosened); len(got) != 0 {
		t.Errorf("a loosened max_bytes: the gate found %v; want nothing", got)
	}
}
