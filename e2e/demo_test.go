package e2e

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"krane.dev/internal/demo"
	"krane.dev/internal/stack"
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

// TestDemoUsageRuns: what `make demo` prints once its scenario is done is
// enough to run the docs' commands against the demo as written: the
// read-only commands it shows (an API client, `ctrl admin` on ctrl's
// database, `krane validate` with each region's settings) run in a plain
// shell with only the settings it exports, and `ctrl admin cluster list`
// lists every cluster of the stack.
func TestDemoUsageRuns(t *testing.T) {
	st := sharedStack(t)
	usage := demo.Usage(st)
	var exports, commands []string
	for _, line := range strings.Split(usage, "\n") {
		line = strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(line, "export "):
			exports = append(exports, line)
		case strings.HasPrefix(line, "ctrl admin cluster list"), strings.HasPrefix(line, "ctrl admin token list"),
			strings.HasPrefix(line, "ctrl deploy list"), strings.HasPrefix(line, "env ") && strings.Contains(line, " krane validate -c "):
			commands = append(commands, line)
		}
	}
	if len(exports) != 3 || len(commands) != 3+len(st.Clusters) {
		t.Fatalf("the demo's usage has %d exports and %d read-only commands, want 3 and %d:\n%s", len(exports), len(commands), 3+len(st.Clusters), usage)
	}
	// A shell with none of the stack's settings: only what the usage says.
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "CTRL_") && !strings.HasPrefix(kv, "KRANE_") {
			env = append(env, kv)
		}
	}
	for _, c := range commands {
		cmd := exec.Command("bash", "-euo", "pipefail", "-c", strings.Join(append(exports, c), "\n"))
		cmd.Env, cmd.Dir = env, t.TempDir()
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Errorf("`%s` with the demo's settings: %v\n%s", c, err, out)
			continue
		}
		if strings.HasPrefix(c, "ctrl admin cluster list") {
			for region := range st.Clusters {
				if !strings.Contains(string(out), stack.ClusterID(region)) {
					t.Errorf("ctrl admin cluster list does not list %s:\n%s", stack.ClusterID(region), out)
				}
			}
		}
	}
}
