package testenv

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
)

// EnvMySQLDSN names an external MySQL-compatible server to use instead of a
// private one, as a DSN without a database (e.g. "root@tcp(127.0.0.1:3306)/").
const EnvMySQLDSN = "KRANE_TEST_MYSQL_DSN"

// MySQL is a MySQL-compatible server: a private mariadbd started by testenv,
// or the external server named by KRANE_TEST_MYSQL_DSN.
type MySQL struct {
	baseDSN *mysql.Config

	// Private server only.
	mu      sync.Mutex
	proc    *Process
	bin     string
	dir     string
	dataDir string
	port    int
	// serverID, when not 0, gives the server a binary log and this
	// server id, so that servers can replicate from each other.
	serverID int
	// extraArgs are more mariadbd options (TLS files).
	extraArgs []string
}

var sharedMySQL Shared[*MySQL]

// SharedMySQL returns the package's MySQL server, starting it on first use.
func SharedMySQL(tb testing.TB) *MySQL {
	return sharedMySQL.Get(tb, StartMySQL)
}

// StartMySQL starts a MySQL server for this test package (or connects to
// the external one). Main stops it.
func StartMySQL() (*MySQL, error) {
	if dsn := os.Getenv(EnvMySQLDSN); dsn != "" {
		cfg, err := mysql.ParseDSN(dsn)
		if err != nil {
			return nil, fmt.Errorf("testenv: %s is not a valid DSN: %w", EnvMySQLDSN, err)
		}
		cfg.DBName = ""
		m := &MySQL{baseDSN: cfg}
		if err := m.ping(context.Background()); err != nil {
			return nil, fmt.Errorf("testenv: MySQL at %s (from %s) is unreachable: %w", cfg.Addr, EnvMySQLDSN, err)
		}
		return m, nil
	}
	m, err := startPrivateMySQL(0)
	if err != nil {
		return nil, err
	}
	OnStop(m.Stop)
	return m, nil
}

// StartReplicableMySQL starts a private server of its own (never the
// external one) with a binary log (ROW format) and server id serverID, for
// tests of replication: start two with different ids and make one the
// replica of the other (CHANGE MASTER TO ...; START SLAVE). The server is
// stopped when tb ends.
func StartReplicableMySQL(tb testing.TB, serverID int) *MySQL {
	tb.Helper()
	m, err := StartReplicableMySQLServer(serverID)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(m.Stop)
	return m
}

// StartReplicableMySQLServer is StartReplicableMySQL outside a test: Main
// (or StopAll) stops the server.
func StartReplicableMySQLServer(serverID int) (*MySQL, error) {
	if serverID <= 0 {
		return nil, fmt.Errorf("testenv: server id %d: a replicating server needs an id above 0", serverID)
	}
	m, err := startPrivateMySQL(serverID)
	if err != nil {
		return nil, err
	}
	OnStop(m.Stop)
	return m, nil
}

// Follow makes m a replica of primary from the start of primary's binary
// log (both replicable servers), and starts replication.
func (m *MySQL) Follow(ctx context.Context, primary *MySQL) error {
	host, port, ok := strings.Cut(primary.Addr(), ":")
	if !ok {
		return fmt.Errorf("testenv: no port in %s", primary.Addr())
	}
	if err := m.exec(ctx, fmt.Sprintf("CHANGE MASTER TO MASTER_HOST='%s', MASTER_PORT=%s, MASTER_USER='root'", host, port)); err != nil {
		return fmt.Errorf("testenv: make %s a replica of %s: %w", m.Addr(), primary.Addr(), err)
	}
	return m.exec(ctx, "START SLAVE")
}

// CatchUp waits up to timeout until the replica m has applied everything
// primary has committed so far.
func (m *MySQL) CatchUp(ctx context.Context, primary *MySQL, timeout time.Duration) error {
	pos, err := primary.queryString(ctx, "SELECT @@gtid_binlog_pos")
	if err != nil {
		return err
	}
	got, err := m.queryString(ctx, fmt.Sprintf("SELECT MASTER_GTID_WAIT('%s', %d)", pos, int(timeout.Seconds())))
	if err != nil {
		return err
	}
	if got != "0" {
		return fmt.Errorf("testenv: the replica %s did not reach the primary's position %s within %s", m.Addr(), pos, timeout)
	}
	return nil
}

// Exec runs a statement on the server, without a database.
func (m *MySQL) Exec(ctx context.Context, stmt string) error { return m.exec(ctx, stmt) }

func (m *MySQL) queryString(ctx context.Context, query string) (string, error) {
	db, err := m.Open()
	if err != nil {
		return "", err
	}
	defer db.Close()
	var v sql.NullString
	if err := db.QueryRowContext(ctx, query).Scan(&v); err != nil {
		return "", fmt.Errorf("testenv: %s on %s: %w", query, m.Addr(), err)
	}
	return v.String, nil
}

