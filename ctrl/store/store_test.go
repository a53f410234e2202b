package store_test

//lint:file-ignore SA1019 legacy-workload: removed no earlier than v0.3.0 (docs/compatibility.md); this file builds or reads the deprecated top-level workload fields

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/structpb"

	"krane.dev/ctrl/deployspec"
	"krane.dev/ctrl/store"
	"krane.dev/internal/testenv"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
	"krane.dev/shared/kinds"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func openStore(t testing.TB) *store.Store {
	t.Helper()
	return openDSN(t, testenv.SharedMySQL(t).Database(t, t.Name()), store.PoolOptions{})
}

// openDSN opens (and migrates) the database at dsn with pool options.
func openDSN(t testing.TB, dsn string, pool store.PoolOptions) *store.Store {
	t.Helper()
	ctx := context.Background()
	s, err := store.Open(ctx, dsn, pool)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if _, err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return s
}

func TestConcurrentMigratorsApplyOnce(t *testing.T) {
	dsn := testenv.SharedMySQL(t).Database(t, t.Name())
	ctx := context.Background()
	var wg sync.WaitGroup
	applied := make([]int, 4)
	errs := make([]error, 4)
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := store.Open(ctx, dsn, store.PoolOptions{})
			if err != nil {
				errs[i] = err
				return
			}
			defer s.Close()
			res, err := s.Migrate(ctx)
			applied[i], errs[i] = len(res), err
		}()
	}
	wg.Wait()
	appliers, total := 0, 0
	for i := range 4 {
		if errs[i] != nil {
			t.Fatalf("migrator %d: %v", i, errs[i])
		}
		if applied[i] > 0 {
			appliers++
		}
		total += applied[i]
	}
	files, err := filepath.Glob("migrations/*.sql")
	if err != nil || len(files) == 0 {
		t.Fatalf("no migration files: %v", err)
	}
	if appliers != 1 || total != len(files) {
		t.Fatalf("%d of 4 concurrent migrators applied migrations (%v), want exactly 1 applying all %d", appliers, applied, len(files))
	}
	s, err := store.Open(ctx, dsn, store.PoolOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if ok, err := s.MigrationsCurrent(ctx); err != nil || !ok {
		t.Fatalf("MigrationsCurrent = %v, %v after migrating; want true", ok, err)
	}
}

