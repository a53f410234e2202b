package store

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"strconv"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/pressly/goose/v3"
	"golang.org/x/mod/semver"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// migrationLock names the MySQL user lock that serialises migrators: several
// ctrl replicas starting at once must not run the same DDL concurrently.
const migrationLock = "krane_ctrl_migrate"

// gooseTable is goose's bookkeeping table.
const gooseTable = "goose_db_version"

// migrationFiles are the migrations this store applies: the embedded ones,
// or a test's.
func (s *Store) migrationFiles() fs.FS {
	if s.migrations != nil {
		return s.migrations
	}
	return migrationsFS()
}

func migrationsFS() fs.FS {
	sub, err := fs.Sub(migrationFiles, "migrations")
	if err != nil {
		panic(err) // the embed pattern above guarantees the directory
	}
	return sub
}

func (s *Store) provider(db *sql.DB, report func(string, BackfillProgress)) (*goose.Provider, error) {
	return goose.NewProvider(goose.DialectMySQL, db, s.migrationFiles(), goose.WithTableName(gooseTable),
		goose.WithGoMigrations(s.goMigrations(report)...),
		// Each area of the schema numbers its migrations in a range of its
		// own, so a new one may sort below one a database already has.
		goose.WithAllowOutofOrder(true))
}

// MigrationResult names one applied migration.
type MigrationResult struct {
	Version  int64
	Source   string
	Phase    Phase
	Duration time.Duration
}

// migrationTimeouts shape the migrator's own connections. DDL that waits
// for a table's metadata lock (a long transaction holds it) makes every
// query of that table queue behind it: lockWait fails it fast instead
// (run `ctrl admin migrate` again once the transaction ended). A large
// backfill or table copy outlasts the serving pool's 2-minute read
// timeout: readTimeout is the migrator's.
const (
	migrationLockWait    = 10 * time.Second
	migrationReadTimeout = time.Hour
)

// migrationDB is a pool of its own for migrating: the serving pool's
// timeouts fit queries, not DDL or backfills.
func (s *Store) migrationDB() (*sql.DB, error) {
	if s.cfg == nil {
		return s.db, nil
	}
	cfg := s.cfg.Clone()
	cfg.ReadTimeout, cfg.WriteTimeout = migrationReadTimeout, migrationReadTimeout
	cfg.Params["lock_wait_timeout"] = strconv.Itoa(int(migrationLockWait / time.Second))
	connector, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, err
	}
	db := sql.OpenDB(connector)
	// The lock's session, goose's own, and a Go migration's.
	db.SetMaxOpenConns(4)
	return db, nil
}

// PlannedMigration is a migration Migrate would apply.
type PlannedMigration struct {
	MigrationInfo
	Source string
}

// MigrationPlan lists the migrations not applied yet, in the order Migrate
// applies them, with what each declares (expand or contract).
func (s *Store) MigrationPlan(ctx context.Context) ([]PlannedMigration, error) {
	p, err := s.provider(s.db, nil)
	if err != nil {
		return nil, fmt.Errorf("store: load migrations: %w", err)
	}
	return s.plan(ctx, p)
}

func (s *Store) plan(ctx context.Context, p *goose.Provider) ([]PlannedMigration, error) {
	infos, err := s.migrationInfos()
	if err != nil {
		return nil, err
	}
	byVersion := map[int64]MigrationInfo{}
	for _, m := range infos {
		byVersion[m.Version] = m
	}
	statuses, err := p.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("store: read applied migrations: %w", err)
	}
	var out []PlannedMigration
	for _, st := range statuses {
		if st.State == goose.StatePending {
			out = append(out, PlannedMigration{MigrationInfo: byVersion[st.Source.Version], Source: st.Source.Path})
		}
	}
	return out, nil
}

// Migrate applies every pending migration, one at a time in version order,
// on connections of its own (migrationDB). Before a contract step it
// records the oldest ctrl line that can serve the schema after it
// (schema_requirements), so that an older replica stops serving (and says
// why) before the drop takes effect rather than failing queries after.
// Concurrent callers (in any process) wait for each other on a MySQL user
// lock; the second finds nothing left to do.
func (s *Store) Migrate(ctx context.Context) ([]MigrationResult, error) {
	return s.MigrateReporting(ctx, MigrateReport{})
}

