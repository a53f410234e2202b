package cli_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"krane.dev/ctrl/auth"
	"krane.dev/ctrl/cli"
	"krane.dev/ctrl/internal/ctrltest"
	"krane.dev/ctrl/store"
	"krane.dev/internal/testenv"
	"krane.dev/internal/version"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
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
	if code, _, errOut := run(t, "cluster", "list", "--db-dsn", dsn); code == 0 || !strings.Contains(errOut, "ctrl migrate") {
		t.Fatalf("cluster list on an unmigrated database: %d %q; want an error naming `ctrl migrate`", code, errOut)
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
