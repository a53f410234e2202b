package workflows_test

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"krane.dev/ctrl/internal/ctrltest"
	"krane.dev/ctrl/restateingress"
	"krane.dev/ctrl/workflows"
	"krane.dev/internal/testenv"
)

// insertRows commits n rows of a generic kind without versions, as a
// workflow step writes content before stamping it.
func insertRows(t *testing.T, db *sql.DB, kind string, n int) []workflows.Ref {
	t.Helper()
	refs := make([]workflows.Ref, n)
	var b strings.Builder
	args := make([]any, 0, n*3)
	b.WriteString("INSERT INTO resources (kind, region, id, spec, created_at, updated_at) VALUES ")
	for i := range n {
		refs[i] = workflows.Ref{Kind: kind, Region: "eu", ID: fmt.Sprintf("r%05d", i)}
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString("(?, ?, ?, '{}', 0, 0)")
		args = append(args, kind, "eu", refs[i].ID)
	}
	if _, err := db.Exec(b.String(), args...); err != nil {
		t.Fatal(err)
	}
	return refs
}

// stampAll stamps batches concurrently (one call per batch) and returns
// every version handed out.
func stampAll(t *testing.T, c *restateingress.Ingress, batches [][]workflows.Ref) ([]uint64, time.Duration) {
	t.Helper()
	var (
		mu       sync.Mutex
		versions []uint64
		wg       sync.WaitGroup
		errs     = make(chan error, len(batches))
	)
	begin := time.Now()
	for _, batch := range batches {
		wg.Go(func() {
			resp, err := restateingress.Stamp(context.Background(), c, batch, "")
			if err != nil {
				errs <- err
				return
			}
			if len(resp.Versions) != len(batch) {
				errs <- fmt.Errorf("%d versions for %d refs", len(resp.Versions), len(batch))
				return
			}
			mu.Lock()
			defer mu.Unlock()
			for i, v := range resp.Versions {
				if v.Ref != batch[i] {
					errs <- fmt.Errorf("version %d is for %v, asked for %v", i, v.Ref, batch[i])
				}
				if i > 0 && v.Version != resp.Versions[i-1].Version+1 {
					errs <- fmt.Errorf("a batch got non-consecutive versions %d, %d", resp.Versions[i-1].Version, v.Version)
				}
				versions = append(versions, v.Version)
			}
		})
	}
	wg.Wait()
	took := time.Since(begin)
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	return versions, took
}

// checkContiguous fails unless versions are exactly first..first+n-1 and
// every row carries the version it was given.
func checkContiguous(t *testing.T, db *sql.DB, kind string, versions []uint64) {
	t.Helper()
	sorted := slices.Clone(versions)
	slices.Sort(sorted)
	for i := 1; i < len(sorted); i++ {
		if sorted[i] == sorted[i-1] {
			t.Fatalf("version %d handed out twice", sorted[i])
		}
		if sorted[i] != sorted[i-1]+1 {
			t.Fatalf("gap between versions %d and %d", sorted[i-1], sorted[i])
		}
	}
	var n int
	var lo, hi uint64
	if err := db.QueryRow("SELECT COUNT(*), MIN(version), MAX(version) FROM resources WHERE kind = ?", kind).Scan(&n, &lo, &hi); err != nil {
		t.Fatal(err)
	}
	if n != len(versions) || lo != sorted[0] || hi != sorted[len(sorted)-1] {
		t.Fatalf("rows: %d with versions %d..%d; handed out %d versions %d..%d", n, lo, hi, len(versions), sorted[0], sorted[len(sorted)-1])
	}
}

