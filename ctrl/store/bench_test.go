package store_test

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"

	"krane.dev/ctrl/store"
	"krane.dev/internal/testenv"
)

// writers is the concurrency of the write-path benchmarks: many operators
// and workflow steps writing at once.
const writers = 64

// seedScaleRows writes one deployment per writer, each with a topology row
// in one region, for the scale benchmarks to rewrite.
func seedScaleRows(b *testing.B, s *store.Store) []string {
	b.Helper()
	ctx := context.Background()
	ids := make([]string, writers)
	for i := range ids {
		ids[i] = fmt.Sprintf("bench-%02d", i)
		if _, err := s.WriteTx(ctx, func(ctx context.Context, tx *store.Tx) error {
			if err := putDeployment(ctx, tx, ids[i], fmt.Sprintf("r%d", i%20), "img:1", 1, "running"); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "UPDATE deployments SET status = 'ready' WHERE id = ?", ids[i])
			return err
		}); err != nil {
			b.Fatal(err)
		}
	}
	return ids
}

// runWriters runs b.N writes spread over `writers` goroutines, each on its
// own deployment, and reports writes/s.
func runWriters(b *testing.B, ids []string, write func(ctx context.Context, id string, replicas int32) error) {
	b.Helper()
	var next atomic.Int64
	var worker atomic.Int32
	var failed atomic.Int64
	b.SetParallelism(max(1, writers/runtime.GOMAXPROCS(0)))
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		id := ids[int(worker.Add(1)-1)%len(ids)]
		ctx := context.Background()
		for pb.Next() {
			if err := write(ctx, id, int32(2+next.Add(1)%500)); err != nil {
				if failed.Add(1) == 1 {
					b.Log(err)
				}
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "writes/s")
	b.ReportMetric(float64(failed.Load()), "failed")
}

// BenchmarkScaleWrite is what ScaleDeployment writes, from 64 writers:
// the deployment's replicas, its running topology rows (stamped with new
// versions), and an event. (`make bench` compares the same through the
// operator API with the database's throughput for these rows unversioned.)
func BenchmarkScaleWrite(b *testing.B) {
	dsn := testenv.SharedMySQL(b).Database(b, b.Name())
	s := openDSN(b, dsn, store.PoolOptions{})
	ids := seedScaleRows(b, s)
	for _, mode := range []struct {
		name string
		s    *store.Store
	}{{"group-commit", s}, {"one-transaction-each", openDSN(b, dsn, store.PoolOptions{MaxWriteBatch: 1})}} {
		b.Run(mode.name, func(b *testing.B) {
			s := mode.s
			before := s.WriteStats()
			runWriters(b, ids, func(ctx context.Context, id string, replicas int32) error {
				_, err := s.WriteTx(ctx, func(ctx context.Context, tx *store.Tx) error {
					if _, err := tx.LockDeploymentToScale(ctx, id); err != nil {
						return err
					}
					if _, err := tx.ScaleTopology(ctx, id, replicas); err != nil {
						return err
					}
					return tx.RecordEvent(ctx, id, "ready", "scaled")
				})
				return err
			})
			st := s.WriteStats()
			batched, batches, solo := st.Batched-before.Batched, st.Batches-before.Batches, st.Solo-before.Solo
			b.ReportMetric(float64(batched+solo)/max(1, float64(batches+solo)), "writes/tx")
			b.ReportMetric(float64(st.Retries+st.Fallbacks-before.Retries-before.Fallbacks), "retries")
		})
	}
}
