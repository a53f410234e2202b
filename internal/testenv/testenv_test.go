package testenv_test

import (
	"context"
	"database/sql"
	"embed"
	"io/fs"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"
	"github.com/pressly/goose/v3"
	restate "github.com/restatedev/sdk-go"
	"github.com/restatedev/sdk-go/server"

	"krane.dev/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

//go:embed testdata/migrations/*.sql
var migrations embed.FS

func TestMySQLAcceptsAMigration(t *testing.T) {
	m := testenv.SharedMySQL(t)
	db, err := sql.Open("mysql", m.Database(t, t.Name()))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	sub, _ := fs.Sub(migrations, "testdata/migrations")
	p, err := goose.NewProvider(goose.DialectMySQL, db, sub)
	if err != nil {
		t.Fatal(err)
	}
	results, err := p.Up(ctx)
	if err != nil {
		t.Fatalf("migrate: %v", err)
	}
	if len(results) != 1 {
		t.Fatalf("applied %d migrations, want 1", len(results))
	}
	if _, err := db.ExecContext(ctx, "INSERT INTO widgets (name, version) VALUES ('a', 1), ('b', 2)"); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM widgets WHERE version > 1").Scan(&n); err != nil || n != 1 {
		t.Fatalf("count = %d, %v; want 1", n, err)
	}
	if v, err := p.GetDBVersion(ctx); err != nil || v != 1 {
		t.Fatalf("db version = %d, %v; want 1", v, err)
	}
}

func TestMySQLRestartKeepsData(t *testing.T) {
	m := testenv.SharedMySQL(t)
	if !m.Private() {
		t.Skip("the MySQL server is external (" + testenv.EnvMySQLDSN + "); only a private server can be restarted")
	}
	db, err := sql.Open("mysql", m.Database(t, t.Name()))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, "CREATE TABLE kv (k VARCHAR(8) PRIMARY KEY, v INT)"); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, "INSERT INTO kv VALUES ('x', 42)"); err != nil {
		t.Fatal(err)
	}
	m.Kill()
	if err := db.PingContext(ctx); err == nil {
		t.Fatal("ping succeeded while the server was killed")
	}
	if err := m.Start(); err != nil {
		t.Fatal(err)
	}
	var v int
	if err := db.QueryRowContext(ctx, "SELECT v FROM kv WHERE k = 'x'").Scan(&v); err != nil || v != 42 {
		t.Fatalf("after restart v = %d, %v; want 42", v, err)
	}
}

// Counter is a Restate virtual object with durable state.
type Counter struct{}

func (Counter) Add(ctx restate.ObjectContext, n int64) (int64, error) {
	v, err := restate.Get[int64](ctx, "count")
	if err != nil {
		return 0, err
	}
	v += n
	restate.Set(ctx, "count", v)
	return v, nil
}

func TestRestateObjectStateSurvivesKill9(t *testing.T) {
	r := testenv.SharedRestate(t)
	handler, err := server.NewRestate().Bind(restate.Reflect(Counter{})).Handler()
	if err != nil {
		t.Fatal(err)
	}
	url := testenv.ServeH2C(t, handler)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := r.Register(ctx, url, false); err != nil {
		t.Fatal(err)
	}
	var got int64
	for i := 1; i <= 3; i++ {
		if err := r.Call(ctx, "Counter/c1/Add", 10, &got, nil); err != nil {
			t.Fatal(err)
		}
	}
	if got != 30 {
		t.Fatalf("before the crash count = %d, want 30", got)
	}
	r.Kill()
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	// The first calls after a restart can race partition leadership; retry
	// with an idempotency key so a retried call counts once.
	deadline := time.Now().Add(30 * time.Second)
	for {
		err = r.Call(ctx, "Counter/c1/Add", 1, &got, map[string]string{"idempotency-key": "after-restart"})
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	if got != 31 {
		t.Fatalf("after kill -9 and restart count = %d, want 31", got)
	}
}