func TestVersioningServiceThousandConcurrentStampsNoGapNoDuplicate(t *testing.T) {
	r := testenv.SharedRestate(t)
	w := newWorld(t, ctrltest.Options{Restate: r})
	db := w.env.Store.DB()

	// Warm up (the SDK compiles its state machine on the first call).
	warm := insertRows(t, db, "test.warm", 1)
	stampAll(t, w.env.Ingress(t, true), [][]workflows.Ref{warm})

	// 1,000 concurrent calls, one ref each.
	single := insertRows(t, db, "test.single", 1000)
	batches := make([][]workflows.Ref, len(single))
	for i := range single {
		batches[i] = single[i : i+1]
	}
	versions, took := stampAll(t, w.env.Ingress(t, true), batches)
	checkContiguous(t, db, "test.single", versions)
	singleRate := float64(len(versions)) / took.Seconds()

	// 100 concurrent calls of 100 refs: 10,000 versions.
	batched := insertRows(t, db, "test.batched", 10000)
	batches = nil
	for i := 0; i < len(batched); i += 100 {
		batches = append(batches, batched[i:i+100])
	}
	versions2, took2 := stampAll(t, w.env.Ingress(t, true), batches)
	checkContiguous(t, db, "test.batched", versions2)
	batchRate := float64(len(versions2)) / took2.Seconds()

	// Both runs together: still one gap-free sequence from 1, one grant
	// per call.
	all := append(append([]uint64{1}, versions...), versions2...)
	checkSequence(t, all)
	var grants int
	if err := db.QueryRow("SELECT COUNT(*) FROM version_grants").Scan(&grants); err != nil {
		t.Fatal(err)
	}
	if grants != 1+1000+100 {
		t.Fatalf("%d version grants, want %d (one per call)", grants, 1+1000+100)
	}
	t.Logf("VersioningService: 1000 concurrent calls of 1 ref in %s = %.0f versions/s; 100 concurrent calls of 100 refs in %s = %.0f versions/s",
		took.Round(time.Millisecond), singleRate, took2.Round(time.Millisecond), batchRate)
}

// checkSequence fails unless vs is a permutation of 1..len(vs).
func checkSequence(t *testing.T, vs []uint64) {
	t.Helper()
	sorted := slices.Clone(vs)
	slices.Sort(sorted)
	for i, v := range sorted {
		if v != uint64(i+1) {
			t.Fatalf("versions are not 1..%d: position %d holds %d", len(vs), i, v)
		}
	}
}

// checkDeployVersions checks the versions a first deploy of an environment
// to two regions hands out: its topology and ingress policies take 1..4 in
// one grant, the two sentinels it creates take 5 and 6, and going live
// changes the sentinels' routes, which re-stamps them at 7 and 8. No
// version is handed out twice and none is skipped.
func checkDeployVersions(t *testing.T, stamped []uint64, sentinels ...uint64) {
	t.Helper()
	checkSequence(t, stamped)
	s := slices.Sorted(slices.Values(sentinels))
	if len(stamped) != 4 || !slices.Equal(s, []uint64{7, 8}) {
		t.Fatalf("stamped %v sentinels %v: want 1..4 stamped and the sentinels at 7 and 8 (created at 5 and 6, re-stamped when their routes named the live deployment)", stamped, sentinels)
	}
}

func TestVersioningServiceIdempotencyKeyReturnsTheSameVersions(t *testing.T) {
	r := testenv.SharedRestate(t)
	w := newWorld(t, ctrltest.Options{Restate: r})
	refs := insertRows(t, w.env.Store.DB(), "test.idem", 3)
	c := w.env.Ingress(t, false)
	ctx := context.Background()
	a, err := restateingress.Stamp(ctx, c, refs, "idem-"+t.Name())
	if err != nil {
		t.Fatal(err)
	}
	b, err := restateingress.Stamp(ctx, c, refs, "idem-"+t.Name())
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(a.Versions, b.Versions) {
		t.Fatalf("a retry with the same idempotency key got %v, first call %v", b.Versions, a.Versions)
	}
	head, err := w.env.Store.Head(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if head != a.Versions[2].Version {
		t.Fatalf("head %d after a repeated call, want %d (no second stamp)", head, a.Versions[2].Version)
	}

	// Bad input is a terminal error naming the problem, not a retry loop.
	_, err = restateingress.Stamp(ctx, c, []workflows.Ref{{Kind: "test.idem", Region: "eu", ID: "missing"}}, "")
	if err == nil || !strings.Contains(err.Error(), "no such row") {
		t.Fatalf("stamping a missing row: %v, want a terminal 'no such row' error", err)
	}
	_, err = restateingress.Stamp(ctx, c, []workflows.Ref{refs[0], refs[0]}, "")
	if err == nil || !strings.Contains(err.Error(), "listed twice") {
		t.Fatalf("stamping a ref twice: %v, want a terminal 'listed twice' error", err)
	}
}
