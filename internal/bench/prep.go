package bench

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"
)

// bulk writes n desired-state rows for a benchmark in one transaction,
// stamping them the way ctrl's store does: versions come from version_seq
// under its row lock, held until commit, and change_heads follows. (The
// store's own WriteTx stamps row by row; for 100,000 rows of test data a
// multi-row insert is faster and keeps the same ordering guarantee.)
type bulk struct {
	db *sql.DB
}

// rowsFunc returns the INSERT statement prefix, the per-row placeholder
// group, and the args of row i given its version.
type rowsFunc func(i int, version uint64) []any

func (b bulk) insert(ctx context.Context, kind, region, prefix, group string, n int, row rowsFunc) error {
	tx, err := b.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	var head uint64
	if err := tx.QueryRowContext(ctx, "SELECT head FROM version_seq WHERE id = 1 FOR UPDATE").Scan(&head); err != nil {
		return fmt.Errorf("lock version_seq: %w", err)
	}
	const chunk = 1000
	for start := 0; start < n; start += chunk {
		end := min(start+chunk, n)
		var sb strings.Builder
		sb.WriteString(prefix)
		args := make([]any, 0, (end-start)*8)
		for i := start; i < end; i++ {
			if i > start {
				sb.WriteString(",")
			}
			sb.WriteString(group)
			args = append(args, row(i, head+uint64(i)+1)...)
		}
		if _, err := tx.ExecContext(ctx, sb.String(), args...); err != nil {
			return fmt.Errorf("insert %s rows: %w", kind, err)
		}
	}
	last := head + uint64(n)
	if _, err := tx.ExecContext(ctx, "UPDATE version_seq SET head = ? WHERE id = 1", last); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO change_heads (region, kind, head) VALUES (?, ?, ?)
ON DUPLICATE KEY UPDATE head = GREATEST(head, VALUES(head))`, region, kind, last); err != nil {
		return err
	}
	return tx.Commit()
}

// deployments inserts n deployments (and their topology in region).
func (b bulk) deployments(ctx context.Context, region, namespace, prefix string, n int, replicas int32) error {
	now := time.Now().UnixMilli()
	tx, err := b.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	for start := 0; start < n; start += 1000 {
		end := min(start+1000, n)
		var sb strings.Builder
		sb.WriteString(`INSERT INTO deployments (id, workspace_id, project_id, environment_id, app_id, k8s_namespace, k8s_name,
replicas, workload, status, created_at, updated_at) VALUES `)
		var args []any
		for i := start; i < end; i++ {
			if i > start {
				sb.WriteString(",")
			}
			sb.WriteString(`(?, 'bench', 'p', 'bench-env', 'a', ?, ?, ?, ?, 'ready', ?, ?)`)
			id := fmt.Sprintf("%s-%05d", prefix, i)
			args = append(args, id, namespace, id, replicas, benchWorkload, now, now)
		}
		if _, err := tx.ExecContext(ctx, sb.String(), args...); err != nil {
			tx.Rollback()
			return fmt.Errorf("insert deployments: %w", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	return b.insert(ctx, "deployment", region,
		"INSERT INTO deployment_topology (deployment_id, region, desired_replicas, desired_status, version, created_at, updated_at) VALUES ",
		"(?, ?, ?, 'running', ?, ?, ?)", n, func(i int, v uint64) []any {
			return []any{fmt.Sprintf("%s-%05d", prefix, i), region, replicas, v, now, now}
		})
}

// sentinels inserts n sentinels in region.
func (b bulk) sentinels(ctx context.Context, region, prefix string, n int) error {
	now := time.Now().UnixMilli()
	return b.insert(ctx, "sentinel", region,
		`INSERT INTO sentinels (id, region, workspace_id, project_id, app_id, environment_id, k8s_name, image, replicas,
cpu_millicores, memory_mib, desired_state, version, created_at, updated_at) VALUES `,
		"(?, ?, 'bench', 'p', 'a', ?, ?, 'registry.local/bench/sentinel:1', 1, 100, 64, 'running', ?, ?, ?)", n, func(i int, v uint64) []any {
			id := fmt.Sprintf("%s-%05d", prefix, i)
			return []any{id, region, "env-" + id, id, v, now, now}
		})
}

// benchWorkload is the deployments.workload document of the benches'
// deployments (ctrl/store's format, version 1).
const benchWorkload = `{"version":1,"workload":{"image":"registry.local/bench/app:1","cpu_millicores":100,"memory_mib":64,"env_vars":{"MODE":"bench"},"port":8080}}`
