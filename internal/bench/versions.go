package bench

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"krane.dev/ctrl/restateingress"
	"krane.dev/ctrl/store"
	"krane.dev/ctrl/workflows"
)

// Versions measures VersioningService through Restate, called the way
// ctrl calls it (signed, through the CtrlIngress gateway): 1,000
// concurrent calls of one ref, and 100 concurrent calls of 100 refs
// (median of 3).
func Versions(ctx context.Context, e *Env) ([]Figure, error) {
	single, batches := e.size(1000, 20), e.size(100, 4)
	key, err := e.Store.CtrlKey(ctx, store.RestateIngressKey) // ctrl's calls through Restate's ingress are signed
	if err != nil {
		return nil, err
	}
	c := restateingress.NewIngressClient(e.St.Restate.IngressURL(), key)
	stamp := func(batches [][]workflows.Ref) (float64, error) {
		var wg sync.WaitGroup
		errs := make(chan error, len(batches))
		n := 0
		begin := time.Now()
		for _, b := range batches {
			n += len(b)
			wg.Go(func() {
				if _, err := restateingress.Stamp(ctx, c, b, ""); err != nil {
					errs <- err
				}
			})
		}
		wg.Wait()
		close(errs)
		if err := <-errs; err != nil {
			return 0, err
		}
		return float64(n) / time.Since(begin).Seconds(), nil
	}
	warm, err := e.rows(ctx, "bench.versions.warm", 1)
	if err != nil {
		return nil, err
	}
	if _, err := stamp([][]workflows.Ref{warm}); err != nil {
		return nil, err
	}
	var singles, batched []float64
	for rep := range e.reps() {
		refs, err := e.rows(ctx, fmt.Sprintf("bench.versions.s%d", rep), single)
		if err != nil {
			return nil, err
		}
		bs := make([][]workflows.Ref, len(refs))
		for i := range refs {
			bs[i] = refs[i : i+1]
		}
		r, err := stamp(bs)
		if err != nil {
			return nil, err
		}
		singles = append(singles, r)
		if refs, err = e.rows(ctx, fmt.Sprintf("bench.versions.b%d", rep), batches*100); err != nil {
			return nil, err
		}
		bs = nil
		for i := 0; i < len(refs); i += 100 {
			bs = append(bs, refs[i:i+100])
		}
		if r, err = stamp(bs); err != nil {
			return nil, err
		}
		batched = append(batched, r)
		e.logf("versions: run %d: %.0f/s single, %.0f/s batched", rep+1, singles[rep], batched[rep])
	}
	return []Figure{
		{Key: "single", Name: fmt.Sprintf("VersioningService, %s concurrent calls of 1 ref", Format(float64(single))), Value: median(singles), Unit: "versions/s"},
		{Key: "batched", Name: fmt.Sprintf("VersioningService, %d concurrent calls of 100 refs", batches), Value: median(batched), Unit: "versions/s"},
	}, nil
}

// rows inserts n generic resources (unstamped) and returns their refs.
func (e *Env) rows(ctx context.Context, kind string, n int) ([]workflows.Ref, error) {
	refs := make([]workflows.Ref, n)
	for start := 0; start < n; start += 1000 {
		end := min(start+1000, n)
		var sb strings.Builder
		sb.WriteString("INSERT INTO resources (kind, region, id, spec, created_at, updated_at) VALUES ")
		var args []any
		for i := start; i < end; i++ {
			if i > start {
				sb.WriteString(",")
			}
			sb.WriteString("(?, 'bench-none', ?, '{}', 0, 0)")
			refs[i] = workflows.Ref{Kind: kind, Region: "bench-none", ID: fmt.Sprintf("r%06d", i)}
			args = append(args, kind, refs[i].ID)
		}
		if _, err := e.Store.DB().ExecContext(ctx, sb.String(), args...); err != nil {
			return nil, fmt.Errorf("insert %d rows of kind %s: %w", n, kind, err)
		}
	}
	return refs, nil
}
