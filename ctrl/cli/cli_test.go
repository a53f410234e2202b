package cli_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"krane.dev/ctrl/auth"
	"krane.dev/ctrl/cli"
	"krane.dev/ctrl/internal/ctrltest"
	"krane.dev/ctrl/serve"
	"krane.dev/ctrl/store"
	"krane.dev/internal/testenv"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
	ctrlv1 "krane.dev/proto/krane/ctrl/v1"
	"krane.dev/shared/version"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// run executes the command line and returns exit code, stdout, stderr.
func run(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := cli.Main(context.Background(), args, &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestVersion(t *testing.T) {
	code, out, _ := run(t, "--version")
	if code != 0 || out != version.Version+"\n" {
		t.Fatalf("ctrl --version = %d %q, want %q", code, out, version.Version+"\n")
	}
}

func TestMigrateRegisterRevokeAndOperatorTokens(t *testing.T) {
	dsn := testenv.SharedMySQL(t).Database(t, t.Name())
	ctx := context.Background()

	// Before migrating, commands that need the schema say what to do.
	if code, _, errOut := run(t, "cluster", "list", "--db-dsn", dsn); code == 0 || !strings.Contains(errOut, "ctrl admin migrate") {
		t.Fatalf("cluster list on an unmigrated database: %d %q; want an error naming `ctrl admin migrate`", code, errOut)
	}
	if code, out, errOut := run(t, "migrate", "--db-dsn", dsn); code != 0 || !strings.Contains(out, "applied 00001_init.sql") {
		t.Fatalf("migrate: %d %q %q", code, out, errOut)
	}
	// The DSN from the environment works as well as the flag.
	t.Setenv("CTRL_DB_DSN", dsn)
	if code, out, errOut := run(t, "migrate"); code != 0 || !strings.Contains(out, "schema is current") {
		t.Fatalf("second migrate: %d %q %q", code, out, errOut)
	}

	// register prints the token once, on stdout, and stores only its hash.
	code, out, errOut := run(t, "cluster", "register", "--region", "eu", "--cluster", "eu-1")
	if code != 0 {
		t.Fatalf("register: %d %q", code, errOut)
	}
	token := strings.TrimSpace(out)
	p, err := auth.Parse(token)
	if err != nil || p.Kind != store.ClusterToken || strings.Count(out, "\n") != 1 {
		t.Fatalf("register printed %q (%v); want exactly one cluster token line", out, err)
	}
	if n := strings.Count(out+errOut, p.Secret); n != 1 {
		t.Fatalf("the token's secret appears %d times in the output, want once", n)
	}
	if !strings.Contains(errOut, "shown only once") {
		t.Errorf("register does not tell the operator the token is shown once: %q", errOut)
	}
	st, err := store.Open(ctx, dsn, store.PoolOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var kind, cluster, region string
	var hash []byte
	if err := st.DB().QueryRowContext(ctx, "SELECT kind, cluster_id, region, secret_hash FROM api_tokens WHERE id = ?", p.ID).Scan(&kind, &cluster, &region, &hash); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte(p.Secret))
	if kind != "cluster" || cluster != "eu-1" || region != "eu" || !bytes.Equal(hash, sum[:]) {
		t.Fatalf("stored token: %s %s %s %x; want cluster eu-1 eu and sha256 of the secret", kind, cluster, region, hash)
	}
	var plain int
	if err := st.DB().QueryRowContext(ctx, "SELECT COUNT(*) FROM api_tokens WHERE id LIKE ? OR name LIKE ? OR secret_hash LIKE ?",
		"%"+p.Secret+"%", "%"+p.Secret+"%", "%"+p.Secret+"%").Scan(&plain); err != nil || plain != 0 {
		t.Fatalf("the secret is stored in plaintext (%d rows, %v)", plain, err)
	}

	// A cluster cannot move to another region.
	if code, _, errOut := run(t, "cluster", "register", "--region", "us", "--cluster", "eu-1"); code == 0 || !strings.Contains(errOut, "is in region eu") {
		t.Fatalf("re-register in another region: %d %q; want a refusal", code, errOut)
	}
	if code, _, errOut := run(t, "cluster", "register", "--cluster", "x"); code == 0 || !strings.Contains(errOut, "region") {
		t.Fatalf("register without --region: %d %q", code, errOut)
	}

	code, out, _ = run(t, "cluster", "list")
	if code != 0 || !strings.Contains(out, "CLUSTER") || !regexpLine(out, "eu-1", "eu", "1", "never") {
		t.Fatalf("cluster list: %d\n%s", code, out)
	}

	// The token works against a real server, and stops working once revoked.
	env := ctrltest.Start(t, ctrltest.Options{DSN: dsn})
	cli := env.Cluster(t, token)
	if _, err := cli.Heartbeat(ctx, &clusterv1.HeartbeatRequest{AgentVersion: "test"}); err != nil {
		t.Fatalf("heartbeat with the registered token: %v", err)
	}
	code, out, errOut = run(t, "cluster", "revoke", "--cluster", "eu-1")
	if code != 0 || !strings.Contains(out, "revoked 1 token(s) of cluster eu-1") {
		t.Fatalf("revoke: %d %q %q", code, out, errOut)
	}
	var revokedAt *int64
	if err := st.DB().QueryRowContext(ctx, "SELECT revoked_at FROM api_tokens WHERE id = ?", p.ID).Scan(&revokedAt); err != nil || revokedAt == nil {
		t.Fatalf("revoked_at = %v, %v; want set", revokedAt, err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, err := cli.Heartbeat(ctx, &clusterv1.HeartbeatRequest{AgentVersion: "test"})
		if status.Code(err) == codes.Unauthenticated {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("revoked token still accepted after 5s: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if code, _, errOut := run(t, "cluster", "revoke", "--cluster", "nope"); code == 0 || !strings.Contains(errOut, `no cluster "nope"`) {
		t.Fatalf("revoke of an unknown cluster: %d %q", code, errOut)
	}
	code, out, _ = run(t, "cluster", "list")
	if code != 0 || !regexpLine(out, "eu-1", "eu", "0") || !strings.Contains(out, "test") {
		t.Fatalf("cluster list after revoke:\n%s", out)
	}

	// Operator tokens.
	code, out, errOut = run(t, "token", "create-operator", "--name", "release-pipeline")
	if code != 0 {
		t.Fatalf("create-operator: %d %q", code, errOut)
	}
	op, err := auth.Parse(strings.TrimSpace(out))
	if err != nil || op.Kind != store.OperatorToken {
		t.Fatalf("create-operator printed %q (%v)", out, err)
	}
	tok, err := st.LookupToken(ctx, op.ID)
	if err != nil || tok.Name != "release-pipeline" || !auth.Matches(op.Secret, tok.SecretHash) || tok.Kind != store.OperatorToken {
		t.Fatalf("stored operator token %+v, %v", tok, err)
	}
	if code, _, _ := run(t, "token", "create-operator"); code == 0 {
		t.Fatal("create-operator without --name succeeded")
	}
}

// regexpLine reports whether some line has all fields, in order.
func regexpLine(out string, fields ...string) bool {
	for _, line := range strings.Split(out, "\n") {
		got := strings.Fields(line)
		if len(got) >= len(fields) && strings.Join(got[:len(fields)], " ") == strings.Join(fields, " ") {
			return true
		}
	}
	return false
}

func TestTokenListRevokeAndExpiresIn(t *testing.T) {
	dsn := testenv.SharedMySQL(t).Database(t, t.Name())
	ctx := context.Background()
	t.Setenv("CTRL_DB_DSN", dsn)
	if code, _, errOut := run(t, "migrate"); code != 0 {
		t.Fatalf("migrate: %s", errOut)
	}

	// --expires-in: days, Go durations, and clear refusals.
	code, out, errOut := run(t, "cluster", "register", "--region", "eu", "--cluster", "eu-1", "--expires-in", "30d")
	if code != 0 || !strings.Contains(errOut, "expires at") {
		t.Fatalf("register --expires-in 30d: %d %q", code, errOut)
	}
	cluster, _ := auth.Parse(strings.TrimSpace(out))
	st, err := store.Open(ctx, dsn, store.PoolOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	tok, err := st.LookupToken(ctx, cluster.ID)
	if err != nil || tok.ExpiresAt.Sub(tok.CreatedAt) != 30*24*time.Hour {
		t.Fatalf("stored token %+v, %v; want it to expire 30 days after creation", tok, err)
	}
	code, out, errOut = run(t, "token", "create-operator", "--name", "ci pipeline", "--expires-in", "1d12h")
	if code != 0 || !strings.Contains(errOut, "expires at") {
		t.Fatalf("create-operator --expires-in 1d12h: %d %q", code, errOut)
	}
	operator, _ := auth.Parse(strings.TrimSpace(out))
	if tok, _ := st.LookupToken(ctx, operator.ID); tok.ExpiresAt.Sub(tok.CreatedAt) != 36*time.Hour {
		t.Fatalf("operator token expires %s after creation, want 36h", tok.ExpiresAt.Sub(tok.CreatedAt))
	}
	code, out, _ = run(t, "token", "create-operator", "--name", "forever")
	if code != 0 {
		t.Fatal("create-operator without --expires-in failed")
	}
	forever, _ := auth.Parse(strings.TrimSpace(out))
	for _, c := range []struct{ flag, says string }{
		{"soon", "is not a duration"}, {"0s", "too short"}, {"-1h", "too short"}, {"500ms", "too short"},
		{"4000d", "longer than 10 years"}, {"xd", "is not a duration"},
	} {
		code, _, errOut := run(t, "token", "create-operator", "--name", "x", "--expires-in", c.flag)
		if code == 0 || !strings.Contains(errOut, c.says) {
			t.Errorf("--expires-in %s: %d %q; want an error saying %q", c.flag, code, errOut, c.says)
		}
	}

	// token list: ids, kinds, owners, expiry; never a secret.
	code, out, _ = run(t, "token", "list")
	if code != 0 || !strings.Contains(out, "ID") || !strings.Contains(out, "EXPIRES") || !strings.Contains(out, "REVOKED") {
		t.Fatalf("token list: %d\n%s", code, out)
	}
	if !regexpLine(out, cluster.ID, "cluster", "eu-1", "eu") || !regexpLine(out, operator.ID, "operator", "ci", "pipeline", "-") ||
		!regexpLine(out, forever.ID, "operator", "forever", "-") || !strings.Contains(out, "never") {
		t.Fatalf("token list misses a token:\n%s", out)
	}
	for _, p := range []auth.Parsed{cluster, operator, forever} {
		if strings.Contains(out, p.Secret) {
			t.Fatalf("token list prints a secret:\n%s", out)
		}
	}
	if code, out, _ := run(t, "token", "list", "--cluster", "eu-1"); code != 0 || strings.Contains(out, operator.ID) || !strings.Contains(out, cluster.ID) {
		t.Fatalf("token list --cluster eu-1:\n%s", out)
	}

	// token revoke: by id (or a pasted token), once; unknown ids say where ids are.
	code, out, errOut = run(t, "token", "revoke", operator.ID)
	if code != 0 || !strings.Contains(out, "revoked operator token "+operator.ID+" (ci pipeline)") || !strings.Contains(errOut, "refuses it now") {
		t.Fatalf("token revoke: %d %q %q", code, out, errOut)
	}
	if code, out, _ := run(t, "token", "revoke", operator.ID); code != 0 || !strings.Contains(out, "already revoked") {
		t.Fatalf("second token revoke: %d %q", code, out)
	}
	if code, _, errOut := run(t, "token", "revoke", "nosuchtoken0"); code == 0 || !strings.Contains(errOut, "ctrl admin token list") {
		t.Fatalf("revoke of an unknown id: %d %q; want an error pointing at `ctrl admin token list`", code, errOut)
	}
	if code, _, errOut := run(t, "token", "revoke"); code == 0 || !strings.Contains(errOut, "ctrl admin token list") {
		t.Fatalf("revoke without an id: %d %q", code, errOut)
	}
	whole := "krane_c_" + cluster.ID + "_" + cluster.Secret
	code, out, errOut = run(t, "token", "revoke", whole)
	if code != 0 || !strings.Contains(out, "revoked cluster token "+cluster.ID+" (cluster eu-1, region eu)") || strings.Contains(out+errOut, cluster.Secret) {
		t.Fatalf("token revoke with a whole token: %d %q %q", code, out, errOut)
	}
	code, out, _ = run(t, "token", "list")
	if code != 0 {
		t.Fatalf("token list after revoke:\n%s", out)
	}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) > 0 && (f[0] == operator.ID || f[0] == cluster.ID) && f[len(f)-1] == "-" {
			t.Errorf("a revoked token shows no revocation time: %q", line)
		}
		if len(f) > 0 && f[0] == forever.ID && f[len(f)-1] != "-" {
			t.Errorf("a valid token shows a revocation time: %q", line)
		}
	}
	if code, out, _ := run(t, "token", "list", "--valid"); code != 0 || strings.Contains(out, operator.ID) || strings.Contains(out, cluster.ID) || !strings.Contains(out, forever.ID) {
		t.Fatalf("token list --valid:\n%s", out)
	}
}

// A fleet is registered from a list in one transaction: every cluster gets
// a working token, or, on any error, none does.
func TestRegisterClustersFromAList(t *testing.T) {
	dsn := testenv.SharedMySQL(t).Database(t, t.Name())
	ctx := context.Background()
	t.Setenv("CTRL_DB_DSN", dsn)
	if code, _, errOut := run(t, "migrate"); code != 0 {
		t.Fatalf("migrate: %q", errOut)
	}
	if code, _, errOut := run(t, "cluster", "register", "--region", "eu", "--cluster", "eu-0"); code != 0 {
		t.Fatalf("register eu-0: %q", errOut)
	}
	const n = 1200 // more than one statement's worth
	var list strings.Builder
	list.WriteString("# region cluster\n\n")
	for i := range n {
		fmt.Fprintf(&list, "%s eu-%d\n", []string{"eu", "us"}[i%2], i)
	}
	file := filepath.Join(t.TempDir(), "clusters.txt")
	if err := os.WriteFile(file, []byte(list.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	countTokens := func() int {
		st, err := store.Open(ctx, dsn, store.PoolOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		toks, err := st.ListTokens(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return len(toks)
	}

	// A list that would move eu-0 (registered in eu) to us registers
	// nothing, not even the new cluster before it.
	bad := filepath.Join(t.TempDir(), "bad.txt")
	if err := os.WriteFile(bad, []byte("eu eu-new\nus eu-0\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, out, errOut := run(t, "cluster", "register", "--from", bad); code == 0 || out != "" || !strings.Contains(errOut, "eu-0 (in eu, not us)") {
		t.Fatalf("a list moving eu-0 to us: %d %q %q; want a refusal naming it and no tokens", code, out, errOut)
	}
	if got := countTokens(); got != 1 {
		t.Fatalf("%d tokens after a refused list, want the 1 from before", got)
	}
	if err := os.WriteFile(bad, []byte("eu a\neu a\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, _, errOut := run(t, "cluster", "register", "--from", bad); code == 0 || !strings.Contains(errOut, "listed twice") {
		t.Fatalf("a list naming a cluster twice: %d %q", code, errOut)
	}
	if code, _, errOut := run(t, "cluster", "register", "--from", bad, "--cluster", "x"); code == 0 || !strings.Contains(errOut, "leave out") {
		t.Fatalf("--from with --cluster: %d %q", code, errOut)
	}

	code, out, errOut := run(t, "cluster", "register", "--from", file)
	if code != 0 || !strings.Contains(errOut, fmt.Sprintf("Registered %d clusters", n)) {
		t.Fatalf("register --from: %d %q", code, errOut)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != n {
		t.Fatalf("%d output lines, want %d", len(lines), n)
	}
	if got := countTokens(); got != n+1 {
		t.Fatalf("%d tokens, want %d", got, n+1)
	}
	// Each line is the cluster and its token, in the file's order; the
	// tokens work (sample a few against a real server).
	env := ctrltest.Start(t, ctrltest.Options{DSN: dsn})
	for _, i := range []int{0, 1, n / 2, n - 1} {
		f := strings.Fields(lines[i])
		if len(f) != 2 || f[0] != fmt.Sprintf("eu-%d", i) {
			t.Fatalf("line %d = %q, want `eu-%d TOKEN`", i, lines[i], i)
		}
		cli := env.Cluster(t, f[1])
		if _, err := cli.Heartbeat(ctx, &clusterv1.HeartbeatRequest{AgentVersion: "test"}); err != nil {
			t.Fatalf("heartbeat of eu-%d with its new token: %v", i, err)
		}
	}
}

// TestRevokeReturnsOnceEveryReplicaRefuses: `ctrl admin token revoke`
// returns once every ctrl replica reading the database has read the
// revocation, so the token is refused on each of them from then on; a
// replica that has not read it within --wait is named, and the command
// fails.
func TestRevokeReturnsOnceEveryReplicaRefuses(t *testing.T) {
	dsn := testenv.SharedMySQL(t).Database(t, t.Name())
	a := ctrltest.Start(t, ctrltest.Options{DSN: dsn})
	b := ctrltest.Start(t, ctrltest.Options{DSN: dsn})
	ctx := context.Background()
	token := a.OperatorToken(t, "ops")
	p, err := auth.Parse(token)
	if err != nil {
		t.Fatal(err)
	}
	for _, env := range []*ctrltest.Env{a, b} { // each replica caches the token
		if _, err := ctrlv1.NewFleetServiceClient(env.Dial(t, token)).ListClusters(ctx, &ctrlv1.ListClustersRequest{}); err != nil {
			t.Fatal(err)
		}
	}
	code, out, errOut := run(t, "admin", "token", "revoke", p.ID, "--db-dsn", dsn)
	if code != 0 || !strings.Contains(errOut, "Every ctrl replica reading the database (2) refuses it now") {
		t.Fatalf("revoke: exit %d\n%s%s", code, out, errOut)
	}
	for name, env := range map[string]*ctrltest.Env{"a": a, "b": b} {
		_, err := ctrlv1.NewFleetServiceClient(env.Dial(t, token)).ListClusters(ctx, &ctrlv1.ListClustersRequest{})
		if status.Code(err) != codes.Unauthenticated {
			t.Errorf("replica %s, right after the revoke returned: %v; want UNAUTHENTICATED", name, err)
		}
	}

	// A replica that reads the revoked tokens only every minute holds the
	// command up, and is named.
	ctrltest.Start(t, ctrltest.Options{DSN: dsn, Configure: func(c *serve.Config) { c.Auth.RevocationPollInterval = time.Minute }})
	second := a.OperatorToken(t, "ops-2")
	p2, _ := auth.Parse(second)
	code, _, errOut = run(t, "admin", "token", "revoke", p2.ID, "--db-dsn", dsn, "--wait", "2s")
	if code == 0 || !strings.Contains(errOut, "1 ctrl replica(s) have not read the revocation") {
		t.Fatalf("revoke with a replica that has not read it: exit %d %q; want a failure naming it", code, errOut)
	}
}
