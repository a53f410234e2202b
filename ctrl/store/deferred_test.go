package store_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"krane.dev/ctrl/store"
	"krane.dev/internal/testenv"
)

// seedReady writes ready deployments, each running in region r1 with one
// replica.
func seedReady(t *testing.T, s *store.Store, ids ...string) {
	t.Helper()
	for _, id := range ids {
		if _, err := s.WriteTx(context.Background(), func(ctx context.Context, tx *store.Tx) error {
			if err := putDeployment(ctx, tx, id, "r1", "img:1", 1, "running"); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "UPDATE deployments SET status = 'ready' WHERE id = ?", id)
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
}

// scale is what ScaleDeployment runs in its transaction; before receives
// the replicas the deployment had.
func scale(id string, replicas int32, status, message string, before *int32) func(ctx context.Context, tx *store.Tx) error {
	return scaleWith((*store.Tx).LockDeploymentToScale, id, replicas, status, message, before)
}

// scaleWith is scale with another way to lock the deployment.
func scaleWith(lock func(*store.Tx, context.Context, string) (string, error), id string, replicas int32, status, message string, before *int32) func(ctx context.Context, tx *store.Tx) error {
	return func(ctx context.Context, tx *store.Tx) error {
		if _, err := lock(tx, ctx, id); err != nil {
			return err
		}
		b, err := tx.ScaleTopology(ctx, id, replicas)
		if err != nil {
			return err
		}
		if before != nil {
			*before = b
		}
		return tx.RecordEvent(ctx, id, status, message)
	}
}

// replicasOf is a deployment's replicas and its r1 topology row's.
func replicasOf(t *testing.T, s *store.Store, id string) (deployment, topology int32) {
	t.Helper()
	if err := s.DB().QueryRow("SELECT d.replicas, t.desired_replicas FROM deployments d JOIN deployment_topology t ON t.deployment_id = d.id WHERE d.id = ?", id).Scan(&deployment, &topology); err != nil {
		t.Fatal(err)
	}
	return deployment, topology
}

func history(t *testing.T, s *store.Store, id string) []string {
	t.Helper()
	evs, err := s.DeploymentEvents(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for i, e := range evs {
		if e.Seq != i+1 {
			t.Errorf("%s: history entry %d has seq %d; want consecutive seqs from 1", id, i, e.Seq)
		}
		out = append(out, e.Status+":"+e.Message)
	}
	return out
}

// The writes a batch keeps to send in one statement per table
// (ScaleTopology's, RecordEvent's) read as if each caller's had been sent
// at once: a later caller scaling the same deployment sees the earlier
// scale, a later caller reading the history sees the earlier entries, a
// failing caller's kept writes vanish, and an entry the database refuses
// fails its own caller only.
func TestGroupCommitKeptWritesReadAsSent(t *testing.T) {
	checkLeaks(t)
	s := openBatchStore(t)
	seedReady(t, s, "kw-a", "kw-b", "kw-c")
	var beforeSecond int32
	var seen int
	calls := []call{
		{fn: scale("kw-a", 2, "ready", "first", nil)},
		{fn: scaleWith((*store.Tx).LockDeployment, "kw-a", 3, "ready", "second", &beforeSecond)},
		{fn: func(ctx context.Context, tx *store.Tx) error { // kept writes, then fails
			if err := scale("kw-b", 5, "ready", "dropped", nil)(ctx, tx); err != nil {
				return err
			}
			return errBoom
		}},
		{fn: func(ctx context.Context, tx *store.Tx) error { // reads what the batch kept
			return tx.QueryRow(ctx, "SELECT COUNT(*) FROM deployment_events WHERE deployment_id = 'kw-a'").Scan(&seen)
		}},
		{fn: func(ctx context.Context, tx *store.Tx) error { // kept writes and a write of its own, then fails
			if err := scale("kw-c", 6, "ready", "dropped too", nil)(ctx, tx); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, "UPDATE deployments SET workload = JSON_SET(workload, '$.workload.image', 'img:gone') WHERE id = 'kw-c'"); err != nil {
				return err
			}
			return errBoom
		}},
		{fn: scale("kw-c", 4, "ready", "third", nil)},
	}
	res := runBatch(t, s, calls, nil)
	for _, i := range []int{0, 1, 3, 5} {
		if res[i].err != nil {
			t.Errorf("call %d: %v", i, res[i].err)
		}
	}
	for _, i := range []int{2, 4} {
		if !errors.Is(res[i].err, errBoom) || len(res[i].stamped) != 0 {
			t.Errorf("call %d: %v, %v; want its own error and no versions", i, res[i].stamped, res[i].err)
		}
	}
	if beforeSecond != 2 {
		t.Errorf("the second scale of kw-a saw %d replicas before it; want the first scale's 2", beforeSecond)
	}
	if seen != 2 {
		t.Errorf("a later caller counted %d history entries of kw-a; want the 2 kept before it", seen)
	}
	for id, want := range map[string]int32{"kw-a": 3, "kw-b": 1, "kw-c": 4} {
		if d, tp := replicasOf(t, s, id); d != want || tp != want {
			t.Errorf("%s: deployment %d, topology %d replicas; want %d", id, d, tp, want)
		}
	}
	if got, want := strings.Join(history(t, s, "kw-a"), ","), "ready:first,ready:second"; got != want {
		t.Errorf("kw-a history %q; want %q", got, want)
	}
	if got := history(t, s, "kw-b"); len(got) != 0 {
		t.Errorf("kw-b history %q; a failed caller's entries must vanish", got)
	}
	if got, want := strings.Join(history(t, s, "kw-c"), ","), "ready:third"; got != want {
		t.Errorf("kw-c history %q; want %q", got, want)
	}
	var image string
	if err := s.DB().QueryRow("SELECT JSON_UNQUOTE(JSON_EXTRACT(workload, '$.workload.image')) FROM deployments WHERE id = 'kw-c'").Scan(&image); err != nil || image != "img:1" {
		t.Errorf("kw-c image %q (%v); the failed caller's write must roll back", image, err)
	}
	checkVersions(t, s, res, 3) // the seeding's

	// An entry the database refuses (no such status) is sent with the
	// batch's: the batch runs again one call at a time, and only its
	// caller fails, with an error naming the deployment.
	res = runBatch(t, s, []call{
		{fn: scale("kw-a", 1, "ready", "fourth", nil)},
		{fn: scale("kw-b", 2, "no-such-status", "refused", nil)},
		{fn: scale("kw-c", 1, "ready", "fifth", nil)},
	}, nil)
	if res[0].err != nil || res[2].err != nil {
		t.Fatalf("results %+v; want only the second to fail", res)
	}
	if res[1].err == nil || !strings.Contains(res[1].err.Error(), "kw-b") {
		t.Fatalf("refused entry: %v; want an error naming deployment kw-b", res[1].err)
	}
	if d, tp := replicasOf(t, s, "kw-b"); d != 1 || tp != 1 {
		t.Errorf("kw-b: deployment %d, topology %d replicas; want its failed scale rolled back", d, tp)
	}
	if got, want := strings.Join(history(t, s, "kw-a"), ","), "ready:first,ready:second,ready:fourth"; got != want {
		t.Errorf("kw-a history %q; want %q", got, want)
	}
	if st := s.WriteStats(); st.Fallbacks != 1 {
		t.Errorf("write stats %+v: want one fallback", st)
	}
	checkVersions(t, s, res, 6)
}

// A batch of scales sends one statement per caller (the locking read),
// not one per write: the UPDATEs and history entries of the whole batch
// go in one statement per table. (Without it: seven per caller.)
func TestGroupCommitScaleStatementsPerCaller(t *testing.T) {
	if os.Getenv(testenv.EnvMySQLDSN) != "" {
		t.Skip("the MySQL server is external (" + testenv.EnvMySQLDSN + "): this test counts the server's statements, which only a private server sees alone")
	}
	s := openBatchStore(t)
	const n = 32
	var ids []string
	var calls []call
	for i := range n {
		id := fmt.Sprintf("spc-%02d", i)
		ids = append(ids, id)
		calls = append(calls, call{fn: scale(id, 2, "ready", "scaled", nil)})
	}
	seedReady(t, s, ids...)
	questions := func() int {
		var name string
		var v int
		if err := s.DB().QueryRow("SHOW GLOBAL STATUS LIKE 'Questions'").Scan(&name, &v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	q0 := questions()
	res := runBatch(t, s, calls, nil)
	q := questions() - q0
	for i, r := range res {
		if r.err != nil {
			t.Fatalf("call %d: %v", i, r.err)
		}
	}
	if st := s.WriteStats(); st.Largest != n {
		t.Fatalf("write stats %+v: want one batch of %d", st, n)
	}
	// One per caller, and a handful per batch: begin, the writes, lock,
	// stamp, heads, sequence, commit, and the gate write's and the
	// counting's own.
	if max := n + 20; q > max {
		t.Errorf("%d statements for a batch of %d scales (%.1f per caller); want at most %d", q, n, float64(q)/n, max)
	}
	t.Logf("%d statements for a batch of %d scales (%.2f per caller)", q, n, float64(q)/n)
}

// After LockDeploymentToScale, ScaleTopology changes and versions what it
// does after LockDeployment: the running rows whose replicas differ, not
// stopped rows nor rows already at the count.
func TestScaleAfterEitherLockTouchesTheSameRows(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	for _, lock := range []struct {
		name string
		fn   func(*store.Tx, context.Context, string) (string, error)
	}{{"LockDeployment", (*store.Tx).LockDeployment}, {"LockDeploymentToScale", (*store.Tx).LockDeploymentToScale}} {
		t.Run(lock.name, func(t *testing.T) {
			id := "either-" + strings.ToLower(lock.name)
			if _, err := s.WriteTx(ctx, func(ctx context.Context, tx *store.Tx) error {
				if err := putDeployment(ctx, tx, id, "r1", "img:1", 1, "running"); err != nil {
					return err
				}
				for _, tp := range []store.Topology{
					{DeploymentID: id, Region: "r2", DesiredReplicas: 1, DesiredStatus: "stopped"},
					{DeploymentID: id, Region: "r3", DesiredReplicas: 3, DesiredStatus: "running"},
				} {
					if err := tx.PutTopology(ctx, tp); err != nil {
						return err
					}
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			var before int32
			stamped, err := s.WriteTx(ctx, scaleWith(lock.fn, id, 3, "ready", "scaled", &before))
			if err != nil {
				t.Fatal(err)
			}
			if before != 1 || len(stamped) != 1 || stamped[0].Region != "r1" {
				t.Fatalf("before %d, stamped %v; want 1 and r1 alone", before, stamped)
			}
			rows, err := s.DB().Query("SELECT region, desired_status, desired_replicas FROM deployment_topology WHERE deployment_id = ? ORDER BY region", id)
			if err != nil {
				t.Fatal(err)
			}
			defer rows.Close()
			var got []string
			for rows.Next() {
				var region, st string
				var n int32
				if err := rows.Scan(&region, &st, &n); err != nil {
					t.Fatal(err)
				}
				got = append(got, fmt.Sprintf("%s:%s:%d", region, st, n))
			}
			if want := "r1:running:3,r2:stopped:1,r3:running:3"; strings.Join(got, ",") != want {
				t.Errorf("topology %v; want %s", got, want)
			}
			if d, _ := replicasOf(t, s, id); d != 3 {
				t.Errorf("deployment replicas %d; want 3", d)
			}
		})
	}
}

// TestAFailingCallerCannotUndoAnEarlierKeptScale: a caller whose first
// statements read only its own deployment (a scale kept, then a read of
// that deployment, which takes its savepoint) and which then writes and
// fails must roll back to a savepoint taken after every earlier caller's
// kept writes were sent: the earlier caller's scale, answered success,
// stays. (No caller makes that sequence today; the order makes it
// impossible.)
func TestAFailingCallerCannotUndoAnEarlierKeptScale(t *testing.T) {
	s := openBatchStore(t)
	seedReady(t, s, "sp-a", "sp-b")
	res := runBatch(t, s, []call{
		{fn: scale("sp-a", 3, "ready", "kept", nil)},
		{fn: func(ctx context.Context, tx *store.Tx) error {
			if _, err := tx.LockDeploymentToScale(ctx, "sp-b"); err != nil {
				return err
			}
			if _, err := tx.ScaleTopology(ctx, "sp-b", 7); err != nil {
				return err
			}
			if _, err := tx.LockDeployment(ctx, "sp-b"); err != nil { // sends its own scale: savepoint
				return err
			}
			if _, err := tx.Exec(ctx, "UPDATE deployments SET updated_at = updated_at WHERE id = 'sp-b'"); err != nil {
				return err
			}
			return errBoom
		}},
	}, nil)
	if res[0].err != nil || !errors.Is(res[1].err, errBoom) {
		t.Fatalf("results %+v; want the first answered, the second its own error", res)
	}
	if d, tp := replicasOf(t, s, "sp-a"); d != 3 || tp != 3 {
		t.Errorf("sp-a: deployment %d, topology %d replicas after the later caller failed; want the first caller's 3", d, tp)
	}
	if d, tp := replicasOf(t, s, "sp-b"); d != 1 || tp != 1 {
		t.Errorf("sp-b: deployment %d, topology %d replicas; want the failed caller's scale rolled back", d, tp)
	}
}