// MigrateReport receives a migration run's progress (each may be nil).
type MigrateReport struct {
	// Starting is called before each migration is applied.
	Starting func(PlannedMigration)
	// Backfill is called after each batch of a backfill.
	Backfill func(name string, p BackfillProgress)
}

// MigrateReporting is Migrate, reporting its progress to r.
func (s *Store) MigrateReporting(ctx context.Context, r MigrateReport) ([]MigrationResult, error) {
	db, err := s.migrationDB()
	if err != nil {
		return nil, fmt.Errorf("store: migrate: %w", err)
	}
	if db != s.db {
		defer db.Close()
	}
	p, err := s.provider(db, r.Backfill)
	if err != nil {
		return nil, fmt.Errorf("store: load migrations: %w", err)
	}
	// The lock covers all of Up. goose's own session locker does not: Up
	// first runs HasPending, which creates goose's table unlocked, and on
	// MySQL that CREATE commits before the zero-version row is inserted, so
	// a concurrent migrator could find the table empty ("missing zero
	// version migration").
	conn, err := db.Conn(ctx)
	if err != nil {
		return nil, fmt.Errorf("store: migrate: %w", err)
	}
	defer conn.Close()
	locker := getLockLocker{}
	if err := locker.SessionLock(ctx, conn); err != nil {
		return nil, fmt.Errorf("store: migrate: %w", err)
	}
	defer func() { _ = locker.SessionUnlock(context.WithoutCancel(ctx), conn) }()
	plan, err := s.plan(ctx, p)
	if err != nil {
		return nil, err
	}
	var out []MigrationResult
	for _, m := range plan {
		if r.Starting != nil {
			r.Starting(m)
		}
		if m.Phase == Contract {
			if _, err := db.ExecContext(ctx, "INSERT INTO schema_requirements (migration, min_ctrl, recorded_at) VALUES (?, ?, ?) ON DUPLICATE KEY UPDATE min_ctrl = VALUES(min_ctrl)",
				m.Version, m.RequiresCtrl, nowMillis()); err != nil {
				return out, fmt.Errorf("store: record that migration %s needs ctrl %s or later, before applying it: %w (the database is left at the last migration that succeeded; fix the cause and run `ctrl admin migrate` again)", m.Name, m.RequiresCtrl, err)
			}
		}
		r, err := p.ApplyVersion(ctx, m.Version, true)
		if err != nil {
			hint := "fix the cause and run `ctrl admin migrate` again"
			if mysqlErrNumber(err) == 1205 {
				hint = "a long transaction holds the table's metadata lock, and the migration gave up waiting rather than stall every query of the table behind it: run `ctrl admin migrate` again once it ended"
			}
			return out, fmt.Errorf("store: apply migration %s: %w (the database is left at the last migration that succeeded; %s)", m.Name, err, hint)
		}
		out = append(out, MigrationResult{Version: m.Version, Source: m.Source, Phase: m.Phase, Duration: r.Duration})
	}
	return out, nil
}

// SchemaStatus is where the database's schema stands for a ctrl binary.
type SchemaStatus struct {
	// Pending are this binary's migrations not applied yet.
	Pending []int64
	// Ahead are applied migrations this binary does not know: a newer
	// release migrated. Expand steps keep this release working.
	Ahead []int64
	// MinCtrl is the oldest ctrl line that can serve the schema, as the
	// contract steps applied so far require ("" when none did), and
	// MinCtrlBy the step that requires it.
	MinCtrl   string
	MinCtrlBy int64
}

// Serves reports whether a ctrl of version ctrlVersion can serve the
// schema, and when not, why in words naming both versions. A build with
// no version (dev) serves whatever a contract step requires: nothing can
// be concluded from it.
func (st SchemaStatus) Serves(ctrlVersion string) (bool, string) {
	if len(st.Pending) > 0 {
		return false, fmt.Sprintf("schema migrations are pending (%d, the first %05d): run `ctrl admin migrate`", len(st.Pending), st.Pending[0])
	}
	if st.MinCtrl != "" && semver.IsValid(ctrlVersion) && semver.Compare(semver.MajorMinor(ctrlVersion), st.MinCtrl) < 0 {
		return false, fmt.Sprintf("the database schema is past what this ctrl (%s) can serve: migration %05d, applied by a newer release, needs ctrl %s or later; finish the roll to a release of that line (or restore the database from before it)",
			ctrlVersion, st.MinCtrlBy, st.MinCtrl)
	}
	return true, ""
}

