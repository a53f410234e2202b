package store

import (
	"context"
	"crypto/tls"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"sync"
	"time"

	"github.com/go-sql-driver/mysql"

	"krane.dev/ctrl/api"
)

// ErrNotFound is returned when the named object does not exist (in the
// caller's region). It is api.ErrNotFound, which ctrl's APIs answer as
// NOT_FOUND.
var ErrNotFound = api.ErrNotFound

// PoolOptions bound the connection pool. Zero values take the defaults.
type PoolOptions struct {
	// TLS, when set, encrypts every database connection with it (it beats
	// a tls= parameter in the DSN).
	TLS *tls.Config
	// MaxOpenConns caps connections; every open bootstrap stream holds one
	// for its duration. Default 50.
	MaxOpenConns int
	// MaxIdleConns is how many unused connections stay open. Default (0):
	// MaxOpenConns, so a burst (a commit waking many streams, a reconnect
	// storm) finds its connections again next time instead of closing and
	// reopening them; connections unused for a minute are closed anyway.
	MaxIdleConns int
	// ConnMaxLifetime default 5 minutes (behind proxies and failovers a
	// connection should not live forever).
	ConnMaxLifetime time.Duration
	// IngestConns is the size of a pool of its own for what clusters
	// send (status report batches, heartbeats; Ingest, Heartbeats,
	// HeartbeatsUnlessBusy), apart from MaxOpenConns: ingestion at its
	// ceiling never takes a connection the operators' calls and the
	// streams need. Default 4.
	IngestConns int
	// MaxWriteBatch bounds the WriteTx calls one group-commit transaction
	// carries. Default 64; 1 turns group commit off (every call its own
	// transaction).
	MaxWriteBatch int
	// WriteCommitters bounds the group-commit transactions in flight at
	// once. Default 2.
	WriteCommitters int
	// BatchLockWait bounds each row-lock wait of a statement inside a
	// group-commit transaction (the server's innodb_lock_wait_timeout for
	// that transaction, in whole seconds, rounded up). A caller whose
	// statement waits longer, for a lock held outside the group commit,
	// leaves the batch and runs alone under the server's own lock wait,
	// while the others commit: one blocked write must not hold up every
	// desired-state write of this ctrl. Default 1 s; negative keeps the
	// server's setting.
	BatchLockWait time.Duration
	// ReadTimeout and WriteTimeout bound each network read and write on a
	// connection whose DSN sets none (readTimeout, writeTimeout): a
	// connection to a server that stopped answering, with no RST (a
	// partition, a failover behind a proxy), fails instead of hanging a
	// caller without a deadline. Default 2 minutes, above any statement
	// ctrl runs and InnoDB's lock wait timeout; a DSN for `ctrl admin migrate`
	// on large tables may set a longer readTimeout.
	ReadTimeout, WriteTimeout time.Duration
}

// Store is ctrl's database.
type Store struct {
	db *sql.DB
	// ingest is a pool of its own for what clusters send (report batches,
	// heartbeats): however many of their writes wait, they take none of
	// db's connections, which the operators' calls need.
	ingest *sql.DB
	cfg    *mysql.Config // what db connects with (migrations open their own)
	// migrations replace the embedded ones, and extraBackfills add to the
	// releases' (tests of the migrator).
	migrations     fs.FS
	extraBackfills []BackfillMigration
	writes         *groupCommitter // nil: group commit off

	hooksMu sync.RWMutex
	hooks   TestHooks
}

