package proxy

import (
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

var seed = flag.Uint64("seed", 0, "seed of the randomized tests (0: time-based, printed)")

// TestRandomSwitchesUnderLoad switches backends at random moments while
// clients send requests, and checks that no request fails and that each is
// served by a backend that was live at some moment during the request.
func TestRandomSwitchesUnderLoad(t *testing.T) {
	s := *seed
	if s == 0 {
		s = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (rerun with -seed %d)", s, s)
	rng := rand.New(rand.NewPCG(s, 1))
	e := newEnv(t, Options{})

	// Backend g (generation) has 1-3 instances answering "g".
	var gen atomic.Int64
	backends := map[int64][]string{}
	mkBackend := func(g int64) []string {
		n := 1 + rng.IntN(3)
		var addrs []string
		for i := 0; i < n; i++ {
			srv := startInstance(t, "", func(w http.ResponseWriter, r *http.Request) {
				if d := r.URL.Query().Get("sleep"); d != "" {
					ms, _ := strconv.Atoi(d)
					time.Sleep(time.Duration(ms) * time.Millisecond)
				}
				_, _ = io.WriteString(w, strconv.FormatInt(g, 10))
			})
			addrs = append(addrs, addr(srv))
		}
		return addrs
	}
	backends[0] = mkBackend(0)
	e.route([]string{"app.example.com"}, "dep_0", backends[0]...)

	const clients, perClient = 6, 40
	sleeps := make([][]int, clients)
	for c := range sleeps {
		for i := 0; i < perClient; i++ {
			sleeps[c] = append(sleeps[c], rng.IntN(20))
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, clients*perClient)
	for c := 0; c < clients; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < perClient; i++ {
				before := gen.Load()
				req, _ := http.NewRequest("GET", e.front.URL+"/?sleep="+strconv.Itoa(sleeps[c][i]), nil)
				req.Host = "app.example.com"
				resp, err := e.client.Do(req)
				if err != nil {
					errs <- err
					continue
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				after := gen.Load()
				g, _ := strconv.ParseInt(string(b), 10, 64)
				if resp.StatusCode != 200 || g < before || g > after {
					errs <- fmt.Errorf("client %d request %d: %d %q, want 200 from a generation in [%d, %d]", c, i, resp.StatusCode, b, before, after)
				}
			}
		}()
	}
	switches := 2 + rng.IntN(6)
	pauses := make([]time.Duration, switches)
	addrsOf := make([][]string, switches)
	for i := range pauses {
		pauses[i] = time.Duration(rng.IntN(60)) * time.Millisecond
		addrsOf[i] = mkBackend(int64(i + 1))
	}
	for i := 0; i < switches; i++ {
		time.Sleep(pauses[i])
		// The new generation's number is published before the switch, so
		// a request that saw the old number may be served by either.
		gen.Store(int64(i + 1))
		_ = e.route([]string{"app.example.com"}, "dep_"+strconv.Itoa(i+1), addrsOf[i]...)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
