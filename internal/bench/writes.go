package bench

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-sql-driver/mysql"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"krane.dev/ctrl/store"
	ctrlv1 "krane.dev/proto/krane/ctrl/v1"
)

// writers is the concurrency of the write-path measurement.
const writers = 64

// writesRuns numbers the runs of Writes in this process.
var writesRuns atomic.Int64

// Writes measures desired-state writes per second through the operator
// API (ScaleDeployment, 64 concurrent callers, each on its own deployment:
// independent writes), and in the same run the database's own throughput
// for the same rows written by 64 connections without versioning (the
// deployment's replicas, its topology row, an event; one transaction
// each). Runs alternate; figures are medians of 3.
func Writes(ctx context.Context, e *Env) ([]Figure, error) {
	// Rows of their own per run: make bench-smoke runs writes and
	// writes-alone on one stack.
	run := writesRuns.Add(1)
	region, prefix := fmt.Sprintf("bench-writes-%d", run), fmt.Sprintf("wr%d", run)
	if err := (bulk{e.Store.DB()}).deployments(ctx, region, fmt.Sprintf("ws-bench-writes-%d", run), prefix, writers, 1); err != nil {
		return nil, err
	}
	ids := make([]string, writers)
	for i := range ids {
		ids[i] = fmt.Sprintf("%s-%05d", prefix, i)
	}
	conn, err := grpc.NewClient(e.St.CtrlAddr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithPerRPCCredentials(bearer(e.St.OperatorToken)))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	api := ctrlv1.NewDeploymentServiceClient(conn)
	// The raw arm gets a connection per writer.
	raw, err := store.Open(ctx, e.St.DSN, store.PoolOptions{MaxOpenConns: writers})
	if err != nil {
		return nil, err
	}
	defer raw.Close()

	d := time.Duration(e.size(8, 1)) * time.Second
	var apiRates, rawRates, batchSizes []float64
	for rep := range e.reps() {
		m0, err := scrape(ctx, e.St.CtrlHTTP+"/metrics")
		if err != nil {
			return nil, err
		}
		r, err := hammer(ctx, ids, d, func(ctx context.Context, id string, replicas int32) error {
			_, err := api.ScaleDeployment(ctx, &ctrlv1.ScaleDeploymentRequest{DeploymentId: id, Replicas: replicas})
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("operator API writes: %w", err)
		}
		m1, err := scrape(ctx, e.St.CtrlHTTP+"/metrics")
		if err != nil {
			return nil, err
		}
		apiRates = append(apiRates, r)
		batches := sum(m1, "krane_ctrl_write_batches_total") - sum(m0, "krane_ctrl_write_batches_total")
		batched := sum(m1, "krane_ctrl_write_batched_total") - sum(m0, "krane_ctrl_write_batched_total")
		solo := sum(m1, "krane_ctrl_write_solo_total") - sum(m0, "krane_ctrl_write_solo_total")
		batchSizes = append(batchSizes, (batched+solo)/max(1, batches+solo))
		if r, err = hammer(ctx, ids, d, func(ctx context.Context, id string, replicas int32) error {
			return rawScale(ctx, raw.DB(), id, replicas)
		}); err != nil {
			return nil, fmt.Errorf("unversioned writes: %w", err)
		}
		rawRates = append(rawRates, r)
		e.logf("writes: run %d: operator API %.0f/s (%.1f writes per transaction), unversioned %.0f/s", rep+1, apiRates[rep], batchSizes[rep], rawRates[rep])
	}
	api50, raw50 := median(apiRates), median(rawRates)
	return []Figure{
		{Key: "api", Name: "ScaleDeployment through the operator API, 64 concurrent callers", Value: api50, Unit: "writes/s", Target: AtLeast(2000)},
		{Key: "batch", Name: "writes per transaction (group commit)", Value: median(batchSizes), Unit: ""},
		{Key: "raw", Name: "the same rows, unversioned, 64 connections straight to MariaDB", Value: raw50, Unit: "writes/s"},
		{Key: "ratio", Name: "operator API / unversioned", Value: api50 / raw50, Unit: "ratio", Target: AtLeast(0.5)},
	}, nil
}

// hammer runs write from `writers` goroutines for d, each on its own
// deployment alternating its replicas between 1 and 2 (every write
// changes the row), and returns writes per second.
func hammer(ctx context.Context, ids []string, d time.Duration, write func(ctx context.Context, id string, replicas int32) error) (float64, error) {
	var n atomic.Int64
	var firstErr error
	var errOnce sync.Once
	var wg sync.WaitGroup
	begin := time.Now()
	end := begin.Add(d)
	for _, id := range ids {
		wg.Go(func() {
			replicas := int32(1)
			for time.Now().Before(end) && ctx.Err() == nil {
				replicas = 3 - replicas // 2, 1, 2, ...
				if err := write(ctx, id, replicas); err != nil {
					errOnce.Do(func() { firstErr = fmt.Errorf("%s: %w", id, err) })
					return
				}
				n.Add(1)
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		return 0, firstErr
	}
	return float64(n.Load()) / time.Since(begin).Seconds(), nil
}

// rawScale writes what ScaleDeployment writes, without versioning: one
// transaction, retried after a deadlock as the store retries its own.
func rawScale(ctx context.Context, db *sql.DB, id string, replicas int32) error {
	for {
		err := rawScaleOnce(ctx, db, id, replicas)
		var me *mysql.MySQLError
		if !errors.As(err, &me) || me.Number != 1213 {
			return err
		}
	}
}

func rawScaleOnce(ctx context.Context, db *sql.DB, id string, replicas int32) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	now := time.Now().UnixMilli()
	if _, err := tx.ExecContext(ctx, "UPDATE deployments SET replicas = ?, updated_at = ? WHERE id = ?", replicas, now, id); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, "UPDATE deployment_topology SET desired_replicas = ?, updated_at = ? WHERE deployment_id = ?", replicas, now, id); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO deployment_events (deployment_id, seq, status, message, created_at)
SELECT ?, COALESCE(MAX(seq), 0) + 1, 'ready', 'scaled', ? FROM deployment_events WHERE deployment_id = ?`, id, now, id); err != nil {
		return err
	}
	return tx.Commit()
}
