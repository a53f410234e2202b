package chaos

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"krane.dev/ctrl/store"
	"krane.dev/internal/testenv"
)

// The database going back in time: a restore from an older backup, and a
// failover to an asynchronous replica that had not received the last
// commits. Both follow docs/operating.md, "Backup, restore and failover":
// ctrl is stopped, its database replaced (restored, or a real replica
// promoted), `ctrl admin migrate` and `ctrl admin db restored` run, and
// ctrl started again. The churn goes on between
// the backup (or the moment the replica stopped) and the fault, so the
// clusters run changes the database ctrl comes back on does not hold. Every
// region's krane must bootstrap each kind again; the end of the run holds
// each cluster to what that database holds (the checker reads the database
// ctrl serves from), so a change the database went back past that stays
// applied, or a change issued again at a version a host had seen that is
// skipped, counts as lost.

// restoreFromBackup backs ctrl's database up with mariadb-dump, lets the
// churn go on for a few seconds, then restores the backup into the same
// database.
func restoreFromBackup(ctx context.Context, r *run, _ string) error {
	dsn := r.st.DSN
	dump, err := r.backup(ctx, dsn)
	if err != nil {
		return err
	}
	since := r.ch.changes()
	sleep(ctx, time.Duration(2000+r.rng.IntN(3000))*time.Millisecond)
	return r.goBack(ctx, since, "restored from a backup", func() (string, error) {
		return dsn, load(ctx, dsn, dump)
	})
}

// failoverToLaggingReplica starts a replica of ctrl's MySQL server (a
// second mariadbd following the primary's binary log), waits until it has
// caught up, stops replication, lets the churn go on on the primary for a
// few seconds, then fails ctrl over to the replica: it is promoted (RESET
// SLAVE ALL) and becomes the stack's server, and the old primary is
// stopped, gone as a failed primary is.
func failoverToLaggingReplica(ctx context.Context, r *run, _ string) error {
	primary := r.st.MySQL
	_, db, err := mariadbArgs(r.st.DSN)
	if err != nil {
		return err
	}
	r.dbMoves++
	replica, err := testenv.StartReplicableMySQLServer(r.dbMoves + 1)
	if err != nil {
		return fmt.Errorf("start a replica (the stack's MySQL needs ReplicableMySQL): %w", err)
	}
	if err := replica.Follow(ctx, primary); err != nil {
		return err
	}
	// Like a backup, the replica stops where no deploy workflow is running.
	r.quiet.Lock()
	err = r.workflowsEnded(ctx)
	if err == nil {
		err = replica.CatchUp(ctx, primary, time.Minute)
	}
	if err == nil {
		err = replica.Exec(ctx, "STOP SLAVE")
	}
	r.quiet.Unlock()
	if err != nil {
		return err
	}
	r.logf("the replica %s caught up and stopped replicating", replica.Addr())
	since := r.ch.changes()
	sleep(ctx, time.Duration(2000+r.rng.IntN(3000))*time.Millisecond)
	return r.goBack(ctx, since, "failover to the replica at "+replica.Addr(), func() (string, error) {
		primary.Stop()
		if err := replica.Exec(ctx, "RESET SLAVE ALL"); err != nil {
			return "", err
		}
		r.st.UseMySQL(replica)
		return replica.DSN(db), nil
	})
}

// backup dumps the database at dsn once no deploy workflow is running (a
// restore does not take Restate's workflows back, docs/operating.md: the
// run checks that every deploy ended, so none may straddle the backup).
func (r *run) backup(ctx context.Context, dsn string) ([]byte, error) {
	r.quiet.Lock()
	defer r.quiet.Unlock()
	if err := r.workflowsEnded(ctx); err != nil {
		return nil, err
	}
	args, db, err := mariadbArgs(dsn)
	if err != nil {
		return nil, err
	}
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "mariadb-dump", append(args, "--single-transaction", db)...)
	cmd.Stderr = &stderr
	dump, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("mariadb-dump %s (needs mariadb-client: make deps): %w: %s", db, err, strings.TrimSpace(stderr.String()))
	}
	r.logf("backed up %s: %d bytes", db, len(dump))
	return dump, nil
}

// load loads a dump into the database at dsn.
func load(ctx context.Context, dsn string, dump []byte) error {
	args, db, err := mariadbArgs(dsn)
	if err != nil {
		return err
	}
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "mariadb", append(args, db)...)
	cmd.Stdin, cmd.Stderr = bytes.NewReader(dump), &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("load the dump into %s: %w: %s", db, err, strings.TrimSpace(stderr.String()))
	}
	return nil
}

