// Command bench measures what Krane exists for, side by side with the
// limit it is compared with, on this machine: `make bench`. It prints a
// table and writes bench/results.json. With -fleet (`make bench-fleet`) it
// measures a fleet of simulated clusters against one ctrl instead, in the
// streaming and the polling design, and the write path.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"krane.dev/ctrl/store"
	"krane.dev/internal/bench"
	"krane.dev/internal/stack"
	"krane.dev/internal/testenv"
)

func main() {
	bin := flag.String("bin", "bin", "directory with ctrl, krane and the plugins (make build)")
	out := flag.String("out", "bench/results.json", "where to write the figures")
	only := flag.String("only", "", "comma-separated measurements to run (default all): "+strings.Join(names(), ",")+"; memory runs only when named (bootstrap includes it; "+bench.EnvMemoryEnv+" adds environment to krane and its plugins there)")
	flag.IntVar(&bench.RepairEdits, "repair-edits", bench.RepairEdits, "hand edits per kind in the repair measurement")
	fleetMode := flag.Bool("fleet", false, "measure the fleet (and the write path) on ctrl, MariaDB and Restate alone, no cluster: make bench-fleet")
	fo := bench.DefaultFleetOptions()
	sizes := flag.String("fleet-clusters", joinInts(fo.Clusters), "fleet sizes to measure (a size is skipped when memory is short)")
	arms := flag.String("fleet-arms", strings.Join(fo.Arms, ","), "designs per size: streaming, polling, streaming-unshared (each stream reading the database itself)")
	flag.DurationVar(&fo.Window, "fleet-window", fo.Window, "measured time per design and size")
	flag.Float64Var(&fo.Rate, "fleet-rate", fo.Rate, "operator writes per second during the fleet measurement")
	flag.IntVar(&fo.Regions, "fleet-regions", fo.Regions, "regions the simulated clusters are spread over")
	flag.Parse()
	var err error
	if fo.Clusters, err = parseInts(*sizes); err != nil {
		fmt.Fprintln(os.Stderr, "bench: -fleet-clusters:", err)
		os.Exit(2)
	}
	fo.Arms = strings.Split(*arms, ",")
	list := measurements
	if *only != "" {
		// The memory figures of bootstrap alone, when named: a full run
		// measures them within bootstrap.
		list = append(slices.Clone(measurements), measurement{"memory", bench.Memory})
	}
	if *fleetMode {
		list = []measurement{
			{"writes", bench.Writes},
			{"fleet", func(ctx context.Context, e *bench.Env) ([]bench.Figure, error) { return runFleet(ctx, e, fo) }},
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	started := time.Now()
	region := "bench-a"
	st, err := stack.Start(ctx, stack.Options{BinDir: *bin, Regions: []string{region}, CtrlOnly: *fleetMode, Progress: os.Stdout})
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench: the stack did not start:", err)
		testenv.StopAll(true)
		os.Exit(1)
	}
	s, err := store.Open(ctx, st.DSN, store.PoolOptions{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
	env := &bench.Env{St: st, Store: s, Region: region, Out: os.Stdout}
	var figs []bench.Figure
	failed := false
	for _, m := range list {
		if *only != "" && !strings.Contains(","+*only+",", ","+m.name+",") {
			continue
		}
		begin := time.Now()
		fmt.Printf("==> %s\n", m.name)
		m0 := bench.SampleMachine()
		f, err := m.run(ctx, env)
		if err != nil {
			fmt.Fprintf(os.Stderr, "bench: %s: %v\n", m.name, err)
			failed = true
			continue
		}
		// What else ran: figures of a loaded machine are not a quiet one's.
		load := bench.LoadNote(m0, bench.SampleMachine())
		fmt.Printf("    %s\n", load)
		for i := range f {
			if f[i].Note != "" {
				f[i].Note += "; "
			}
			f[i].Note += load
		}
		fmt.Printf("==> %s done in %s\n", m.name, time.Since(begin).Round(100*time.Millisecond))
		figs = append(figs, f...)
	}
	s.Close()
	st.Stop()
	fmt.Println()
	bench.Print(os.Stdout, figs)
	bench.PrintFleet(os.Stdout, fleetRows)
	extra := map[string]any{}
	if fleetRows != nil {
		extra["fleet"] = fleetRows
	}
	if err := bench.WriteJSON(*out, figs, started, extra); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		failed = true
	}
	fmt.Printf("\n%d figures in %s; written to %s\n", len(figs), time.Since(started).Round(time.Second), *out)
	testenv.StopAll(failed)
	if failed {
		os.Exit(1)
	}
}

type measurement struct {
	name string
	run  func(context.Context, *bench.Env) ([]bench.Figure, error)
}

var measurements = []measurement{
	{"pluginhop", bench.PluginHop},
	{"versions", bench.Versions},
	{"watch", bench.WatchBootstrap},
	{"propagation", bench.Propagation},
	{"repair", bench.DriftRepair},
	{"rollout", bench.Rollout},
	{"bootstrap", bench.Bootstrap},
	{"writes", bench.Writes},
	// The short form of make bench-fleet: 100 clusters, both designs.
	{"fleet", func(ctx context.Context, e *bench.Env) ([]bench.Figure, error) {
		o := bench.DefaultFleetOptions()
		o.Clusters, o.Window = []int{100}, 15*time.Second
		return runFleet(ctx, e, o)
	}},
}

// fleetRows are the fleet table's rows, for results.json.
var fleetRows []bench.FleetRow

func runFleet(ctx context.Context, e *bench.Env, o bench.FleetOptions) ([]bench.Figure, error) {
	figs, rows, err := bench.Fleet(ctx, e, o)
	fleetRows = append(fleetRows, rows...)
	return figs, err
}

func joinInts(xs []int) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, ",")
}

func parseInts(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("%q is not a list of positive numbers", s)
		}
		out = append(out, n)
	}
	return out, nil
}

func names() []string {
	var out []string
	for _, m := range measurements {
		out = append(out, m.name)
	}
	return out
}
