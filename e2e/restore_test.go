package e2e

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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

// TestRestoredDatabaseConverges: ctrl's database is backed up, more is
// deployed (new objects, a change, a delete), and the backup is restored
// while ctrl is down, the backup and the restore by the commands of
// docs/operating.md, run as written (procedures `backup` and `restore`)
// against database `krane` on a private MariaDB. ctrl comes back on the
// restored database: the host's cursor is ahead of the restored head (and
// its generation is the old one), ctrl refuses it, and the host bootstraps
// again. The cluster converges to exactly what the restored database
// holds: the objects created after the backup are collected, the change and
// the delete are undone, and a change made after the restore, at a version
// the host has seen before, is applied.
func TestRestoredDatabaseConverges(t *testing.T) { databaseGoesBack(t, false) }

// TestFailoverToALaggingReplicaConverges: ctrl's database is a MariaDB
// primary with a replica (binary log replication, a second mariadbd). The
// replica catches up, then stops receiving changes (STOP SLAVE) while the
// primary takes more. ctrl fails over by docs/operating.md's commands, run
// as written (procedure `failover`): ctrl stopped, the primary made
// read-only, the replica promoted (RESET SLAVE ALL, read_only off), `ctrl
// admin migrate` and `ctrl admin db restored` on it, ctrl started on it.
// The cluster converges to what the replica holds.
func TestFailoverToALaggingReplicaConverges(t *testing.T) { databaseGoesBack(t, true) }

func databaseGoesBack(t *testing.T, failover bool) {
	for _, bin := range []string{"mariadb-dump", "mariadb", "bash"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Fatalf("%s not found: run `make deps` (mariadb-client)", bin)
		}
	}
	// Private servers (never an external one): the procedures name the
	// database the docs' setup creates, and drop it.
	mysqlSrv := testenv.StartReplicableMySQL(t, 1)
	var replica *testenv.MySQL
	if failover {
		replica = testenv.StartReplicableMySQL(t, 2)
		if err := replica.Follow(context.Background(), mysqlSrv); err != nil {
			t.Fatal(err)
		}
	}
	db := docDatabase(t)
	if err := mysqlSrv.CreateDatabase(db); err != nil {
		t.Fatal(err)
	}
	dsn := mysqlSrv.DSN(db)
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

	// The operator's shell: the mariadb clients reach the primary through
	// ~/.my.cnf, ctrl is on PATH with its DSN in CTRL_DB_DSN.
	target := dsn
	if failover {
		target = replica.DSN(db)
	}
	sh := operatorShell(t, mysqlSrv, target)

	// The backup, or the replica as far as it got: it has caught up, and
	// stops receiving changes here.
	if failover {
		if err := replica.CatchUp(ctx, mysqlSrv, time.Minute); err != nil {
			t.Fatal(err)
		}
		sqlExec(t, replica, "STOP SLAVE")
	} else {
		sh.run(t, "backup")
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
	var out string
	if failover {
		primaryPos, replicaPos := sqlString(t, mysqlSrv, "SELECT @@gtid_binlog_pos"), sqlString(t, replica, "SELECT @@gtid_slave_pos")
		if primaryPos == replicaPos {
			t.Fatalf("the replica does not lag: it is at %s, like the primary", replicaPos)
		}
		t.Logf("failing over: the primary is at %s, the replica at %s", primaryPos, replicaPos)
		// The tests' root user is exempt from read_only; nothing writes to
		// the old primary any more.
		sh.env = append(sh.env, "PRIMARY="+clientOptions(mysqlSrv), "REPLICA="+clientOptions(replica))
		out = sh.run(t, "failover")
		if got := sqlString(t, mysqlSrv, "SELECT @@read_only"); got != "1" {
			t.Errorf("after the failover procedure the old primary has read_only=%s, want 1", got)
		}
		if got := sqlString(t, replica, "SELECT @@read_only"); got != "0" {
			t.Errorf("after the failover procedure the replica has read_only=%s, want 0 (promoted)", got)
		}
		if n := sqlRows(t, replica, "SHOW ALL SLAVES STATUS"); n != 0 {
			t.Errorf("after the failover procedure the replica still has %d replication source(s), want none (RESET SLAVE ALL)", n)
		}
	} else {
		out = sh.run(t, "restore")
	}
	if !strings.Contains(out, "database generation ") {
		t.Errorf("the procedure's `ctrl admin db restored` printed no new generation:\n%s", out)
	}
	srv, _ = runCtrl(t, target, addr)
	converge("the cluster converged to the database ctrl has now", backedUp)

	// A change after that, at a version the host saw before, is applied:
	// the host streams from the new head.
	putConfigMap(t, srv.Store(), "eu", "r7", ns, "cm-7", "1", false)
	converge("a change after the restore", backedUp+" cm-7=1")
}

// operatingDoc is the document whose procedures the tests run.
const operatingDoc = "../docs/operating.md"