// SchemaStatus reads where the schema stands against this binary's
// migrations. It only reads (a readiness probe must not create goose's
// table as a side effect); a database never migrated has every migration
// pending.
func (s *Store) SchemaStatus(ctx context.Context) (SchemaStatus, error) {
	infos, err := s.migrationInfos()
	if err != nil {
		return SchemaStatus{}, err
	}
	known := map[int64]bool{}
	for _, m := range infos {
		known[m.Version] = true
	}
	var st SchemaStatus
	rows, err := s.db.QueryContext(ctx, "SELECT version_id, is_applied FROM "+gooseTable+" ORDER BY id")
	if err != nil {
		if mysqlErrNumber(err) != 1146 { // no such table: never migrated
			return st, fmt.Errorf("store: read applied migrations: %w", err)
		}
		rows = nil
	}
	applied := map[int64]bool{}
	if rows != nil {
		defer rows.Close()
		for rows.Next() {
			var v int64
			var ok bool
			if err := rows.Scan(&v, &ok); err != nil {
				return st, err
			}
			applied[v] = ok // the latest row of a version decides (up, then down, ...)
		}
		if err := rows.Err(); err != nil {
			return st, err
		}
	}
	for _, m := range infos {
		if !applied[m.Version] {
			st.Pending = append(st.Pending, m.Version)
		}
	}
	for v, ok := range applied {
		if ok && v != 0 && !known[v] {
			st.Ahead = append(st.Ahead, v)
		}
	}
	slices.Sort(st.Ahead)
	var minCtrl sql.NullString
	var by sql.NullInt64
	err = s.db.QueryRowContext(ctx, "SELECT min_ctrl, migration FROM schema_requirements ORDER BY recorded_at DESC, migration DESC LIMIT 1").Scan(&minCtrl, &by)
	switch {
	case errors.Is(err, sql.ErrNoRows), mysqlErrNumber(err) == 1146:
	case err != nil:
		return st, fmt.Errorf("store: read the schema's requirements: %w", err)
	default:
		st.MinCtrl, st.MinCtrlBy = minCtrl.String, by.Int64
	}
	return st, nil
}

// MigrationsCurrent reports whether every embedded migration is applied.
func (s *Store) MigrationsCurrent(ctx context.Context) (bool, error) {
	st, err := s.SchemaStatus(ctx)
	return err == nil && len(st.Pending) == 0, err
}

// getLockLocker is a session lock on MySQL's GET_LOCK, which works
// the same on MySQL and MariaDB and is released if the session dies.
type getLockLocker struct{}

func (getLockLocker) SessionLock(ctx context.Context, conn *sql.Conn) error {
	for {
		var got sql.NullInt64
		// Wait in short slices so ctx cancellation is honoured.
		if err := conn.QueryRowContext(ctx, "SELECT GET_LOCK(?, 5)", migrationLock).Scan(&got); err != nil {
			return fmt.Errorf("take migration lock %q: %w", migrationLock, err)
		}
		if got.Valid && got.Int64 == 1 {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("take migration lock %q: another migrator holds it: %w", migrationLock, err)
		}
	}
}

func (getLockLocker) SessionUnlock(ctx context.Context, conn *sql.Conn) error {
	var released sql.NullInt64
	if err := conn.QueryRowContext(ctx, "SELECT RELEASE_LOCK(?)", migrationLock).Scan(&released); err != nil {
		return fmt.Errorf("release migration lock %q: %w", migrationLock, err)
	}
	if !released.Valid || released.Int64 != 1 {
		return errors.New("release migration lock: this session did not hold it")
	}
	return nil
}

// migrationInfos are the store's migrations, SQL files and backfills, by
// version.
func (s *Store) migrationInfos() ([]MigrationInfo, error) {
	infos, err := MigrationsIn(s.migrationFiles())
	if err != nil {
		return nil, err
	}
	infos = append(infos, s.backfillInfos()...)
	slices.SortFunc(infos, func(a, b MigrationInfo) int { return int(a.Version - b.Version) })
	return infos, nil
}

// MigrateTo applies the migrations up to version v, no further: for
// tools and tests that need the schema of an older release (a migration's
// benchmark, a test of what a migration moves).
func (s *Store) MigrateTo(ctx context.Context, v int64) error {
	p, err := s.provider(s.db, nil)
	if err != nil {
		return err
	}
	_, err = p.UpTo(ctx, v)
	return err
}
