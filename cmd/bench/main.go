// Command bench measures what Krane exists for, side by side with the
// limit it is compared with, on this machine: `make bench`. It prints a
// table and writes bench/results.json.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
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
	only := flag.String("only", "", "comma-separated measurements to run (default all): "+strings.Join(names(), ","))
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	started := time.Now()
	region := "bench-a"
	st, err := stack.Start(ctx, stack.Options{BinDir: *bin, Regions: []string{region}, Progress: os.Stdout})
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
	for _, m := range measurements {
		if *only != "" && !strings.Contains(","+*only+",", ","+m.name+",") {
			continue
		}
		begin := time.Now()
		fmt.Printf("==> %s\n", m.name)
		f, err := m.run(ctx, env)
		if err != nil {
			fmt.Fprintf(os.Stderr, "bench: %s: %v\n", m.name, err)
			failed = true
			continue
		}
		fmt.Printf("==> %s done in %s\n", m.name, time.Since(begin).Round(100*time.Millisecond))
		figs = append(figs, f...)
	}
	s.Close()
	st.Stop()
	fmt.Println()
	bench.Print(os.Stdout, figs)
	if err := bench.WriteJSON(*out, figs, started); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		failed = true
	}
	fmt.Printf("\n%d figures in %s; written to %s\n", len(figs), time.Since(started).Round(time.Second), *out)
	testenv.StopAll(failed)
	if failed {
		os.Exit(1)
	}
}

var measurements = []struct {
	name string
	run  func(context.Context, *bench.Env) ([]bench.Figure, error)
}{
	{"pluginhop", bench.PluginHop},
	{"versions", bench.Versions},
	{"watch", bench.WatchBootstrap},
	{"propagation", bench.Propagation},
	{"rollout", bench.Rollout},
	{"bootstrap", bench.Bootstrap},
}

func names() []string {
	var out []string
	for _, m := range measurements {
		out = append(out, m.name)
	}
	return out
}
