package bench

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"krane.dev/ctrl/store"
	"krane.dev/internal/testenv"
)

// Migration measures a backfill on a large table, as a release would run
// it under serving replicas with an asynchronous replica following:
// migration 00040 (deployments' columns into one workload document) as it
// was released, one transaction of one UPDATE over every row, against the
// same change as an expand step (the column added with ALGORITHM=INSTANT)
// and a store.Backfill of the same UPDATE in batches of 1,000 keys. Each
// runs on its own database of N deployments at the schema before 00040,
// on a primary with a replica following it; meanwhile one writer plays a
// serving replica (an UPDATE of a random deployment every 20 ms) and a
// heartbeat row written on the primary every 50 ms is read on the replica
// (the replica's lag: how old the newest heartbeat it applied is).
func Migration(ctx context.Context, e *Env) ([]Figure, error) {
	n := e.size(100_000, 2_000)
	primary, err := testenv.StartReplicableMySQLServer(1)
	if err != nil {
		return nil, err
	}
	defer primary.Stop()
	replica, err := testenv.StartReplicableMySQLServer(2)
	if err != nil {
		return nil, err
	}
	defer replica.Stop()
	if err := replica.Follow(ctx, primary); err != nil {
		return nil, err
	}
	migration, err := os.ReadFile(filepath.Join(e.Root, "ctrl", "store", "migrations", "00040_workload_document.sql"))
	if err != nil {
		return nil, err
	}
	set, err := backfillSet(string(migration))
	if err != nil {
		return nil, err
	}
	var figs []Figure
	for _, form := range []struct {
		key, name string
		run       func(context.Context, *store.Store) error
	}{
		{"one_statement", "00040 as released (one transaction)", func(ctx context.Context, s *store.Store) error { return s.MigrateTo(ctx, 40) }},
		{"batched", "expand step + store.Backfill, batches of 1,000", func(ctx context.Context, s *store.Store) error {
			if _, err := s.DB().ExecContext(ctx, "ALTER TABLE deployments ADD COLUMN workload JSON NULL AFTER replicas, ALGORITHM=INSTANT"); err != nil {
				return err
			}
			_, err := store.Backfill{Table: "deployments", Key: "id", Set: set, Where: "workload IS NULL", Batch: 1000}.Run(ctx, s.DB(), nil)
			return err
		}},
	} {
		r, err := measureBackfill(ctx, e, primary, replica, n, form.key, form.run)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", form.name, err)
		}
		e.logf("migration: %s on %d deployments: %s, replica lag up to %s, a serving write waited up to %s",
			form.name, n, r.took.Round(time.Millisecond), r.lag.Round(time.Millisecond), r.write.Round(time.Millisecond))
		lag := Figure{Key: form.key + "_replica_lag", Name: form.name + ": the replica's lag, max", Value: ms(r.lag), Unit: "ms"}
		write := Figure{Key: form.key + "_write", Name: form.name + ": a serving replica's write meanwhile, longest", Value: ms(r.write), Unit: "ms"}
		if form.key == "batched" {
			lag.Target, write.Target = Below(1000), Below(1000)
		}
		figs = append(figs,
			Figure{Key: form.key + "_time", Name: fmt.Sprintf("%s, %d deployments: time", form.name, n), Value: r.took.Seconds(), Unit: "s"},
			lag, write)
	}
	return figs, nil
}

// backfillSet is the assignment of 00040's UPDATE, so the batched form
// fills exactly what the released migration did.
func backfillSet(migration string) (string, error) {
	const head = "UPDATE deployments SET "
	i := strings.Index(migration, head)
	if i < 0 {
		return "", fmt.Errorf("00040 holds no %q", head)
	}
	rest := migration[i+len(head):]
	j := strings.Index(rest, ";\n")
	if j < 0 {
		return "", fmt.Errorf("00040's UPDATE has no end")
	}
	return rest[:j], nil
}

type backfillRun struct{ took, lag, write time.Duration }

