package compat_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/mod/semver"

	"krane.dev/ctrl/store"
	"krane.dev/internal/compat"
	"krane.dev/internal/testenv"
)

// baseline is the baseline release's sources, extracted once per cache.
func baseline(t *testing.T) (root, src string, r compat.Release) {
	t.Helper()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	src, r, err = compat.Source(context.Background(), root)
	if err != nil {
		t.Fatal(err)
	}
	return root, src, r
}

// migrationGate reads what CheckMigrations compares: the baseline's
// migrations and query names, and this tree's migrations.
func migrationGate(t *testing.T) (base, cur compat.MigrationSet, line string, names compat.SQLNames) {
	t.Helper()
	root, src, r := baseline(t)
	var err error
	if base, err = compat.ReadMigrationsDir(src); err != nil {
		t.Fatal(err)
	}
	if cur, err = compat.ReadMigrationsDir(root); err != nil {
		t.Fatal(err)
	}
	if names, err = compat.ReadSQLNames(filepath.Join(src, "ctrl")); err != nil {
		t.Fatal(err)
	}
	return base, cur, semver.MajorMinor(r.Version), names
}

// TestMigrationsExpandThenContract holds this tree's migrations to the
// rules of docs/compatibility.md against the baseline release.
func TestMigrationsExpandThenContract(t *testing.T) {
	base, cur, line, names := migrationGate(t)
	for _, v := range compat.CheckMigrations(base, cur, line, names) {
		t.Error(v)
	}
}

// withExtra is set plus one migration file.
func withExtra(t *testing.T, set compat.MigrationSet, name, src string) compat.MigrationSet {
	t.Helper()
	m, err := store.ParseMigration(name, []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	out := compat.MigrationSet{Infos: append(append([]store.MigrationInfo{}, set.Infos...), m), Files: map[string][]byte{name: []byte(src)}}
	for k, v := range set.Files {
		out.Files[k] = v
	}
	return out
}

// TestMigrationGateNegativeControls: each rule fails a migration written to
// break it, against the real baseline, naming the rule.
func TestMigrationGateNegativeControls(t *testing.T) {
	base, cur, line, names := migrationGate(t)
	released := base.Infos[len(base.Infos)-1].Name
	for _, c := range []struct{ what, name, src, want string }{
		{"a column drop in an expand step", "99001_x.sql",
			"-- krane:phase expand\n-- +goose Up\nALTER TABLE deployments ADD COLUMN y INT NULL, DROP COLUMN k8s_name, ALGORITHM=INSTANT;\n", "an expand step removes column deployments.k8s_name"},
		{"a NOT NULL column without a default in an expand step", "99001_x.sql",
			"-- krane:phase expand\n-- +goose Up\nALTER TABLE deployments ADD COLUMN y INT NOT NULL, ALGORITHM=INSTANT;\n", "old replicas' INSERTs"},
		{"an expand step's ALTER TABLE that may copy the table", "99001_x.sql",
			"-- krane:phase expand\n-- +goose Up\nALTER TABLE deployments ADD COLUMN y INT NULL;\n", "ask for online DDL"},
		{"a migration that declares no phase", "99001_x.sql",
			"-- +goose Up\nCREATE TABLE z (a INT);\n", "declares its phase"},
		{"a contract step in the release of its expand step", "99002_x.sql",
			"-- krane:phase contract\n-- krane:contracts 00060\n-- krane:requires-ctrl " + line + "\n-- +goose Up\nDROP TABLE schema_requirements;\n", "not in a released version"},
		{"a contract step dropping what the baseline's queries name", "99002_x.sql",
			"-- krane:phase contract\n-- krane:contracts " + strings.SplitN(released, "_", 2)[0] + "\n-- krane:requires-ctrl " + line + "\n-- +goose Up\nALTER TABLE deployments DROP COLUMN replicas;\n", "the baseline's queries still name"},
	} {
		got := compat.CheckMigrations(base, withExtra(t, cur, c.name, c.src), line, names)
		found := false
		for _, v := range got {
			found = found || strings.Contains(v.Rule, c.want)
		}
		if !found {
			t.Errorf("%s: the gate said %v; want a violation saying %q", c.what, got, c.want)
		}
	}
	changed := compat.MigrationSet{Infos: cur.Infos, Files: map[string][]byte{}}
	for k, v := range cur.Files {
		changed.Files[k] = v
	}
	changed.Files[released] = append(append([]byte{}, cur.Files[released]...), "-- an edit\n"...)
	if got := compat.CheckMigrations(base, changed, line, names); len(got) == 0 || !strings.Contains(got[0].Rule, "never changes") {
		t.Errorf("an edited released migration: the gate said %v", got)
	}
}
