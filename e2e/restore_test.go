package e2e

import (
	"bytes"
	"context"
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

// TestFailoverToALaggingReplicaConverges: ctrl fails over to a replica
// that stopped receiving changes (a copy of the database taken at that
// moment, in a database of its own), while the old primary took more. The
// operator runs `ctrl admin db restored` on the promoted replica, as
// docs/operating.md says, and ctrl serves from it: the cluster converges
// to what the replica holds.
func TestFailoverToALaggingReplicaConverges(t *testing.T) { databaseGoesBack(t, true) }

func databaseGoesBack(t *testing.T, failover bool) {
	for _, bin := range []string{"mariadb-dump", "mariadb"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Fatalf("%s not found: run `make deps` (mariadb-client)", bin)
		}
	}
	mysqlSrv := testenv.SharedMySQL(t)
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

	// The backup, or the replica as far as it got.
	args, db := mariadbArgs(t, dsn)
	var dump, stderr bytes.Buffer
	cmd := exec.Command("mariadb-dump", append(args, "--single-transaction", db)...)
	cmd.Stdout, cmd.Stderr = &dump, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("mariadb-dump: %v: %s", err, stderr.String())
	}
	target := dsn
	if failover {
		target = mysqlSrv.Database(t, t.Name()+"-replica")
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
	if failover {
		load() // the replica stops here
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
		var out, errOut bytes.Buffer
		if code := cli.Main(ctx, []string{"admin", "db", "restored", "--db-dsn", target, "--reason", "failover to the replica"}, &out, &errOut); code != 0 {
			t.Fatalf("ctrl admin db restored: exit %d: %s", code, errOut.String())
		}
		t.Log(strings.TrimSpace(out.String()))
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
