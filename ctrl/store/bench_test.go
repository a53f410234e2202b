package store_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"

	"github.com/go-sql-driver/mysql"

	"krane.dev/ctrl/store"
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

// BenchmarkScaleWrite is what ScaleDeployment writes: the deployment's
// replicas, its running topology rows (stamped with new versions), and an
// event. "raw" writes the same rows in one transaction each without
// versioning: the database's own ceiling for these writes.
func BenchmarkScaleWrite(b *testing.B) {
	s := openStore(b)
	ids := seedScaleRows(b, s)
	b.Run("versioned", func(b *testing.B) {
		runWriters(b, ids, func(ctx context.Context, id string, replicas int32) error {
			_, err := s.WriteTx(ctx, func(ctx context.Context, tx *store.Tx) error {
				if _, err := tx.LockDeployment(ctx, id); err != nil {
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
		b.ReportMetric(float64(st.Batched)/max(1, float64(st.Batches)), "calls/batch")
		b.ReportMetric(float64(st.Retries+st.Fallbacks), "retries")
	})
	b.Run("raw", func(b *testing.B) {
		runWriters(b, ids, func(ctx context.Context, id string, replicas int32) error {
			for {
				err := rawScale(ctx, s.DB(), id, replicas)
				var me *mysql.MySQLError
				if errors.As(err, &me) && me.Number == 1213 {
					continue // deadlock: retried, as WriteTx does
				}
				return err
			}
		})
	})
}

// rawScale writes ScaleDeployment's rows in one transaction, unversioned.
func rawScale(ctx context.Context, db *sql.DB, id string, replicas int32) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	for _, q := range []string{
		"UPDATE deployments SET replicas = ?, updated_at = 0 WHERE id = ?",
		"UPDATE deployment_topology SET desired_replicas = ?, updated_at = 0 WHERE deployment_id = ?",
	} {
		if _, err := tx.ExecContext(ctx, q, replicas, id); err != nil {
			return err
		}
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO deployment_events (deployment_id, seq, status, message, created_at)
SELECT ?, COALESCE(MAX(seq), 0) + 1, 'ready', 'scaled', 0 FROM deployment_events WHERE deployment_id = ?`, id, id); err != nil {
		return err
	}
	return tx.Commit()
}