// Open connects to the MySQL or MariaDB database named by dsn (go-sql-driver
// format, e.g. "user:pass@tcp(host:3306)/ctrl") and checks it is reachable.
// It adds the connection parameters the store relies on, whatever the DSN
// says: parseTime, clientFoundRows (an UPDATE reports matched rows, which the
// guards use), utf8mb4 and strict SQL mode; and a dial, read and write
// timeout unless the DSN sets its own.
func Open(ctx context.Context, dsn string, pool PoolOptions) (*Store, error) {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, fmt.Errorf("store: the database DSN is malformed (want user:pass@tcp(host:port)/dbname): %w", err)
	}
	if cfg.DBName == "" {
		return nil, errors.New("store: the database DSN names no database (want user:pass@tcp(host:port)/dbname)")
	}
	cfg.ParseTime = true
	cfg.ClientFoundRows = true
	cfg.InterpolateParams = true // one round trip per statement; safe with utf8mb4
	cfg.Collation = "utf8mb4_bin"
	cfg.Loc = time.UTC
	if cfg.Params == nil {
		cfg.Params = map[string]string{}
	}
	cfg.Params["sql_mode"] = "'STRICT_TRANS_TABLES,NO_ZERO_IN_DATE,NO_ZERO_DATE,ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION'"
	if pool.TLS != nil {
		cfg.TLS = pool.TLS
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 5 * time.Second
	}
	if cfg.ReadTimeout == 0 {
		cfg.ReadTimeout = or(pool.ReadTimeout, 2*time.Minute)
	}
	if cfg.WriteTimeout == 0 {
		cfg.WriteTimeout = or(pool.WriteTimeout, 2*time.Minute)
	}
	connector, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	db := sql.OpenDB(connector)
	if pool.MaxOpenConns <= 0 {
		pool.MaxOpenConns = 50
	}
	if pool.MaxIdleConns <= 0 || pool.MaxIdleConns > pool.MaxOpenConns {
		pool.MaxIdleConns = pool.MaxOpenConns
	}
	if pool.ConnMaxLifetime <= 0 {
		pool.ConnMaxLifetime = 5 * time.Minute
	}
	db.SetMaxOpenConns(pool.MaxOpenConns)
	db.SetMaxIdleConns(pool.MaxIdleConns)
	db.SetConnMaxLifetime(pool.ConnMaxLifetime)
	db.SetConnMaxIdleTime(time.Minute)
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("store: cannot reach the database at %s: %w (check the DSN and that the server is up)", cfg.Addr, err)
	}
	if pool.IngestConns <= 0 {
		pool.IngestConns = 4
	}
	ingest := sql.OpenDB(connector)
	ingest.SetMaxOpenConns(pool.IngestConns)
	ingest.SetMaxIdleConns(pool.IngestConns)
	ingest.SetConnMaxLifetime(pool.ConnMaxLifetime)
	ingest.SetConnMaxIdleTime(time.Minute)
	s := &Store{db: db, ingest: ingest, cfg: cfg}
	if pool.MaxWriteBatch <= 0 {
		pool.MaxWriteBatch = 64
	}
	if pool.WriteCommitters <= 0 {
		pool.WriteCommitters = 2
	}
	if pool.MaxWriteBatch > 1 {
		s.writes = &groupCommitter{s: s, maxBatch: pool.MaxWriteBatch, maxRunning: pool.WriteCommitters,
			lockWaitSeconds: lockWaitSeconds(pool.BatchLockWait)}
	}
	return s, nil
}

// lockWaitSeconds is BatchLockWait as the server takes it: whole seconds,
// at least 1; 0 keeps the server's setting.
func lockWaitSeconds(d time.Duration) int {
	switch {
	case d < 0:
		return 0
	case d == 0:
		return 1
	}
	return int((d + time.Second - 1) / time.Second)
}

// Close closes the connection pools.
func (s *Store) Close() error { return errors.Join(s.db.Close(), s.ingest.Close()) }

// IngestStats are the statistics of the ingestion pool (IngestConns).
func (s *Store) IngestStats() sql.DBStats { return s.ingest.Stats() }

// DB is the connection pool, for reads that have no typed form here yet.
// Desired-state rows must only be written through WriteTx or StampCommitted.
func (s *Store) DB() *sql.DB { return s.db }

// Ping checks the database is reachable.
func (s *Store) Ping(ctx context.Context) error { return s.db.PingContext(ctx) }

// placeholders is "?, ?, ..." with n marks, for an IN list.
func placeholders(n int) string {
	if n <= 0 {
		return ""
	}
	return "?" + strings.Repeat(", ?", n-1)
}

func nowMillis() int64 { return time.Now().UnixMilli() }

// or is v, or def when v is zero.
func or[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// isRetryable reports MySQL errors after which the whole transaction may
// simply be run again: deadlock (1213) and lock wait timeout (1205).
func isRetryable(err error) bool {
	n := mysqlErrNumber(err)
	return n == 1213 || n == 1205
}

// mysqlErrNumber is the server's error number, or 0 for other errors.
func mysqlErrNumber(err error) uint16 {
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		return me.Number
	}
	return 0
}

// sleepCtx waits d or until ctx is done.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