// MySQLTLS are the files of a private server that serves TLS: its CA
// bundle (which client certificates are verified against), certificate
// and key (PEM).
type MySQLTLS struct{ CA, Cert, Key string }

// StartTLSMySQL starts a private server of its own (never the external
// one) that offers TLS with the given files, for tests of encrypted
// database connections; plaintext connections stay allowed (the test's
// own setup statements use them). The server is stopped when tb ends.
func StartTLSMySQL(tb testing.TB, files MySQLTLS) *MySQL {
	tb.Helper()
	m, err := startPrivateMySQL(0, "--ssl-ca="+files.CA, "--ssl-cert="+files.Cert, "--ssl-key="+files.Key)
	if err != nil {
		tb.Fatal(err)
	}
	OnStop(m.Stop)
	tb.Cleanup(m.Stop)
	return m
}

func startPrivateMySQL(serverID int, extraArgs ...string) (*MySQL, error) {
	bin, err := lookPath("mariadbd")
	if err != nil {
		return nil, &MissingBinaryError{Binary: "mariadbd", Looked: "PATH, /usr/sbin", Fix: "run `make deps` (installs mariadb-server from Debian packages), or set " + EnvMySQLDSN + " to an existing server"}
	}
	dir, err := SubDir("mysql")
	if err != nil {
		return nil, err
	}
	template, err := mysqlTemplate(bin)
	if err != nil {
		return nil, err
	}
	dataDir := filepath.Join(dir, "data")
	if err := copyTree(template, dataDir); err != nil {
		return nil, fmt.Errorf("testenv: copy MySQL data dir template: %w", err)
	}
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	m := &MySQL{bin: bin, dir: dir, dataDir: dataDir, port: port, serverID: serverID, extraArgs: extraArgs}
	m.baseDSN = mysql.NewConfig()
	m.baseDSN.User = "root"
	m.baseDSN.Net = "tcp"
	m.baseDSN.Addr = fmt.Sprintf("127.0.0.1:%d", port)
	if err := m.Start(); err != nil {
		return nil, err
	}
	return m, nil
}

// Start (re)starts a private server on its port and data dir.
func (m *MySQL) Start() error {
	if m.bin == "" {
		return fmt.Errorf("testenv: the MySQL server is external (%s); it cannot be started or stopped by tests", EnvMySQLDSN)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.proc != nil && !m.proc.Exited() {
		return nil
	}
	args := []string{
		"--no-defaults",
		"--datadir=" + m.dataDir,
		fmt.Sprintf("--port=%d", m.port),
		"--bind-address=127.0.0.1",
		"--socket=" + filepath.Join(m.dir, "mysqld.sock"),
		"--pid-file=" + filepath.Join(m.dir, "mysqld.pid"),
		"--skip-grant-tables",
		"--character-set-server=utf8mb4",
		"--collation-server=utf8mb4_bin",
		"--innodb-buffer-pool-size=64M",
		"--innodb-flush-log-at-trx-commit=2",
		"--max-connections=1000",
	}
	if m.serverID > 0 {
		// log-slave-updates: a promoted replica's binary log holds what it
		// received too, so that a new replica can follow it from scratch.
		args = append(args, fmt.Sprintf("--server-id=%d", m.serverID), "--log-bin=mariadb-bin", "--binlog-format=ROW", "--relay-log=relay-bin", "--log-slave-updates")
	} else {
		args = append(args, "--skip-log-bin")
	}
	if os.Geteuid() == 0 {
		args = append(args, "--user=root")
	}
	args = append(args, m.extraArgs...)
	p, err := StartProcess(m.dir, "mysqld", m.bin, args, nil)
	if err != nil {
		return err
	}
	m.proc = p
	return p.WaitReady(60*time.Second, m.ping)
}

// Stop shuts a private server down cleanly.
func (m *MySQL) Stop() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.proc != nil {
		m.proc.Stop(30 * time.Second)
	}
}

// Kill stops a private server with SIGKILL (a crash).
func (m *MySQL) Kill() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.proc != nil {
		m.proc.Kill()
	}
}

// Pid is the private server's process id (0 for an external server).
func (m *MySQL) Pid() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.proc == nil {
		return 0
	}
	return m.proc.Pid()
}

// Private reports whether testenv runs this server (and can restart it).
func (m *MySQL) Private() bool { return m.bin != "" }

// Addr is host:port of the server.
func (m *MySQL) Addr() string { return m.baseDSN.Addr }

// Database creates a fresh database and returns a DSN for it. The database
// is dropped when the test passes.
func (m *MySQL) Database(tb testing.TB, name string) string {
	tb.Helper()
	db := "krane_" + sanitizeDBName(name) + "_" + randomHex(4)
	if err := m.exec(context.Background(), "CREATE DATABASE `"+db+"` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"); err != nil {
		tb.Fatalf("testenv: create database %s: %v", db, err)
	}
	tb.Cleanup(func() {
		if !tb.Failed() {
			_ = m.exec(context.Background(), "DROP DATABASE IF EXISTS `"+db+"`")
		}
	})
	return m.DSN(db)
}

