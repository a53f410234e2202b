package store_test

import (
	"context"
	"fmt"
	"io/fs"
	"strings"
	"testing"
	"testing/fstest"

	"krane.dev/ctrl/store"
	"krane.dev/internal/testenv"
)

func TestParseMigrationDeclarations(t *testing.T) {
	m, err := store.ParseMigration("00070_drop_old.sql", []byte("-- krane:phase contract\n-- krane:contracts 00060\n-- krane:requires-ctrl v0.2\n-- why\n\n-- +goose Up\nALTER TABLE t DROP COLUMN c;\n-- +goose Down\nALTER TABLE t ADD COLUMN c INT NULL;\n"))
	if err != nil {
		t.Fatal(err)
	}
	if m.Version != 70 || m.Phase != store.Contract || m.Contracts != 60 || m.RequiresCtrl != "v0.2" || strings.Contains(m.Up, "ADD COLUMN") || !strings.Contains(m.Up, "DROP COLUMN") {
		t.Fatalf("parsed %+v", m)
	}
	for name, src := range map[string]string{
		"an unknown phase":                   "-- krane:phase shrink\n",
		"a contract that names no expand":    "-- krane:phase contract\n-- krane:requires-ctrl v0.2\n",
		"a contract that names no ctrl line": "-- krane:phase contract\n-- krane:contracts 00060\n",
		"a requirement on an expand step":    "-- krane:phase expand\n-- krane:requires-ctrl v0.2\n",
		"a patch version as a line":          "-- krane:phase contract\n-- krane:contracts 00060\n-- krane:requires-ctrl v0.2.1\n",
		"an unknown declaration":             "-- krane:phases expand\n",
	} {
		if _, err := store.ParseMigration("00071_x.sql", []byte(src)); err == nil {
			t.Errorf("%s: parsed without an error", name)
		}
	}
}

// TestDestructiveFindsWhatOldReplicasCannotSurvive: the classification the
// expand rule rests on (internal/compat applies it to every migration of
// a release), on each statement form.
func TestDestructiveFindsWhatOldReplicasCannotSurvive(t *testing.T) {
	for _, c := range []struct {
		sql      string
		removals []string
		others   int
	}{
		{"CREATE TABLE x (a INT NOT NULL, PRIMARY KEY (a));", nil, 0},
		{"ALTER TABLE t ADD COLUMN a JSON NULL AFTER b, ALGORITHM=INSTANT;", nil, 0},
		{"ALTER TABLE t ADD COLUMN a INT NOT NULL DEFAULT 0, ADD INDEX t_a (a);", nil, 0},
		{"UPDATE t SET a = 1 WHERE a IS NULL;", nil, 0},
		{"ALTER TABLE t DROP INDEX t_a;", nil, 0},
		{"ALTER TABLE t ADD COLUMN a INT NOT NULL;", nil, 1},
		{"ALTER TABLE t ADD COLUMN a DECIMAL(10,2) NOT NULL, ADD COLUMN b INT NULL;", nil, 1},
		{"ALTER TABLE t DROP COLUMN a, DROP b, DROP COLUMN IF EXISTS `c`;", []string{"column t.a", "column t.b", "column t.c"}, 0},
		{"ALTER TABLE `t` MODIFY COLUMN a JSON NOT NULL;", nil, 1},
		{"ALTER TABLE t CHANGE a b INT;", []string{"column t.a"}, 0},
		{"ALTER TABLE t RENAME COLUMN a TO b;", []string{"column t.a"}, 0},
		{"ALTER TABLE t RENAME TO u;", []string{"table t"}, 0},
		{"RENAME TABLE t TO u;", []string{"table t"}, 0},
		{"DROP TABLE IF EXISTS t, u;", []string{"table t", "table u"}, 0},
		{"TRUNCATE t;", nil, 1},
		{"DELETE FROM t WHERE a = 'DROP COLUMN x';", nil, 1},
		{"-- DROP TABLE t;\nSELECT 1; /* DROP TABLE u; */", nil, 0},
	} {
		removals, others := store.Destructive(c.sql)
		var got []string
		for _, r := range removals {
			got = append(got, r.String())
		}
		if strings.Join(got, ",") != strings.Join(c.removals, ",") || len(others) != c.others {
			t.Errorf("%s: removals %v and %d others %v; want %v and %d", c.sql, got, len(others), others, c.removals, c.others)
		}
	}
}

func TestOfflineDDLWantsAlgorithmAndLock(t *testing.T) {
	for sql, offline := range map[string]bool{
		"ALTER TABLE t ADD COLUMN a INT NULL;":                                  true,
		"ALTER TABLE t ADD COLUMN a INT NULL, ALGORITHM=INSTANT;":               false,
		"ALTER TABLE t ADD INDEX t_a (a), ALGORITHM = INPLACE, LOCK = NONE;":    false,
		"ALTER TABLE t ADD INDEX t_a (a), ALGORITHM=INPLACE;":                   true,
		"ALTER TABLE t ADD COLUMN a INT NULL, ALGORITHM=COPY;":                  true,
		"CREATE TABLE t (a INT); UPDATE t SET a = 1; INSERT INTO t VALUES (2);": false,
	} {
		if got := len(store.OfflineDDL(sql)) > 0; got != offline {
			t.Errorf("%s: offline %v, want %v", sql, got, offline)
		}
	}
}