// measureBackfill runs one form of the backfill on a fresh database of n
// deployments at the schema before 00040, with the writer and the lag
// probe running.
func measureBackfill(ctx context.Context, e *Env, primary, replica *testenv.MySQL, n int, name string, run func(context.Context, *store.Store) error) (backfillRun, error) {
	var r backfillRun
	db := "bench_backfill_" + name
	if err := primary.CreateDatabase(db); err != nil {
		return r, err
	}
	s, err := store.Open(ctx, primary.DSN(db), store.PoolOptions{})
	if err != nil {
		return r, err
	}
	defer s.Close()
	if err := s.MigrateTo(ctx, 31); err != nil {
		return r, err
	}
	// What each row carries, about as much as a real deployment: ten
	// variables, a command, a health check.
	if _, err := s.DB().ExecContext(ctx, `INSERT INTO deployments (id, workspace_id, project_id, environment_id, app_id, k8s_namespace, k8s_name,
		image, cpu_millicores, memory_mib, replicas, env_vars, healthcheck, port, command, shutdown_signal, status, created_at, updated_at)
		SELECT CONCAT('dep_', LPAD(seq, 9, '0')), 'ws_bench', 'proj_bench', CONCAT('env_', seq MOD 500), 'app_bench', 'ws-bench', CONCAT('dep-', seq),
		CONCAT('registry.example.com/team/app:', seq), 250, 256, 2,
		JSON_OBJECT('LOG_LEVEL', 'info', 'PORT', '8080', 'REGION', 'eu-west', 'FEATURE_A', 'on', 'FEATURE_B', 'off',
			'DB_POOL', '20', 'CACHE_TTL', '30s', 'TRACE', 'false', 'SERVICE', CONCAT('svc-', seq), 'RELEASE', CONCAT('r', seq)),
		JSON_OBJECT('path', '/healthz', 'method', 'GET', 'port', 8080), 8080, JSON_ARRAY('/bin/app', '--port', '8080'), 'SIGTERM', 'ready', 1, 1
		FROM seq_1_to_`+fmt.Sprint(n)); err != nil {
		return r, fmt.Errorf("fill %d deployments: %w", n, err)
	}
	if _, err := s.DB().ExecContext(ctx, "CREATE TABLE lag_probe (id TINYINT NOT NULL PRIMARY KEY, at DATETIME(6) NOT NULL) ENGINE=InnoDB"); err != nil {
		return r, err
	}
	if err := replica.CatchUp(ctx, primary, 10*time.Minute); err != nil {
		return r, err
	}
	rdb, err := sql.Open("mysql", replica.DSN(db))
	if err != nil {
		return r, err
	}
	defer rdb.Close()

	probeCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var mu sync.Mutex
	wg.Go(func() { // the heartbeat on the primary
		for probeCtx.Err() == nil {
			_, _ = s.DB().ExecContext(probeCtx, "REPLACE INTO lag_probe (id, at) VALUES (1, NOW(6))")
			sleepCtxBench(probeCtx, 50*time.Millisecond)
		}
	})
	wg.Go(func() { // its age on the replica
		for probeCtx.Err() == nil {
			var us sql.NullInt64
			if err := rdb.QueryRowContext(probeCtx, "SELECT TIMESTAMPDIFF(MICROSECOND, at, NOW(6)) FROM lag_probe WHERE id = 1").Scan(&us); err == nil && us.Valid {
				mu.Lock()
				r.lag = max(r.lag, time.Duration(us.Int64)*time.Microsecond)
				mu.Unlock()
			}
			sleepCtxBench(probeCtx, 50*time.Millisecond)
		}
	})
	wg.Go(func() { // a serving replica's writes
		for probeCtx.Err() == nil {
			begin := time.Now()
			id := fmt.Sprintf("dep_%09d", 1+rand.IntN(n))
			if _, err := s.DB().ExecContext(probeCtx, "UPDATE deployments SET updated_at = ? WHERE id = ?", time.Now().UnixMilli(), id); err == nil {
				mu.Lock()
				r.write = max(r.write, time.Since(begin))
				mu.Unlock()
			}
			sleepCtxBench(probeCtx, 20*time.Millisecond)
		}
	})
	begin := time.Now()
	err = run(ctx, s)
	r.took = time.Since(begin)
	if err == nil {
		// The replica's lag is measured until it has applied everything.
		err = replica.CatchUp(ctx, primary, 10*time.Minute)
	}
	stop()
	wg.Wait()
	if err != nil {
		return r, err
	}
	var unfilled int
	if err := s.DB().QueryRowContext(ctx, "SELECT COUNT(*) FROM deployments WHERE workload IS NULL").Scan(&unfilled); err != nil || unfilled != 0 {
		return r, fmt.Errorf("%d deployments left without a workload document (%v)", unfilled, err)
	}
	return r, nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
