package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"krane.dev/ctrl/store"
	"krane.dev/internal/stack"
)

// Measurement is one section of the bench.
type Measurement struct {
	// Name names the measurement (-only) and its section in results.json.
	Name string
	// Stack is what it runs against.
	Stack Needs
	Run   func(context.Context, *Env) ([]Figure, error)
}

// Needs says what a measurement runs against.
type Needs int

const (
	// NoStack: the repository alone (micro-benchmarks, binary sizes).
	NoStack Needs = iota
	// CtrlOnly: ctrl, MariaDB and Restate, no cluster.
	CtrlOnly
	// WholeStack: a cluster and its krane too.
	WholeStack
)

// Measurements are what `make bench` measures, in order.
var Measurements = []Measurement{
	{"micro", NoStack, Micro},
	{"binaries", NoStack, Binaries},
	{"pluginhop", WholeStack, PluginHop},
	{"versions", CtrlOnly, Versions},
	{"watch", CtrlOnly, WatchBootstrap},
	{"propagation", WholeStack, Propagation},
	{"repair", WholeStack, DriftRepair},
	{"rollout", WholeStack, Rollout},
	{"bootstrap", WholeStack, Bootstrap},
	{"memory", WholeStack, Memory},
	{"writes", CtrlOnly, Writes},
	{"migration", NoStack, Migration},
	{"sentinel", NoStack, SentinelProxy},
	{"sentinelswitch", NoStack, SentinelSwitch},
}

// FleetMeasurements are what `make bench-fleet` measures.
//
// Its write-path section is named apart from make bench's: the same
// measurement, here with ctrl, MariaDB and Restate alone on the machine,
// there with the clusters' stack (API servers, krane, plugins) beside
// them, so the two figures differ and both are kept.
var FleetMeasurements = []Measurement{
	{"writes-alone", CtrlOnly, Writes},
	{"series", CtrlOnly, MetricSeries},
	{"fleet", CtrlOnly, FleetMeasurement},
}

// SmokeMeasurements are every measurement of make bench and make
// bench-fleet, each once: what make bench-smoke runs (at small sizes).
func SmokeMeasurements() []Measurement {
	out := slices.Clone(Measurements)
	for _, m := range FleetMeasurements {
		if !slices.ContainsFunc(out, func(o Measurement) bool { return o.Name == m.Name }) {
			out = append(out, m)
		}
	}
	return out
}

// Names lists measurements' names.
func Names(ms []Measurement) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.Name)
	}
	return out
}

// Env is what measurements run against.
type Env struct {
	// St is the stack (nil when no measurement of the run needs one),
	// Store its database.
	St     *stack.Stack
	Store  *store.Store
	Region string
	Out    io.Writer
	// Bin is the directory of the binaries the stack runs (make build).
	Bin string
	// Root is the repository's root (for builds and go test).
	Root string
	// Small makes every measurement run once, at small sizes: a smoke run
	// that proves each works and says nothing about speed.
	Small bool
	// Fleet shapes the fleet measurement.
	Fleet FleetOptions
}

func (e *Env) logf(format string, args ...any) {
	fmt.Fprintf(e.Out, "    "+format+"\n", args...)
}

// size is full in a real run and small in a smoke run.
func (e *Env) size(full, small int) int {
	if e.Small {
		return small
	}
	return full
}

// reps is how many times a measurement repeats (figures are medians).
func (e *Env) reps() int { return e.size(3, 1) }

// Options shape a bench run.
type Options struct {
	// Measurements run, in order.
	Measurements []Measurement
	// Bin holds the binaries (make build).
	Bin string
	// Out is the results file the run's sections are merged into; empty:
	// none is written.
	Out string
	// Docs: rewrite the documentation's blocks from Out after writing it.
	Docs bool
	// Small: a smoke run (see Env.Small).
	Small bool
	// Fleet shapes the fleet measurement.
	Fleet FleetOptions
	// Command is recorded as each section's provenance.
	Command string
	// Log receives progress and the table.
	Log io.Writer
}

