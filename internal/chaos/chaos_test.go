package chaos_test

import (
	"context"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"krane.dev/internal/chaos"
	"krane.dev/internal/stack"
	"krane.dev/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// logWriter is written by the stack's concurrent start-up steps and the
// chaos loop alike.
type logWriter struct {
	t   *testing.T
	mu  sync.Mutex
	buf strings.Builder
}

func (w *logWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// TestChaosShort is the short chaos run of make test: every fault type at
// least once while desired state churns; nothing may be lost or leaked.
func TestChaosShort(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	out := &logWriter{t: t}
	env := append([]string{"KRANE_SYNC__RESYNC_INTERVAL=10s"}, chaos.Env()...)
	st, err := stack.Start(ctx, stack.Options{BinDir: os.Getenv("KRANE_BIN_DIR"), Progress: out, ProxyCtrl: true, ReplicableMySQL: true, CtrlEnv: chaos.CtrlEnv(),
		KraneEnv: map[string][]string{"local-a": env, "local-b": env}})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Stop()
	rep, err := chaos.Run(ctx, st, chaos.Options{
		Duration: 90 * time.Second, FaultEvery: 7 * time.Second, MinFaults: len(chaos.FaultKinds()), ChurnEvery: 250 * time.Millisecond,
		Settle: 3 * time.Minute, Seed: uint64(time.Now().UnixNano()), Out: out,
	})
	if err != nil {
		t.Fatalf("%v (%s)", err, rep)
	}
	t.Log(rep.String())
	total := 0
	for _, n := range rep.Faults {
		total += n
	}
	if total < len(chaos.FaultKinds()) {
		t.Errorf("%d faults injected, want at least %d", total, len(chaos.FaultKinds()))
	}
	for _, kind := range chaos.FaultKinds() {
		if rep.Faults[kind] == 0 {
			t.Errorf("fault %s was never injected; every kind must be in the short run", kind)
		}
	}
	if len(rep.Lost) > 0 {
		t.Errorf("changes lost or things leaked (seed %d to reproduce):\n%s", rep.Seed, strings.Join(rep.Lost, "\n"))
	}
}