// docDatabase is the database docs/operating.md's setup creates, which
// its procedures must name.
func docDatabase(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile(operatingDoc)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^CREATE DATABASE (\w+);$`).FindSubmatch(data)
	if m == nil {
		t.Fatalf("%s: no `CREATE DATABASE NAME;` line in its MySQL setup", operatingDoc)
	}
	return string(m[1])
}

// procedure is one procedure of docs/operating.md as a shell script: the
// lines of the ```sh blocks between `<!-- procedure: NAME -->` and
// `<!-- /procedure -->`, as an operator pastes them.
func procedure(t *testing.T, name string) string {
	t.Helper()
	data, err := os.ReadFile(operatingDoc)
	if err != nil {
		t.Fatal(err)
	}
	var script strings.Builder
	in, block, found := false, false, false
	for _, line := range strings.Split(string(data), "\n") {
		trimmed := strings.TrimSpace(line)
		switch {
		case trimmed == "<!-- procedure: "+name+" -->":
			in, found = true, true
		case strings.HasPrefix(trimmed, "<!-- /procedure"):
			in = false
		case !in:
		case strings.HasPrefix(trimmed, "```sh"):
			block = true
		case strings.HasPrefix(trimmed, "```"):
			block = false
		case block:
			script.WriteString(trimmed + "\n")
		}
	}
	if !found || script.Len() == 0 {
		t.Fatalf("%s has no procedure %q (a ```sh block between `<!-- procedure: %s -->` and `<!-- /procedure -->`)", operatingDoc, name, name)
	}
	return script.String()
}

// shell is an operator's shell for the procedures: a working directory
// (where backups are written) and the environment.
type shell struct {
	dir string
	env []string
}

// operatorShell is a shell whose mariadb clients reach primary (through
// ~/.my.cnf's [client] group, as the docs say) and whose ctrl, this
// checkout's, reaches dsn (CTRL_DB_DSN).
func operatorShell(t *testing.T, primary *testenv.MySQL, dsn string) *shell {
	t.Helper()
	ctrl := ctrlBinary(t)
	bin, home := t.TempDir(), t.TempDir()
	if err := os.Symlink(ctrl, filepath.Join(bin, "ctrl")); err != nil {
		t.Fatal(err)
	}
	host, port, _ := strings.Cut(primary.Addr(), ":")
	cnf := fmt.Sprintf("[client]\nhost=%s\nport=%s\nuser=root\nprotocol=tcp\n", host, port)
	if err := os.WriteFile(filepath.Join(home, ".my.cnf"), []byte(cnf), 0o600); err != nil {
		t.Fatal(err)
	}
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "CTRL_") && !strings.HasPrefix(kv, "MYSQL_") && !strings.HasPrefix(kv, "HOME=") && !strings.HasPrefix(kv, "PATH=") {
			env = append(env, kv)
		}
	}
	sh := &shell{dir: t.TempDir(), env: append(env,
		"HOME="+home,
		"PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"),
		"CTRL_DB_DSN="+dsn,
	)}
	// The clients must reach the test's server and no other (the machine
	// may run a MariaDB of its own on the default port).
	if got := strings.TrimSpace(sh.exec(t, "mariadb -N -e 'SELECT @@port'")); got != port {
		t.Fatalf("the shell's mariadb client reaches port %s, not the test's server on %s", got, port)
	}
	return sh
}

// run runs the named procedure of docs/operating.md, stopping at the first
// failing command, and returns what it printed.
func (sh *shell) run(t *testing.T, name string) string {
	t.Helper()
	script := procedure(t, name)
	out := sh.exec(t, script)
	t.Logf("procedure %s:\n%s--- printed:\n%s", name, script, out)
	return out
}

func (sh *shell) exec(t *testing.T, script string) string {
	t.Helper()
	cmd := exec.Command("bash", "-euo", "pipefail", "-c", script)
	cmd.Dir, cmd.Env = sh.dir, sh.env
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s\nfailed: %v\n%s", script, err, out)
	}
	return string(out)
}

// clientOptions are the mariadb client's options that reach m.
func clientOptions(m *testenv.MySQL) string {
	host, port, _ := strings.Cut(m.Addr(), ":")
	return "--host=" + host + " --port=" + port + " --protocol=tcp"
}

// ctrlBinary is this checkout's ctrl: from KRANE_BIN_DIR (`make build`),
// or built.
func ctrlBinary(t *testing.T) string {
	t.Helper()
	if dir := os.Getenv("KRANE_BIN_DIR"); dir != "" {
		p, err := filepath.Abs(filepath.Join(dir, "ctrl"))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("ctrl not found in %s: run `make build`", dir)
		}
		return p
	}
	p, err := testenv.BuildBinary("krane.dev/cmd/ctrl", "ctrl")
	if err != nil {
		t.Fatal(err)
	}
	return p
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

// sqlRows is how many rows a statement returns, on a server (no database).
func sqlRows(t *testing.T, m *testenv.MySQL, query string) int {
	t.Helper()
	db, err := m.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rows, err := db.Query(query)
	if err != nil {
		t.Fatalf("%s on %s: %v", query, m.Addr(), err)
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		n++
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("%s on %s: %v", query, m.Addr(), err)
	}
	return n
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
