// Command demo brings up the whole system on this machine (MySQL, Restate,
// two simulated Kubernetes clusters, ctrl, one krane per region), runs the
// scripted scenario through the CLI, then keeps everything running and says
// how to use it (the CLI, the web console) until Ctrl-C. With -exit (make demo DEMO_EXIT=1) it exits
// after the scenario: 0 when every step had its outcome.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"krane.dev/internal/demo"
	"krane.dev/internal/stack"
	"krane.dev/internal/testenv"
)

func main() {
	exit := flag.Bool("exit", os.Getenv("DEMO_EXIT") == "1", "exit after the scenario instead of keeping the stack running")
	binDir := flag.String("bin", "bin", "directory with ctrl, krane and the plugins (make build)")
	flag.Parse()
	os.Exit(run(*exit, *binDir))
}

func run(exit bool, binDir string) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	begin := time.Now()
	fmt.Println("Starting the Krane demo stack (MySQL, Restate, two simulated clusters, ctrl, two krane hosts)...")
	// Traffic: requests go through a real krane-sentinel to real servers
	// standing in for the simulated pods (internal/sentineltest).
	st, err := stack.Start(ctx, stack.Options{BinDir: binDir, Progress: os.Stdout, Traffic: true})
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo: the stack did not start:", err)
		testenv.StopAll(true)
		return 1
	}
	defer func() { st.Stop(); testenv.StopAll(false) }()
	fmt.Printf("\nStack ready in %s.\n", time.Since(begin).Round(100*time.Millisecond))
	fmt.Printf("Web console: %s (sign in with the operator token %s); open it to watch the scenario live.\n", st.ConsoleURL, st.OperatorToken)

	if err := demo.Scenario(ctx, st, os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "\ndemo: FAILED: %v\n(process logs: %s)\n", err, st.Dir())
		st.Stop()
		testenv.StopAll(true)
		return 1
	}
	fmt.Printf("\nScenario completed in %s (stack start included).\n", time.Since(begin).Round(100*time.Millisecond))
	if exit {
		return 0
	}
	fmt.Print(demo.Usage(st))
	<-ctx.Done()
	fmt.Println("\nStopping every process...")
	return 0
}