// withMigrations is the embedded migrations plus extra files.
func withMigrations(t *testing.T, extra map[string]string) fs.FS {
	t.Helper()
	m := fstest.MapFS{}
	err := fs.WalkDir(store.EmbeddedMigrations(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := fs.ReadFile(store.EmbeddedMigrations(), p)
		m[p] = &fstest.MapFile{Data: data}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	for name, src := range extra {
		m[name] = &fstest.MapFile{Data: []byte(src)}
	}
	return m
}

// TestContractStepRecordsWhatItRequiresFirst: before a contract step runs,
// the migrator records the ctrl line it needs, so replicas older than that
// stop serving before the drop rather than fail after it; a contract step
// that fails leaves the requirement (older replicas stay unready, which is
// safe) and the migration unapplied, and the plan lists it with its phase.
func TestContractStepRecordsWhatItRequiresFirst(t *testing.T) {
	ctx := context.Background()
	s := openStore(t)
	if _, err := s.DB().ExecContext(ctx, "CREATE TABLE contract_probe (id INT NOT NULL, old_col INT NULL, PRIMARY KEY (id))"); err != nil {
		t.Fatal(err)
	}
	s.UseMigrations(withMigrations(t, map[string]string{
		"99100_probe_expand.sql":   "-- krane:phase expand\n-- +goose Up\nALTER TABLE contract_probe ADD COLUMN new_col INT NULL;\n-- +goose Down\nALTER TABLE contract_probe DROP COLUMN new_col;\n",
		"99101_probe_contract.sql": "-- krane:phase contract\n-- krane:contracts 99100\n-- krane:requires-ctrl v0.3\n-- +goose Up\nALTER TABLE contract_probe DROP COLUMN old_col;\n-- +goose Down\nALTER TABLE contract_probe ADD COLUMN old_col INT NULL;\n",
		"99102_probe_fails.sql":    "-- krane:phase contract\n-- krane:contracts 99100\n-- krane:requires-ctrl v0.4\n-- +goose Up\nALTER TABLE contract_probe DROP COLUMN no_such_column;\n-- +goose Down\nSELECT 1;\n",
	}))
	plan, err := s.MigrationPlan(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var phases []string
	for _, m := range plan {
		phases = append(phases, m.Name+":"+string(m.Phase))
	}
	if strings.Join(phases, " ") != "99100_probe_expand.sql:expand 99101_probe_contract.sql:contract 99102_probe_fails.sql:contract" {
		t.Fatalf("plan %v", phases)
	}
	var started []string
	applied, err := s.MigrateReporting(ctx, store.MigrateReport{Starting: func(m store.PlannedMigration) { started = append(started, m.Name) }})
	if err == nil || !strings.Contains(err.Error(), "99102_probe_fails.sql") || !strings.Contains(err.Error(), "ctrl admin migrate") {
		t.Fatalf("a failing contract step: %v; want an error naming it and what to do", err)
	}
	if len(applied) != 2 || len(started) != 3 {
		t.Fatalf("applied %v, started %v; want the first two applied and all three started", applied, started)
	}
	st, err := s.SchemaStatus(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.MinCtrl != "v0.4" || st.MinCtrlBy != 99102 || len(st.Pending) != 1 || st.Pending[0] != 99102 {
		t.Fatalf("after the failed contract step: %+v; want its requirement recorded and it pending", st)
	}
	var cols int
	if err := s.DB().QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.columns WHERE table_schema = DATABASE() AND table_name = 'contract_probe' AND column_name = 'old_col'").Scan(&cols); err != nil {
		t.Fatal(err)
	}
	if cols != 0 {
		t.Fatal("the contract step did not drop old_col")
	}
	if ok, why := st.Serves("v0.3.9"); ok || !strings.Contains(why, "pending") {
		t.Errorf("v0.3.9 with a step pending: %v %q", ok, why)
	}
	st.Pending = nil
	if ok, why := st.Serves("v0.3.9"); ok || !strings.Contains(why, "v0.4 or later") {
		t.Errorf("v0.3.9 under a v0.4 requirement: %v %q", ok, why)
	}
	if ok, _ := st.Serves("v0.4.0-dev.3+abc"); !ok {
		t.Error("a v0.4 development build does not serve a v0.4 requirement")
	}
	if ok, _ := st.Serves("dev"); !ok {
		t.Error("a build without a version refuses; nothing can be concluded from it")
	}
}

// TestMigratorGivesUpOnAHeldMetadataLock: DDL waiting behind a long
// transaction would stall every query of the table; the migrator's
// sessions give up after its lock wait and say what to do.
func TestMigratorGivesUpOnAHeldMetadataLock(t *testing.T) {
	ctx := context.Background()
	dsn := testenv.SharedMySQL(t).Database(t, t.Name())
	s := openDSN(t, dsn, store.PoolOptions{})
	if _, err := s.DB().ExecContext(ctx, "CREATE TABLE mdl_probe (id INT NOT NULL, PRIMARY KEY (id))"); err != nil {
		t.Fatal(err)
	}
	conn, err := s.DB().Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.ExecContext(ctx, "SELECT * FROM mdl_probe"); err != nil { // holds the table's metadata lock until the transaction ends
		t.Fatal(err)
	}
	defer conn.ExecContext(ctx, "ROLLBACK")
	s.UseMigrations(withMigrations(t, map[string]string{
		"99200_mdl.sql": "-- krane:phase expand\n-- +goose Up\nALTER TABLE mdl_probe ADD COLUMN a INT NULL;\n-- +goose Down\nSELECT 1;\n",
	}))
	_, err = s.Migrate(ctx)
	if err == nil || !strings.Contains(err.Error(), "metadata lock") {
		t.Fatalf("DDL behind a held metadata lock: %v; want the migrator to give up and say why", err)
	}
}

// TestBackfillRunsInBatchesAndResumes: a backfill fills the rows its
// Where selects in transactions of Batch rows, reports each batch, resumes
// where a stopped run left off, and changes nothing when run again; as a
// release's backfill step it runs between the expand step that added the
// column and the next, and the plan lists it as an expand step.
func TestBackfillRunsInBatchesAndResumes(t *testing.T) {
	ctx := context.Background()
	s := openStore(t)
	db := s.DB()
	if _, err := db.ExecContext(ctx, "CREATE TABLE backfill_probe (id VARCHAR(16) NOT NULL, n INT NOT NULL, doubled INT NULL, PRIMARY KEY (id))"); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, "INSERT INTO backfill_probe (id, n) SELECT CONCAT('k', LPAD(seq, 5, '0')), seq FROM seq_1_to_2500"); err != nil {
		t.Fatal(err)
	}
	b := store.Backfill{Table: "backfill_probe", Key: "id", Set: "doubled = n * 2", Where: "doubled IS NULL", Batch: 1000}

	// A run stopped after its first batch...
	stop, cancel := context.WithCancel(ctx)
	p, err := b.Run(stop, db, func(store.BackfillProgress) { cancel() })
	if err == nil || p.Done != 1000 || p.Total != 2500 {
		t.Fatalf("a run stopped after one batch: %+v, %v", p, err)
	}
	// ...resumes with what is left, in batches, reporting each.
	var seen []int
	p, err = b.Run(ctx, db, func(p store.BackfillProgress) { seen = append(seen, p.Done) })
	if err != nil || p.Done != 1500 || p.Total != 1500 || p.Batches != 2 || strings.Join(strings.Fields(fmt.Sprint(seen)), ",") != "[1000,1500]" {
		t.Fatalf("the resumed run: %+v %v, progress %v", p, err, seen)
	}
	var wrong int
	if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM backfill_probe WHERE doubled IS NULL OR doubled != n * 2").Scan(&wrong); err != nil || wrong != 0 {
		t.Fatalf("%d rows not filled right (%v)", wrong, err)
	}
	if p, err := b.Run(ctx, db, nil); err != nil || p.Done != 0 || p.Batches != 0 {
		t.Fatalf("running it again: %+v %v; want nothing done", p, err)
	}

	// As a release's steps: the expand step adds the column, the backfill
	// fills it.
	s.UseMigrations(withMigrations(t, map[string]string{
		"99300_probe_column.sql": "-- krane:phase expand\n-- +goose Up\nALTER TABLE backfill_probe ADD COLUMN tripled INT NULL, ALGORITHM=INSTANT;\n-- +goose Down\nALTER TABLE backfill_probe DROP COLUMN tripled;\n",
	}))
	s.UseBackfills(store.BackfillMigration{Version: 99301, Name: "99301_backfill_tripled",
		Backfill: store.Backfill{Table: "backfill_probe", Key: "id", Set: "tripled = n * 3", Where: "tripled IS NULL", Batch: 700}})
	plan, err := s.MigrationPlan(ctx)
	if err != nil || len(plan) != 2 || plan[1].Phase != store.Expand || !strings.Contains(plan[1].Name, "backfill of backfill_probe") {
		t.Fatalf("plan %+v, %v", plan, err)
	}
	var batches []int
	if _, err := s.MigrateReporting(ctx, store.MigrateReport{Backfill: func(name string, p store.BackfillProgress) {
		if name == "99301_backfill_tripled" {
			batches = append(batches, p.Done)
		}
	}}); err != nil {
		t.Fatal(err)
	}
	if len(batches) != 4 || batches[3] != 2500 {
		t.Errorf("the backfill step reported %v; want four batches up to 2500", batches)
	}
	if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM backfill_probe WHERE tripled IS NULL OR tripled != n * 3").Scan(&wrong); err != nil || wrong != 0 {
		t.Fatalf("%d rows not filled by the backfill step (%v)", wrong, err)
	}
	if st, err := s.SchemaStatus(ctx); err != nil || len(st.Pending) != 0 {
		t.Fatalf("after the steps: %+v %v", st, err)
	}
}