// goBack replaces ctrl's database by the one replace prepares (returning
// its DSN) with ctrl stopped and the churn held, runs the operator's steps,
// starts ctrl again and waits until every region's krane bootstrapped
// every kind again. Then, the churn still held, every cluster must come to
// hold what that database holds; what differs after settleAfterGoingBack
// is lost. since is the churn's count of changes at the backup (or when
// the replica stopped).
func (r *run) goBack(ctx context.Context, since int, reason string, replace func() (string, error)) error {
	r.quiet.Lock()
	defer r.quiet.Unlock()
	if err := r.workflowsEnded(ctx); err != nil {
		return err
	}
	r.logf("%d changes committed after the backup (or after the replica stopped) are about to be lost", r.ch.changes()-since)
	before := map[string]map[string]float64{}
	for _, region := range regions(r.st) {
		if err := r.ck.waitLeading(ctx, region); err != nil {
			return err
		}
		n, err := rebootstraps(r.st.KraneHTTP[region])
		if err != nil {
			return fmt.Errorf("%s: %w", region, err)
		}
		before[region] = n
	}
	old := r.st.DSN
	r.st.StopCtrl()
	dsn, err := replace()
	if err != nil {
		return err
	}
	r.st.UseDatabase(dsn)
	for _, args := range [][]string{{"admin", "migrate"}, {"admin", "db", "restored", "--reason", reason}} {
		out, err := r.st.Ctrl(ctx, args...)
		if err != nil {
			return err
		}
		r.logf("ctrl %s: %s", strings.Join(args, " "), strings.TrimSpace(string(out)))
	}
	if err := r.st.StartCtrl(); err != nil {
		return fmt.Errorf("ctrl did not start on the database it went back to: %w", err)
	}
	if dsn != old {
		s, err := store.Open(ctx, dsn, store.PoolOptions{})
		if err != nil {
			return err
		}
		r.stores = append(r.stores, s)
		r.ch.mu.Lock()
		r.ch.s = s
		r.ch.mu.Unlock()
		r.ck.s = s
	}
	for _, region := range regions(r.st) {
		err := until(ctx, 2*time.Minute, func() error {
			now, err := rebootstraps(r.st.KraneHTTP[region])
			if err != nil {
				return err
			}
			for kind, n := range now {
				if n <= before[region][kind] {
					return fmt.Errorf("krane %s has not bootstrapped %s again (krane_host_rebootstraps_total %v)", region, kind, n)
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	r.logf("every krane bootstrapped every kind again")
	var mm []string
	progress := time.Now()
	err = until(ctx, settleAfterGoingBack, func() error {
		if mm = r.ck.mismatches(ctx); len(mm) > 0 {
			if time.Since(progress) > 10*time.Second {
				progress = time.Now()
				r.logf("not yet what the database holds: %d differences, e.g. %s", len(mm), mm[0])
			}
			return errors.New(mm[0])
		}
		return nil
	})
	if err != nil {
		r.logf("the clusters did not converge to what the database holds: %d differences", len(mm))
		for _, m := range mm {
			r.lost = append(r.lost, fmt.Sprintf("after %s: %s", reason, m))
		}
		return nil
	}
	r.logf("every cluster holds what the database holds")
	return nil
}

// settleAfterGoingBack bounds the wait for the clusters to hold what the
// database ctrl came back on holds (the end of a run allows as long).
const settleAfterGoingBack = 3 * time.Minute

// rebootstraps is a krane's krane_host_rebootstraps_total by kind, for
// every kind it streams (those with a cursor), 0 where it never counted.
func rebootstraps(base string) (map[string]float64, error) {
	m, err := scrape(base + "/metrics")
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for series := range m {
		if kind, ok := strings.CutPrefix(series, `krane_host_cursor{kind="`); ok {
			kind = strings.TrimSuffix(kind, `"}`)
			out[kind] = m[fmt.Sprintf(`krane_host_rebootstraps_total{kind=%q}`, kind)]
		}
	}
	if len(out) == 0 {
		return nil, errors.New("krane reports no cursor")
	}
	return out, nil
}

// workflowsEnded waits until every deploy through the API has ended.
func (r *run) workflowsEnded(ctx context.Context) error {
	return until(ctx, 4*time.Minute, func() error {
		if running := r.ck.workflows(ctx); len(running) > 0 {
			return fmt.Errorf("before the database goes back: %s", running[0])
		}
		return nil
	})
}

// mariadbArgs are the mariadb clients' connection flags for dsn, and its
// database.
func mariadbArgs(dsn string) (args []string, db string, err error) {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, "", err
	}
	host, port, ok := strings.Cut(cfg.Addr, ":")
	if cfg.Net != "tcp" || !ok {
		return nil, "", fmt.Errorf("ctrl's database is not at a TCP address: %s(%s)", cfg.Net, cfg.Addr)
	}
	args = []string{"--host=" + host, "--port=" + port, "--user=" + cfg.User, "--protocol=tcp"}
	if cfg.Passwd != "" {
		args = append(args, "--password="+cfg.Passwd)
	}
	return args, cfg.DBName, nil
}