func TestMigrationsCurrentOnEmptyDatabase(t *testing.T) {
	dsn := testenv.SharedMySQL(t).Database(t, t.Name())
	s, err := store.Open(context.Background(), dsn, store.PoolOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if ok, err := s.MigrationsCurrent(context.Background()); err != nil || ok {
		t.Fatalf("MigrationsCurrent on an empty database = %v, %v; want false, nil", ok, err)
	}
}

func putDeployment(ctx context.Context, tx *store.Tx, id, region, image string, replicas int32, status string) error {
	if err := tx.PutDeployment(ctx, store.Deployment{Spec: deployspec.Spec{ID: id, WorkspaceID: "ws", ProjectID: "p", EnvironmentID: "env", AppID: "app", K8sNamespace: "ns", K8sName: "d-" + id, Replicas: replicas, Workload: &clusterv1.Workload{Image: image, CpuMillicores: 100, MemoryMib: 128, EnvVars: map[string]string{"A": "1"}, Command: []string{"serve", "--port=8080"}, Healthcheck: &clusterv1.Healthcheck{Method: "GET", Path: "/health", Port: 8080, PeriodSeconds: 10}}}}); err != nil {
		return err
	}
	return tx.PutTopology(ctx, store.Topology{DeploymentID: id, Region: region, DesiredReplicas: replicas, DesiredStatus: status})
}

func TestWriteTxStampsInTouchOrderAndRaisesHeads(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	stamped, err := s.WriteTx(ctx, func(ctx context.Context, tx *store.Tx) error {
		if err := putDeployment(ctx, tx, "d1", "eu", "img:1", 2, "running"); err != nil {
			return err
		}
		if err := tx.PutSentinel(ctx, store.Sentinel{ID: "s1", Region: "us", EnvironmentID: "env", K8sName: "sen", Image: "sen:1", Replicas: 1}); err != nil {
			return err
		}
		return tx.PutResource(ctx, store.Resource{Kind: "configmap.example.krane.dev", Region: "eu", ID: "cm1", Spec: []byte(`{"data":{"k":"v"}}`)})
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []store.Stamped{
		{Ref: store.Ref{Kind: kinds.Deployment, Region: "eu", ID: "d1"}, Version: 1},
		{Ref: store.Ref{Kind: kinds.Sentinel, Region: "us", ID: "s1"}, Version: 2},
		{Ref: store.Ref{Kind: "configmap.example.krane.dev", Region: "eu", ID: "cm1"}, Version: 3},
	}
	if fmt.Sprint(stamped) != fmt.Sprint(want) {
		t.Fatalf("stamped %v, want %v", stamped, want)
	}
	heads, err := s.ChangeHeads(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if heads[store.HeadKey{Region: "eu", Kind: kinds.Deployment}] != 1 || heads[store.HeadKey{Region: "us", Kind: kinds.Sentinel}] != 2 ||
		heads[store.HeadKey{Region: "eu", Kind: "configmap.example.krane.dev"}] != 3 || len(heads) != 3 {
		t.Fatalf("change heads %v", heads)
	}
	if h, _ := s.Head(ctx); h != 3 {
		t.Fatalf("head %d, want 3", h)
	}

	// Changing a deployment's content re-versions its topology.
	stamped, err = s.WriteTx(ctx, func(ctx context.Context, tx *store.Tx) error {
		return putDeployment(ctx, tx, "d1", "eu", "img:2", 0, "running")
	})
	if err != nil || len(stamped) != 1 || stamped[0].Version != 4 {
		t.Fatalf("second write: %v, %v; want one row at version 4", stamped, err)
	}
	c, err := s.Desired(ctx, kinds.Deployment, "eu", "d1")
	if err != nil {
		t.Fatal(err)
	}
	d := c.Spec.(*clusterv1.Deployment)
	if c.Version != 4 || !c.Deleted || d.Image != "img:2" || d.Command[1] != "--port=8080" || d.EnvVars["A"] != "1" || d.Healthcheck.GetPath() != "/health" {
		t.Fatalf("desired d1 = %+v (spec %v); want version 4, deleted (0 replicas), image img:2", c, d)
	}
	if _, err := s.Desired(ctx, kinds.Deployment, "us", "d1"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("d1 in another region: err %v, want ErrNotFound", err)
	}
	r, err := s.Desired(ctx, "configmap.example.krane.dev", "eu", "cm1")
	if err != nil {
		t.Fatal(err)
	}
	if r.Spec.(*structpb.Struct).GetFields()["data"].GetStructValue().GetFields()["k"].GetStringValue() != "v" {
		t.Fatalf("generic spec %v", r.Spec)
	}
}

func TestTouchOfMissingRowFailsAndRollsBack(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	_, err := s.WriteTx(ctx, func(ctx context.Context, tx *store.Tx) error {
		if err := tx.PutResource(ctx, store.Resource{Kind: "x.example", Region: "eu", ID: "a", Spec: []byte(`{}`)}); err != nil {
			return err
		}
		tx.Touch(kinds.Sentinel, "eu", "nope")
		return nil
	})
	if err == nil {
		t.Fatal("touching a missing row committed")
	}
	if h, _ := s.Head(ctx); h != 0 {
		t.Fatalf("head %d after a failed transaction, want 0", h)
	}
	if _, err := s.Desired(ctx, "x.example", "eu", "a"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("content of a failed transaction is visible: %v", err)
	}
}

func TestStampCommittedIsExactlyOncePerGrantKey(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	// Content committed without a version, as a Restate step would.
	if _, err := s.DB().ExecContext(ctx, `INSERT INTO resources (kind, region, id, spec, created_at, updated_at)
VALUES ('x.example', 'eu', 'a', '{}', 0, 0), ('x.example', 'eu', 'b', '{}', 0, 0)`); err != nil {
		t.Fatal(err)
	}
	refs := []store.Ref{{Kind: "x.example", Region: "eu", ID: "a"}, {Kind: "x.example", Region: "eu", ID: "b"}}
	// Unstamped rows are invisible to agents.
	if _, err := s.Desired(ctx, "x.example", "eu", "a"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("unstamped row visible: %v", err)
	}
	var wg sync.WaitGroup
	grants := make([]store.Grant, 5)
	errs := make([]error, 5)
	for i := range grants {
		wg.Add(1)
		go func() {
			defer wg.Done()
			grants[i], errs[i] = s.StampCommitted(ctx, refs, "invocation-1")
		}()
	}
	wg.Wait()
	fresh := 0
	for i, g := range grants {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		if g.First != 1 || g.Last != 2 {
			t.Fatalf("grant %d = %+v, want versions 1..2 for every call", i, g)
		}
		if !g.Reused {
			fresh++
		}
	}
	if fresh != 1 {
		t.Fatalf("%d calls stamped, want exactly 1", fresh)
	}
	if h, _ := s.Head(ctx); h != 2 {
		t.Fatalf("head %d, want 2", h)
	}
	g, err := s.StampCommitted(ctx, refs[:1], "invocation-2")
	if err != nil || g.First != 3 || g.Last != 3 || g.Reused {
		t.Fatalf("second key: %+v, %v; want version 3", g, err)
	}
}

func TestSnapshotPagesLiveRowsUpToItsHead(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	for i := range 7 {
		deleted := i == 3
		if _, err := s.WriteTx(ctx, func(ctx context.Context, tx *store.Tx) error {
			return tx.PutResource(ctx, store.Resource{Kind: "x.example", Region: "eu", ID: fmt.Sprint("r", i), Spec: []byte(`{}`), Deleted: deleted})
		}); err != nil {
			t.Fatal(err)
		}
	}
	sn, err := s.OpenSnapshot(ctx, "x.example", "eu")
	if err != nil {
		t.Fatal(err)
	}
	defer sn.Close()
	// A write after the snapshot began is not in it.
	if _, err := s.WriteTx(ctx, func(ctx context.Context, tx *store.Tx) error {
		return tx.PutResource(ctx, store.Resource{Kind: "x.example", Region: "eu", ID: "late", Spec: []byte(`{}`)})
	}); err != nil {
		t.Fatal(err)
	}
	var got []uint64
	pages := 0
	for {
		page, err := sn.Next(ctx, 2)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		pages++
		for _, c := range page {
			got = append(got, c.Version)
		}
	}
	if fmt.Sprint(got) != "[1 2 3 5 6 7]" || sn.Head() != 7 || pages != 3 {
		t.Fatalf("snapshot versions %v in %d pages at head %d; want [1 2 3 5 6 7] in 3 pages at head 7", got, pages, sn.Head())
	}
	changes, err := s.ChangesAfter(ctx, "x.example", "eu", 2, 100)
	if err != nil {
		t.Fatal(err)
	}
	var vs []string
	for _, c := range changes {
		vs = append(vs, fmt.Sprintf("%s@%d/%v", c.ID, c.Version, c.Deleted))
	}
	if fmt.Sprint(vs) != "[r2@3/false r3@4/true r4@5/false r5@6/false r6@7/false late@8/false]" {
		t.Fatalf("changes after 2: %v", vs)
	}
}

func TestReportGuardsIgnoreOlderReports(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	if _, err := s.WriteTx(ctx, func(ctx context.Context, tx *store.Tx) error {
		return tx.PutSentinel(ctx, store.Sentinel{ID: "s1", Region: "eu", EnvironmentID: "env", K8sName: "sen", Image: "sen:1", Replicas: 3})
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.StampCommitted(ctx, []store.Ref{{Kind: kinds.Sentinel, Region: "eu", ID: "s1"}}, ""); err != nil { // version 2
		t.Fatal(err)
	}
	liveClusters(t, s, "eu", "eu-1")
	liveClusters(t, s, "us", "us-1")
	t0 := time.Unix(1000, 0)
	report := func(v uint64, at time.Time, image string) bool {
		ok, err := s.ReportSentinel(ctx, "eu", "eu-1", store.Observation{Version: v, At: at}, &clusterv1.SentinelStatus{SentinelId: "s1", RunningImage: image, AvailableReplicas: 3})
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	if !report(2, t0, "new") {
		t.Fatal("first report rejected")
	}
	if report(1, t0.Add(time.Hour), "older-version") {
		t.Fatal("report with an older version accepted")
	}
	if report(2, t0.Add(-time.Nanosecond), "older-time") {
		t.Fatal("report with the same version and an older time accepted")
	}
	reps, err := s.ObjectReports(ctx, kinds.Sentinel, "eu", "s1")
	if err != nil || len(reps) != 1 || !strings.Contains(string(reps[0].Status), `"running_image":"new"`) {
		t.Fatalf("cluster eu-1's report on s1: %+v, %v; want running_image new", reps, err)
	}
	if _, err := s.ReportSentinel(ctx, "us", "us-1", store.Observation{Version: 9, At: t0}, &clusterv1.SentinelStatus{SentinelId: "s1"}); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("report from another region: %v, want ErrNotFound", err)
	}
}

// A wake of many streams queries at once; the pool must keep what it
// opened for them instead of closing all but a few and reopening them on
// the next wake.
func TestPoolKeepsConnectionsAfterABurst(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	const burst = 40
	var ready, wg sync.WaitGroup
	release := make(chan struct{})
	ready.Add(burst)
	for range burst {
		wg.Go(func() {
			conn, err := s.DB().Conn(ctx)
			ready.Done()
			if err != nil {
				t.Error(err)
				return
			}
			<-release
			conn.Close()
		})
	}
	ready.Wait()
	close(release)
	wg.Wait()
	st := s.DB().Stats()
	if st.MaxIdleClosed != 0 || st.Idle < burst {
		t.Fatalf("after a burst of %d connections: %d idle, %d closed for the idle limit; want all kept", burst, st.Idle, st.MaxIdleClosed)
	}
}

// TestStalledConnectionFails: a connection to a server that stopped
// answering (no byte flows, no RST) fails a call that has no deadline of its
// own after the read timeout, instead of hanging it.
func TestStalledConnectionFails(t *testing.T) {
	dsn, proxy := testenv.SharedMySQL(t).DatabaseBehindProxy(t, t.Name())
	s, err := store.Open(context.Background(), dsn, store.PoolOptions{ReadTimeout: time.Second, WriteTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	proxy.Stall()
	defer proxy.Restore()
	done := make(chan error, 1)
	go func() { _, err := s.Head(context.Background()); done <- err }()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("a read on a stalled connection succeeded")
		}
	case <-time.After(60 * time.Second):
		t.Fatal("a read on a stalled connection without a deadline hung for 60s")
	}
}

// TestOneTokenSigningInEndsOnlyItsOwnSessions: sign-ins past a token's
// share end that token's oldest sessions, never another operator's; the
// overall bound still holds.
func TestOneTokenSigningInEndsOnlyItsOwnSessions(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	at := time.Now()
	session := func(token string, n int) store.ConsoleSession {
		at = at.Add(time.Millisecond)
		return store.ConsoleSession{IDHash: []byte(fmt.Sprintf("%-32s", fmt.Sprintf("%s-%d", token, n))), TokenID: token, SealedToken: []byte("x"),
			CreatedAt: at, ExpiresAt: at.Add(time.Hour)}
	}
	other := session("tok-other", 0)
	if err := s.CreateConsoleSession(ctx, other, 100, 5); err != nil {
		t.Fatal(err)
	}
	for i := range 50 {
		if err := s.CreateConsoleSession(ctx, session("tok-greedy", i), 100, 5); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.GetConsoleSession(ctx, other.IDHash); err != nil {
		t.Fatalf("another operator's session after one token signed in 50 times: %v; want it kept", err)
	}
	var greedy int
	if err := s.DB().QueryRowContext(ctx, "SELECT COUNT(*) FROM console_sessions WHERE token_id = 'tok-greedy'").Scan(&greedy); err != nil || greedy != 5 {
		t.Fatalf("the greedy token holds %d sessions (%v); want its share, 5", greedy, err)
	}
	for i := range 10 {
		if err := s.CreateConsoleSession(ctx, session(fmt.Sprintf("tok-%d", i), 0), 8, 5); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := s.CountConsoleSessions(ctx); err != nil || n > 8 {
		t.Fatalf("%d sessions under an overall bound of 8 (%v)", n, err)
	}
}
