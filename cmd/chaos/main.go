// Command chaos runs the whole system under a seeded random schedule of
// faults while desired state churns, then checks that no change was lost
// and prints a report. `make chaos` runs it; CHAOS_DURATION (default 30m)
// and CHAOS_SEED choose the schedule.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"krane.dev/internal/chaos"
	"krane.dev/internal/stack"
	"krane.dev/internal/testenv"
)

func main() {
	duration := flag.Duration("duration", envDuration("CHAOS_DURATION", 30*time.Minute), "length of the fault schedule")
	every := flag.Duration("fault-every", 15*time.Second, "mean time between faults")
	seed := flag.Uint64("seed", envUint("CHAOS_SEED", uint64(time.Now().UnixNano())), "seed of the schedule (printed; reuse it to replay)")
	bin := flag.String("bin", "bin", "directory with ctrl, krane and the plugins")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	fmt.Printf("chaos: %s of faults every ~%s, seed %d\n", *duration, *every, *seed)
	env := append([]string{"KRANE_SYNC__RESYNC_INTERVAL=30s"}, chaos.Env()...)
	st, err := stack.Start(ctx, stack.Options{BinDir: *bin, Progress: os.Stdout, ProxyCtrl: true, ReplicableMySQL: true, CtrlEnv: chaos.CtrlEnv(),
		KraneEnv: map[string][]string{"local-a": env, "local-b": env}})
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos: the stack did not start:", err)
		testenv.StopAll(true)
		os.Exit(1)
	}
	rep, err := chaos.Run(ctx, st, chaos.Options{Duration: *duration, FaultEvery: *every, ChurnEvery: 200 * time.Millisecond,
		Settle: 5 * time.Minute, Seed: *seed, Out: os.Stdout, MinFaults: len(chaos.FaultKinds())})
	st.Stop()
	fmt.Println()
	fmt.Println(rep.String())
	if err != nil || len(rep.Lost) > 0 || missingFaults(rep) {
		if err != nil {
			fmt.Fprintln(os.Stderr, "chaos:", err)
		}
		testenv.StopAll(true)
		os.Exit(1)
	}
	testenv.StopAll(false)
}

func envDuration(key string, def time.Duration) time.Duration {
	if d, err := time.ParseDuration(os.Getenv(key)); err == nil {
		return d
	}
	return def
}

func envUint(key string, def uint64) uint64 {
	if v, err := strconv.ParseUint(os.Getenv(key), 10, 64); err == nil {
		return v
	}
	return def
}

// missingFaults says (and reports whether) a fault type never came.
func missingFaults(rep chaos.Report) bool {
	missing := false
	for _, kind := range chaos.FaultKinds() {
		if rep.Faults[kind] == 0 {
			fmt.Fprintf(os.Stderr, "chaos: fault %s was never injected\n", kind)
			missing = true
		}
	}
	return missing
}
