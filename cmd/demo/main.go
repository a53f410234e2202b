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
	"sort"
	"strings"
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
	usage(st)
	<-ctx.Done()
	fmt.Println("\nStopping every process...")
	return 0
}

func usage(st *stack.Stack) {
	var regions []string
	for r := range st.Clusters {
		regions = append(regions, r)
	}
	sort.Strings(regions)
	fmt.Printf(`
The stack keeps running. Use it from another terminal:

  export CTRL_ADDR=%s CTRL_TOKEN=%s
  %s deploy list --environment %s
  %s deploy create --workspace w --project p --app a --environment staging --image nginx:1.27 --wait
  API_KEY=demo %s deploy create --workspace w --project p --app a --environment staging --image nginx:1.27 --secret-env API_KEY --wait

Web console (sign in with the CTRL_TOKEN above):
  %s

Metrics and health:
  ctrl   %s/metrics   %s/readyz
`, st.CtrlAddr, st.OperatorToken, st.Bin("ctrl"), demo.Environment, st.Bin("ctrl"), st.Bin("ctrl"), st.ConsoleURL, st.CtrlHTTP, st.CtrlHTTP)
	for _, r := range regions {
		fmt.Printf("  krane  %s/metrics   %s/readyz   (%s)\n", st.KraneHTTP[r], st.KraneHTTP[r], r)
	}
	fmt.Println("\nKubeconfigs (admin) per region:")
	for _, r := range regions {
		fmt.Printf("  %s: kubectl --kubeconfig %s get pods -A\n", r, st.Clusters[r].Kubeconfig)
	}
	fmt.Printf("\nProcess logs: %s\nPress Ctrl-C to stop everything.\n", strings.TrimSuffix(st.Dir(), "/"))
}
