package e2e

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"os/exec"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/hashicorp/go-hclog"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"krane.dev/ctrl/cli"
	"krane.dev/ctrl/serve"
	"krane.dev/internal/testenv"
	"krane.dev/internal/testenv/kubeenv"
)

// runCtrl runs a real ctrl on the database at dsn, listening for gRPC on
// addr (127.0.0.1:0 for any); stop ends it.
func runCtrl(t *testing.T, dsn, addr string) (srv *serve.Server, stop func()) {
	t.Helper()
	cfg, err := serve.LoadConfig(nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg.DB.DSN = dsn
	cfg.GRPC.Addr, cfg.HTTP.Addr = addr, "127.0.0.1:0"
	cfg.Watch.PollInterval = 20 * time.Millisecond
	cfg.Log.Level, cfg.Log.Format = "warn", "text"
	ctx, cancel := context.WithCancel(context.Background())
	srv, err = serve.Start(ctx, cfg, hclog.NewNullLogger(), serve.Deps{})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	stopped := false
	stop = func() {
		if !stopped {
			stopped = true
			cancel()
			_ = srv.Wait()
		}
	}
	t.Cleanup(stop)
	return srv, stop
}

// mariadbArgs are the connection flags of the mariadb clients for dsn.
func mariadbArgs(t *testing.T, dsn string) (args []string, db string) {
	t.Helper()
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	host, port, ok := strings.Cut(cfg.Addr, ":")
	if cfg.Net != "tcp" || !ok {
		t.Fatalf("the test database is not at a TCP address: %s(%s)", cfg.Net, cfg.Addr)
	}
	args = []string{"--host=" + host, "--port=" + port, "--user=" + cfg.User, "--protocol=tcp"}
	if cfg.Passwd != "" {
		args = append(args, "--password="+cfg.Passwd)
	}
	return args, cfg.DBName
}

// TestRestoredDatabaseConverges: ctrl's database is backed up with
// mariadb-dump, more is deployed (new objects, a change, a delete), and
// the backup is restored while ctrl is down. ctrl comes back on the
// restored database without being told: the host's cursor is ahead of the
// restored head, ctrl refuses it, and the host bootstraps again. The
// cluster converges to exactly what the restored database holds: the
// objects created after the backup are collected, the change and the
// delete are undone, and a change made after the restore, at a version
// the host has seen before, is applied.
func TestRestoredDatabaseConverges(t *testing.T) { databaseGoesBack(t, false) }

// TestFailoverToALaggingReplicaConverges: ctrl's database is a MariaDB
// primary with a replica (binary log replication, a second mariadbd). The
// replica catches up, then stops receiving changes (STOP SLAVE) while the
// primary takes more. ctrl fails over as docs/operating.md says: ctrl
// stopped, the primary made read-only, the replica promoted (RESET SLAVE
// ALL, read_only off), `ctrl admin migrate` and `ctrl admin db restored`
// on it, ctrl started on it. The cluster converges to what the replica
// holds.
func TestFailoverToALaggingReplicaConverges(t *testing.T) { databaseGoesBack(t, true) }

func databaseGoesBack(t *testing.T, failover bool) {
	for _, bin := range []string{"mariadb-dump", "mariadb"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Fatalf("%s not found: run `make deps` (mariadb-client)", bin)
		}
	}
	mysqlSrv := testenv.SharedMySQL(t)
	var replica *testenv.MySQL
	if failover {
		mysqlSrv = testenv.StartReplicableMySQL(t, 1)
		replica = testenv.StartReplicableMySQL(t, 2)
		if err := replica.Follow(context.Background(), mysqlSrv); err != nil {
			t.Fatal(err)
		}
	}
	dsn := mysqlSrv.Database(t, t.Name())
	srv, stop := runCtrl(t, dsn, "127.0.0.1:0")
	addr := srv.GRPCAddr()
	st := srv.Store()
	ns := "e2e-restore"
	if failover {
		ns = "e2e-failover"
	}
	cluster := kubeenv.Shared(t)
	ctx := context.Background()

	for i := range 4 {
		putConfigMap(t, st, "eu", fmt.Sprintf("r%d", i), ns, fmt.Sprintf("cm-%d", i), "1", false)
	}
	startKrane(t, srv, "eu", ns)
	// cms lists the region's ConfigMaps as name=value.
	cms := func() (string, error) {
		list, err := cluster.Client.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/managed-by=krane"})
		if err != nil {
			return "", err
		}
		var out []string
		for _, cm := range list.Items {
			out = append(out, cm.Name+"="+cm.Data["v"])
		}
		sort.Strings(out)
		return strings.Join(out, " "), nil
	}
	converge := func(what, want string) {
		t.Helper()
		waitFor(t, 2*time.Minute, what, func() error {
			got, err := cms()
			if err != nil {
				return err
			}
			if got != want {
				return fmt.Errorf("ConfigMaps %q, want %q", got, want)
			}
			return nil
		})
	}
	backedUp := "cm-0=1 cm-1=1 cm-2=1 cm-3=1"
	converge("the first deploy", backedUp)

	// The backup, or the replica as far as it got: it has caught up, and
	// stops receiving changes here.
	args, db := mariadbArgs(t, dsn)
	var dump, stderr bytes.Buffer
	target := dsn
	if failover {
		if err := replica.CatchUp(ctx, mysqlSrv, time.Minute); err != nil {
			t.Fatal(err)
		}
		sqlExec(t, replica, "STOP SLAVE")
		target = replica.DSN(db)
	} else {
		cmd := exec.Command("mariadb-dump", append(args, "--single-transaction", db)...)
		cmd.Stdout, cmd.Stderr = &dump, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("mariadb-dump: %v: %s", err, stderr.String())
		}
	}
	load := func() {
		t.Helper()
		_, tdb := mariadbArgs(t, target)
		cmd := exec.Command("mariadb", append(args, tdb)...)
		cmd.Stdin, cmd.Stderr = bytes.NewReader(dump.Bytes()), &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("loading the dump into %s: %v: %s", tdb, err, stderr.String())
		}
	}

	// After that: new objects, a change, a delete.
	for i := 4; i < 7; i++ {
		putConfigMap(t, st, "eu", fmt.Sprintf("r%d", i), ns, fmt.Sprintf("cm-%d", i), "1", false)
	}
	putConfigMap(t, st, "eu", "r0", ns, "cm-0", "2", false)
	putConfigMap(t, st, "eu", "r1", ns, "cm-1", "1", true)
	converge("the changes after the backup", "cm-0=2 cm-2=1 cm-3=1 cm-4=1 cm-5=1 cm-6=1")

	// ctrl goes down; the backup is restored, or the replica promoted; ctrl
	// comes back at the same address (the host reconnects meanwhile, and
	// keeps its cursor).
	stop()
	if failover {
		primaryPos, replicaPos := sqlString(t, mysqlSrv, "SELECT @@gtid_binlog_pos"), sqlString(t, replica, "SELECT @@gtid_slave_pos")
		if primaryPos == replicaPos {
			t.Fatalf("the replica does not lag: it is at %s, like the primary", replicaPos)
		}
		t.Logf("failing over: the primary is at %s, the replica at %s", primaryPos, replicaPos)
		// The procedure's step; the tests' root user is exempt from it, and
		// nothing writes to the old primary any more.
		sqlExec(t, mysqlSrv, "SET GLOBAL read_only = ON")
		sqlExec(t, replica, "RESET SLAVE ALL", "SET GLOBAL read_only = OFF")
		for _, args := range [][]string{{"admin", "migrate", "--db-dsn", target}, {"admin", "db", "restored", "--db-dsn", target, "--reason", "failover to the replica"}} {
			var out, errOut bytes.Buffer
			if code := cli.Main(ctx, args, &out, &errOut); code != 0 {
				t.Fatalf("ctrl %s: exit %d: %s", strings.Join(args[:2], " "), code, errOut.String())
			}
			t.Log(strings.TrimSpace(out.String()))
		}
	} else {
		load()
	}
	srv, _ = runCtrl(t, target, addr)
	converge("the cluster converged to the database ctrl has now", backedUp)

	// A change after that, at a version the host saw before, is applied:
	// the host streams from the new head.
	putConfigMap(t, srv.Store(), "eu", "r7", ns, "cm-7", "1", false)
	converge("a change after the restore", backedUp+" cm-7=1")
}

// sqlExec runs statements on a server (no database).
func sqlExec(t *testing.T, m *testenv.MySQL, stmts ...string) {
	t.Helper()
	db, err := m.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, stmt := range stmts {
		if _, err := db.Exec(stmt); err != nil {
			t.Fatalf("%s on %s: %v", stmt, m.Addr(), err)
		}
	}
}

// sqlString is a query's one value, on a server (no database).
func sqlString(t *testing.T, m *testenv.MySQL, query string) string {
	t.Helper()
	db, err := m.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var v sql.NullString
	if err := db.QueryRow(query).Scan(&v); err != nil {
		t.Fatalf("%s on %s: %v", query, m.Addr(), err)
	}
	return v.String
}
