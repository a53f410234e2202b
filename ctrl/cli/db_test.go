package cli_test

import (
	"context"
	"strings"
	"testing"

	"krane.dev/ctrl/store"
	"krane.dev/internal/testenv"
)

// `ctrl admin db restored` gives the database a new generation (every krane
// host's cursor is refused from then on, and the host bootstraps again),
// and refuses a database whose schema is not current.
func TestDBRestoredGivesANewGeneration(t *testing.T) {
	dsn := testenv.SharedMySQL(t).Database(t, t.Name())
	if code, _, errOut := run(t, "admin", "db", "restored", "--db-dsn", dsn); code == 0 || !strings.Contains(errOut, "ctrl admin migrate") {
		t.Fatalf("admin db restored before migrate: exit %d, %q; want refused naming `ctrl admin migrate`", code, errOut)
	}
	if code, _, errOut := run(t, "admin", "migrate", "--db-dsn", dsn); code != 0 {
		t.Fatalf("migrate: %s", errOut)
	}
	ctx := context.Background()
	st, err := store.Open(ctx, dsn, store.PoolOptions{MaxOpenConns: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	before, err := st.Generation(ctx)
	if err != nil {
		t.Fatal(err)
	}
	code, out, errOut := run(t, "admin", "db", "restored", "--db-dsn", dsn, "--reason", "restored from a test backup")
	if code != 0 {
		t.Fatalf("admin db restored: exit %d: %s", code, errOut)
	}
	after, err := st.Generation(ctx)
	if err != nil || after == before || !strings.Contains(out, before+" -> "+after) {
		t.Fatalf("generation %q -> %q (%v), printed %q", before, after, err, out)
	}
	if _, err := st.CheckCursor(ctx, "c-1", "r", 0, before); err != nil {
		t.Fatalf("a bootstrap after the restore: %v", err)
	}
}
