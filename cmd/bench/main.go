// Command bench measures what Krane exists for, side by side with the
// limit it is compared with, on this machine: `make bench`. It prints a
// table, merges its sections into bench/results.json (each with the
// commit, time, machine load and command that produced it) and rewrites
// the documentation's figure blocks from that file. With -fleet (`make
// bench-fleet`) it measures a fleet of simulated clusters against one ctrl
// instead, in the streaming and the polling design, and the write path.
// With -docs (`make bench-docs`) it only rewrites the blocks from
// results.json. `make bench-smoke` runs every measurement once at small
// sizes (internal/bench's TestSmoke).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"krane.dev/internal/bench"
	"krane.dev/internal/testenv"
)

func main() {
	bin := flag.String("bin", "bin", "directory with ctrl, krane and the plugins (make build)")
	out := flag.String("out", "bench/results.json", "the results file this run's sections are merged into")
	only := flag.String("only", "", "comma-separated measurements to run (default all): "+strings.Join(bench.Names(bench.Measurements), ",")+
		" (with -fleet: "+strings.Join(bench.Names(bench.FleetMeasurements), ",")+"); "+bench.EnvMemoryEnv+" adds environment to krane and its plugins in memory")
	flag.IntVar(&bench.RepairEdits, "repair-edits", bench.RepairEdits, "hand edits per kind in the repair measurement")
	fleetMode := flag.Bool("fleet", false, "measure the fleet (and the write path) on ctrl, MariaDB and Restate alone, no cluster: make bench-fleet")
	docs := flag.Bool("docs", false, "measure nothing: rewrite the documentation's figure blocks from the results file (make bench-docs)")
	fo := bench.DefaultFleetOptions()
	sizes := flag.String("fleet-clusters", joinInts(fo.Clusters), "fleet sizes to measure (a size this machine cannot hold, by memory or file descriptors, is replaced by the largest that fits)")
	arms := flag.String("fleet-arms", strings.Join(fo.Arms, ","), "designs at every size: streaming, polling, streaming-unshared (each stream reading the database itself), streaming-per-report (a transaction per report call); at 1,000 clusters polling and streaming-per-report run too")
	flag.DurationVar(&fo.Window, "fleet-window", fo.Window, "measured time per design and size")
	flag.Float64Var(&fo.Rate, "fleet-rate", fo.Rate, "operator writes per second during the fleet measurement (3,000 and 10,000 clusters run 5/s)")
	flag.IntVar(&fo.Regions, "fleet-regions", fo.Regions, "regions the simulated clusters are spread over")
	stormAt := flag.String("fleet-storm-at", joinInts(fo.StormAt), "fleet sizes whose streaming arm ends with a reconnect storm (ctrl restarted under every stream)")
	profileAt := flag.String("fleet-profile-at", joinInts(fo.ProfileAt), "fleet sizes whose streaming arm records ctrl's CPU, mutex, block and goroutine profiles over the window (into $KRANE_BENCH_PROFILES or a temporary directory)")
	flag.Parse()
	if *docs {
		r, err := bench.ReadResults(*out)
		if err == nil {
			err = bench.UpdateDocs(".", r)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		return
	}
	var err error
	if fo.Clusters, err = parseInts(*sizes); err != nil {
		fmt.Fprintln(os.Stderr, "bench: -fleet-clusters:", err)
		os.Exit(2)
	}
	fo.Arms = strings.Split(*arms, ",")
	if fo.StormAt, err = parseInts(*stormAt); err != nil {
		fmt.Fprintln(os.Stderr, "bench: -fleet-storm-at:", err)
		os.Exit(2)
	}
	if fo.ProfileAt, err = parseInts(*profileAt); err != nil {
		fmt.Fprintln(os.Stderr, "bench: -fleet-profile-at:", err)
		os.Exit(2)
	}
	list := bench.Measurements
	if *fleetMode {
		list = bench.FleetMeasurements
	}
	var names []string
	if *only != "" {
		names = strings.Split(*only, ",")
	}
	if list, err = bench.Select(list, names); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
	o := bench.Options{Measurements: list, Bin: *bin, Out: *out, Docs: true, Fleet: fo,
		Command: "go run ./cmd/bench " + strings.Join(os.Args[1:], " "), Log: os.Stdout}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	secs, err := bench.Run(ctx, o)
	fmt.Printf("\n%d sections written to %s\n", len(secs), o.Out)
	testenv.StopAll(err != nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
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
