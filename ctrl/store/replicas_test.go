package store_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestReplicasReadWhileReplicasRecord: ctrl replicas record their reads of
// the revoked tokens while a `ctrl admin token revoke` lists them (which
// also forgets silent ones). Under MySQL's row locks these statements can
// deadlock each other; none may fail for it: each is run again (a revoke
// failed with "Deadlock found" on a loaded e2e run). Seeded.
func TestReplicasReadWhileReplicasRecord(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	started := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, 1000)
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(seed), uint64(w)))
			for i := range 150 {
				var err error
				if w%2 == 0 {
					// A replica's poll, some of them long silent (so the
					// lister's delete has rows to take).
					id := fmt.Sprintf("replica-%d-%d", w, rng.IntN(20))
					err = s.RecordRevocationsRead(ctx, id, "v0.2.0", started, time.Now())
					if err == nil && i%10 == 0 {
						// The test's own aging of a row may be a deadlock's
						// victim too: run it until it is not.
						for {
							_, err = s.DB().ExecContext(ctx, "UPDATE ctrl_replicas SET seen_at = seen_at - 7200000 WHERE id = ?", id)
							if err == nil || !strings.Contains(err.Error(), "Error 1213") {
								break
							}
						}
					}
				} else {
					_, _, err = s.Replicas(ctx)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
