package bench

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// microBenchmarks are the Go benchmarks of the hot paths, each module's
// run from its own module (the sdk is a module of its own).
var microBenchmarks = []struct {
	module string // directory under the repository's root
	pkgs   []string
}{
	{"sdk", []string{"./kube"}},
	{".", []string{"./host/syncer", "./plugins/deployment/controller", "./plugins/cilium/controller"}},
}

// Micro runs the Go micro-benchmarks of the hot paths (go test -bench,
// 2,000 iterations each; a smoke run: one) and records each one's time
// per operation.
func Micro(ctx context.Context, e *Env) ([]Figure, error) {
	benchtime := fmt.Sprintf("%dx", e.size(2000, 1))
	var figs []Figure
	for _, m := range microBenchmarks {
		args := append([]string{"-C", filepath.Join(e.Root, m.module), "test", "-run", "^$", "-bench", ".", "-benchmem", "-benchtime", benchtime}, m.pkgs...)
		cmd := exec.CommandContext(ctx, "go", args...)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			return nil, fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, out.String())
		}
		fs, err := parseBenchmarks(out.String())
		if err != nil {
			return nil, err
		}
		if len(fs) == 0 {
			return nil, fmt.Errorf("go %s printed no benchmark:\n%s", strings.Join(args, " "), out.String())
		}
		for _, f := range fs {
			e.logf("micro: %s: %s", f.Name, value(f))
		}
		figs = append(figs, fs...)
	}
	return figs, nil
}

// parseBenchmarks reads go test -bench output: a figure per benchmark
// line, in µs per operation, keyed by package and benchmark.
func parseBenchmarks(out string) ([]Figure, error) {
	var figs []Figure
	pkg := ""
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		if p, ok := strings.CutPrefix(line, "pkg: "); ok {
			pkg = strings.TrimSpace(p)
			continue
		}
		f := strings.Fields(line)
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") || f[3] != "ns/op" {
			continue
		}
		name := f[0]
		if i := strings.LastIndexByte(name, '-'); i > 0 {
			if _, err := strconv.Atoi(name[i+1:]); err == nil {
				name = name[:i] // the GOMAXPROCS suffix
			}
		}
		ns, err := strconv.ParseFloat(f[2], 64)
		if err != nil {
			return nil, fmt.Errorf("benchmark line %q: %w", line, err)
		}
		note := ""
		for i := 4; i+1 < len(f); i += 2 {
			if f[i+1] == "B/op" || f[i+1] == "allocs/op" {
				if note != "" {
					note += ", "
				}
				note += f[i] + " " + f[i+1]
			}
		}
		short := strings.TrimPrefix(pkg, "krane.dev/")
		figs = append(figs, Figure{Key: short + "." + strings.TrimPrefix(name, "Benchmark"), Name: pkg + " " + name, Value: ns / 1000, Unit: "µs/op", Note: note})
	}
	return figs, sc.Err()
}

// builtBinaries are the binaries make build builds, with their module
// and package; target is the stripped size each must stay within (MB),
// 0 for none.
var builtBinaries = []struct {
	name, module, pkg string
	target            float64
}{
	{"krane", ".", "./cmd/krane", 0},
	{"ctrl", ".", "./cmd/ctrl", 0},
	{"krane-plugin-deployment", ".", "./plugins/deployment", 45},
	{"krane-plugin-sentinel", ".", "./plugins/sentinel", 45},
	{"krane-plugin-cilium", ".", "./plugins/cilium", 45},
	{"krane-plugin-configmap", "sdk", "./examples/configmap", 40},
}

// Binaries builds every binary as make build does (-trimpath, -s -w:
// stripped) and records its size (a smoke run: the example plugin only).
func Binaries(ctx context.Context, e *Env) ([]Figure, error) {
	dir, err := os.MkdirTemp("", "krane-bench-bin-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	var figs []Figure
	for _, b := range builtBinaries {
		if e.Small && b.name != "krane-plugin-configmap" {
			continue
		}
		out := filepath.Join(dir, b.name)
		args := []string{"-C", filepath.Join(e.Root, b.module), "build", "-trimpath", "-ldflags", "-s -w", "-o", out, b.pkg}
		if msg, err := exec.CommandContext(ctx, "go", args...).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, msg)
		}
		st, err := os.Stat(out)
		if err != nil {
			return nil, err
		}
		f := Figure{Key: b.name, Name: b.name + ", stripped", Value: float64(st.Size()) / 1e6, Unit: "MB"}
		if b.target > 0 {
			f.Target = AtMost(b.target)
		}
		e.logf("binaries: %s %s", f.Name, value(f))
		figs = append(figs, f)
	}
	return figs, nil
}