// CreateDatabase creates database db if it does not exist.
func (m *MySQL) CreateDatabase(db string) error {
	return m.exec(context.Background(), "CREATE DATABASE IF NOT EXISTS `"+sanitizeDBName(db)+"` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
}

// DSN returns the DSN of database db on this server.
func (m *MySQL) DSN(db string) string {
	cfg := m.baseDSN.Clone()
	cfg.DBName = db
	return cfg.FormatDSN()
}

// DatabaseBehindProxy is Database reached through a Proxy the test can
// cut or stall (closed when the test ends): the network faults between
// ctrl and its database.
func (m *MySQL) DatabaseBehindProxy(tb testing.TB, name string) (string, *Proxy) {
	tb.Helper()
	dsn := m.Database(tb, name)
	p, err := NewProxy(m.Addr())
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(p.Close)
	return WithAddr(dsn, p.Addr()), p
}

// WithAddr is dsn with its server address replaced by addr (a Proxy's, to
// put network faults between a client and the server).
func WithAddr(dsn, addr string) string {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		panic(fmt.Sprintf("testenv: %q is not a DSN: %v", dsn, err))
	}
	cfg.Addr = addr
	return cfg.FormatDSN()
}

// Open is a handle on the server, without a database, for statements
// about the server itself (replication). The caller closes it.
func (m *MySQL) Open() (*sql.DB, error) { return sql.Open("mysql", m.baseDSN.FormatDSN()) }

func (m *MySQL) ping(ctx context.Context) error {
	db, err := sql.Open("mysql", m.baseDSN.FormatDSN())
	if err != nil {
		return err
	}
	defer db.Close()
	return db.PingContext(ctx)
}

func (m *MySQL) exec(ctx context.Context, stmt string) error {
	db, err := sql.Open("mysql", m.baseDSN.FormatDSN())
	if err != nil {
		return err
	}
	defer db.Close()
	_, err = db.ExecContext(ctx, stmt)
	return err
}

// mysqlTemplate returns an initialised data directory for bin, creating it
// once in the cache (initialisation takes seconds; a copy takes a fraction).
func mysqlTemplate(bin string) (string, error) {
	out, err := exec.Command(bin, "--version").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("testenv: %s --version: %v: %s", bin, err, out)
	}
	if !strings.Contains(string(out), "MariaDB") {
		return "", fmt.Errorf("testenv: %s is not MariaDB (%s); private servers need mariadbd (run `make deps`), or set %s", bin, strings.TrimSpace(string(out)), EnvMySQLDSN)
	}
	version := regexp.MustCompile(`Ver ([0-9.]+)`).FindStringSubmatch(string(out))
	key := "unknown"
	if len(version) == 2 {
		key = version[1]
	}
	root := filepath.Join(CacheDir(), "testenv")
	tmpl := filepath.Join(root, "mariadb-"+key+"-datadir")
	if _, err := os.Stat(filepath.Join(tmpl, "mysql")); err == nil {
		return tmpl, nil
	}
	install, err := lookPath("mariadb-install-db", "mysql_install_db")
	if err != nil {
		return "", &MissingBinaryError{Binary: "mariadb-install-db", Looked: "PATH, /usr/sbin", Fix: "run `make deps` (installs mariadb-server from Debian packages)"}
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		return "", err
	}
	// Several test packages may race to build the template: build into a
	// private directory and rename it into place.
	lock, err := os.OpenFile(tmpl+".lock", os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return "", err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", err
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
	if _, err := os.Stat(filepath.Join(tmpl, "mysql")); err == nil {
		return tmpl, nil
	}
	build, err := os.MkdirTemp(root, "mariadb-datadir-build-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(build)
	args := []string{"--no-defaults", "--datadir=" + filepath.Join(build, "data"), "--skip-test-db", "--auth-root-authentication-method=normal"}
	if os.Geteuid() == 0 {
		args = append(args, "--user=root")
	}
	if out, err := exec.Command(install, args...).CombinedOutput(); err != nil {
		return "", fmt.Errorf("testenv: %s failed: %v\n%s", install, err, out)
	}
	if err := os.Rename(filepath.Join(build, "data"), tmpl); err != nil {
		return "", err
	}
	return tmpl, nil
}

func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		target := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		in, err := os.Open(path)
		if err != nil {
			return err
		}
		defer in.Close()
		out, err := os.OpenFile(target, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
		if err != nil {
			return err
		}
		if _, err := io.Copy(out, in); err != nil {
			out.Close()
			return err
		}
		return out.Close()
	})
}

func sanitizeDBName(s string) string {
	s = strings.ToLower(s)
	s = regexp.MustCompile(`[^a-z0-9_]+`).ReplaceAllString(s, "_")
	if len(s) > 40 {
		s = s[:40]
	}
	return s
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
