package e2e

import (
	"context"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"krane.dev/internal/demo"
)

// lineWriter collects output (and shows it with KRANE_TEST_VERBOSE).
type lineWriter struct {
	t   *testing.T
	mu  sync.Mutex
	buf strings.Builder
}

func (w *lineWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if os.Getenv("KRANE_TEST_VERBOSE") != "" {
		w.t.Log(strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}

// TestDemoScenario runs `make demo`'s scenario on the full stack: real
// binaries, two regions, every step checking its outcome.
func TestDemoScenario(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	st := sharedStack(t)
	out := &lineWriter{t: t}
	begin := time.Now()
	if err := demo.Scenario(ctx, st, out); err != nil {
		t.Fatalf("%v\n--- scenario output ---\n%s", err, out.String())
	}
	t.Logf("scenario done in %s", time.Since(begin).Round(100*time.Millisecond))
}
