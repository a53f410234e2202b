package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"krane.dev/ctrl/store"
	"krane.dev/internal/otlptest"
	"krane.dev/internal/stack"
	"krane.dev/internal/testenv"
)

var (
	stackOnce sync.Once
	shared    *stack.Stack
	stackErr  error
	// traces receives the spans of the shared stack's processes (ctrl,
	// each krane and its plugins export to it through OTEL_*).
	traces *otlptest.Receiver
)

// sharedStack is the package's whole system: two regions, real binaries
// (from KRANE_BIN_DIR when make test sets it, else built), a 5s resync.
// Tests use their own environments so they do not see each other's work.
func sharedStack(t *testing.T) *stack.Stack {
	t.Helper()
	stackOnce.Do(func() {
		if traces, stackErr = otlptest.Start(); stackErr != nil {
			return
		}
		testenv.OnStop(traces.Stop)
		env := append([]string{"KRANE_SYNC__RESYNC_INTERVAL=5s"}, traces.Env()...)
		env = append(env, tokenRenewalEnv...)
		out := &lineWriter{t: t}
		begin := time.Now()
		shared, stackErr = stack.Start(context.Background(), stack.Options{
			BinDir:   os.Getenv("KRANE_BIN_DIR"),
			Progress: out,
			KraneEnv: map[string][]string{"local-a": env, "local-b": env},
			CtrlEnv:  traces.Env(),
			// The demo scenario sends requests through a sentinel.
			Traffic: true,
		})
		if stackErr != nil {
			stackErr = fmt.Errorf("%w\n%s", stackErr, out.String())
			return
		}
		testenv.OnStop(shared.Stop)
		t.Logf("stack ready in %s", time.Since(begin).Round(100*time.Millisecond))
	})
	if stackErr != nil {
		t.Fatal(stackErr)
	}
	return shared
}

// ctrlStore opens ctrl's database (for what no operator API writes).
func ctrlStore(t *testing.T, st *stack.Stack) *store.Store {
	t.Helper()
	s, err := store.Open(context.Background(), st.DSN, store.PoolOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// metric reads one series from a krane's /metrics, -1 when absent.
func metric(t *testing.T, st *stack.Stack, region, series string) float64 {
	t.Helper()
	resp, err := http.Get(st.KraneHTTP[region] + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, series+" ") {
			var v float64
			fmt.Sscanf(strings.TrimPrefix(line, series+" "), "%g", &v)
			return v
		}
	}
	return -1
}