// Run runs the measurements and returns a section for each that
// succeeded, with its provenance; the error names every one that failed.
// When o.Out is set, the sections are merged into that file (sections of
// measurements not run, or failed, keep their figures and provenance).
func Run(ctx context.Context, o Options) ([]Section, error) {
	if o.Log == nil {
		o.Log = io.Discard
	}
	root, err := repoRoot()
	if err != nil {
		return nil, err
	}
	commit, dirty := gitState(root)
	env := &Env{Region: "bench-a", Out: o.Log, Bin: o.Bin, Root: root, Small: o.Small, Fleet: o.Fleet}
	need := NoStack
	for _, m := range o.Measurements {
		need = max(need, m.Stack)
	}
	if need != NoStack {
		st, err := stack.Start(ctx, stack.Options{BinDir: o.Bin, Regions: []string{env.Region}, CtrlOnly: need == CtrlOnly, Progress: o.Log})
		if err != nil {
			return nil, fmt.Errorf("the stack did not start: %w", err)
		}
		defer st.Stop()
		s, err := store.Open(ctx, st.DSN, store.PoolOptions{})
		if err != nil {
			return nil, err
		}
		defer s.Close()
		env.St, env.Store = st, s
	}
	var secs []Section
	var errs []error
	for _, m := range o.Measurements {
		begin := time.Now()
		fmt.Fprintf(o.Log, "==> %s\n", m.Name)
		m0 := SampleMachine()
		figs, err := m.Run(ctx, env)
		if err == nil && len(figs) == 0 {
			err = errors.New("it produced no figure")
		}
		if err != nil {
			fmt.Fprintf(o.Log, "==> %s FAILED: %v\n", m.Name, err)
			errs = append(errs, fmt.Errorf("%s: %w", m.Name, err))
			continue
		}
		m1 := SampleMachine()
		settle(figs)
		sec := Section{Name: m.Name, Figures: figs, Provenance: Provenance{
			Commit: commit, Dirty: dirty, Started: begin.UTC().Truncate(time.Second), Seconds: float64(time.Since(begin).Round(time.Second) / time.Second),
			Cores: cpus(), LoadAvg: round2((m0.loadavg + m1.loadavg) / 2), BusyCores: round2((m1.busy - m0.busy) / m1.at.Sub(m0.at).Seconds()),
			Command: o.Command,
		}}
		fmt.Fprintf(o.Log, "    machine: load %.1f, %.2f of %d cores busy\n==> %s done in %s\n", sec.Provenance.LoadAvg, sec.Provenance.BusyCores, sec.Provenance.Cores,
			m.Name, time.Since(begin).Round(100*time.Millisecond))
		secs = append(secs, sec)
	}
	fmt.Fprintln(o.Log)
	Print(o.Log, secs)
	if o.Out != "" && len(secs) > 0 {
		r, err := ReadResults(o.Out)
		if err != nil {
			return secs, errors.Join(append(errs, err)...)
		}
		r.Put(secs...)
		if err := r.Write(o.Out); err != nil {
			errs = append(errs, err)
		} else if o.Docs {
			if err := UpdateDocs(root, r); err != nil {
				errs = append(errs, fmt.Errorf("documentation blocks: %w", err))
			}
		}
	}
	return secs, errors.Join(errs...)
}

func round2(v float64) float64 { return float64(int64(v*100+0.5)) / 100 }

// repoRoot is the root of the repository the bench runs in (the module
// root of krane.dev).
func repoRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", errors.New("run the bench from within the repository (no go.mod found)")
	}
	root := filepath.Dir(mod)
	if filepath.Base(root) == "sdk" {
		root = filepath.Dir(root)
	}
	return root, nil
}

// written are the files a bench run writes: changes to them do not make
// the tree dirty for provenance.
var written = append([]string{"bench/results.json"}, DocFiles...)

// gitState is HEAD's commit and whether anything else in the tree changed.
func gitState(root string) (string, bool) {
	out, err := exec.Command("git", "-C", root, "rev-parse", "HEAD").Output()
	if err != nil {
		return "unknown (not a git checkout)", true
	}
	args := []string{"-C", root, "status", "--porcelain", "--untracked-files=no", "--", "."}
	for _, f := range written {
		args = append(args, ":!"+f)
	}
	st, err := exec.Command("git", args...).Output()
	return strings.TrimSpace(string(out)), err != nil || len(strings.TrimSpace(string(st))) > 0
}

// Select returns the measurements of ms named in only (all when empty),
// in ms's order: measurements leave the stack as the next one expects.
func Select(ms []Measurement, only []string) ([]Measurement, error) {
	if len(only) == 0 {
		return ms, nil
	}
	for _, name := range only {
		if !slices.ContainsFunc(ms, func(m Measurement) bool { return m.Name == name }) {
			return nil, fmt.Errorf("no measurement %q (have %s)", name, strings.Join(Names(ms), ", "))
		}
	}
	var out []Measurement
	for _, m := range ms {
		if slices.Contains(only, m.Name) {
			out = append(out, m)
		}
	}
	return out, nil
}
