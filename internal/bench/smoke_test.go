package bench

import (
	"context"
	"os"
	"strings"
	"sync"
	"testing"

	"krane.dev/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// TestSmoke is make bench-smoke: every measurement of make bench and make
// bench-fleet, once, at small sizes, on one stack. It asserts that each
// ran and produced figures, never how fast: a measurement that no longer
// runs fails here, in make test, rather than in the next full bench.
func TestSmoke(t *testing.T) {
	log := &testLog{}
	ms := SmokeMeasurements()
	secs, err := Run(context.Background(), Options{Measurements: ms, Bin: os.Getenv("KRANE_BIN_DIR"), Small: true,
		Fleet: DefaultFleetOptions(), Command: "go test -run TestSmoke ./internal/bench", Log: log})
	if err != nil {
		t.Fatalf("%v\n%s", err, log)
	}
	for i, m := range ms {
		if i >= len(secs) || secs[i].Name != m.Name || len(secs[i].Figures) == 0 {
			t.Fatalf("measurement %s produced no section with figures; sections: %v\n%s", m.Name, secs, log)
		}
	}
	t.Logf("%d measurements ran", len(secs))
}

// testLog keeps the run's output, shown when the test fails.
type testLog struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *testLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *testLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
