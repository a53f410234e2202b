package cli_test

//lint:file-ignore SA1019 legacy-workload: removed no earlier than v0.3.0 (docs/compatibility.md); this file builds or reads the deprecated top-level workload fields

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"krane.dev/ctrl/internal/ctrltest"
	"krane.dev/internal/testenv"
	ctrlv1 "krane.dev/proto/krane/ctrl/v1"
)

// TestSecretFileErrorsNeverShowValues: malformed lines of a
// --secret-env-file or --credentials-file, each carrying a marker where a
// value (or a password that ended up in a key) would be, are refused with
// errors that name the file and line; the marker appears in no output of
// the command, in none of ctrl's log lines and in no audit row. ctrl's own
// refusal of such keys (a caller that is not this CLI) names no key
// either.
func TestSecretFileErrorsNeverShowValues(t *testing.T) {
	const marker = "Mq7secretVALUE"
	env := ctrltest.Start(t, ctrltest.Options{Restate: testenv.SharedRestate(t), Configure: ctrltest.WithKeyring(ctrltest.Keyring(t))})
	t.Setenv("CTRL_ADDR", env.Server.GRPCAddr())
	t.Setenv("CTRL_TOKEN", env.OperatorToken(t, "cli test"))
	t.Setenv("CTRL_DB_DSN", env.DSN)

	dotenv := []string{
		"DB_URL:postgres://app:" + marker + "@db/x?sslmode=require", // a ':' for '=': the password lands in the key
		marker + "-TOKEN=v",
		"1" + marker + "=v",
		"PASSWORD " + marker,
		`PASSWORD="` + marker,
		`PASSWORD='` + marker,
		`PASSWORD='x' ` + marker,
		`PASSWORD="x" ` + marker,
		strings.Repeat("K", 300) + marker + "=v",
	}
	jsonFiles := []string{
		`{"DB_URL:` + marker + `": "v"}`,
		`{"A": "v", "` + marker + `"}`,
		`{"A": ` + marker + `}`,
		`{"A": 12345` + marker + `}`,
		`{"A": "v"} ` + marker,
		`{"A": "v", "A": "` + marker + `"}`,
		`["` + marker + `"]`,
	}
	dir := t.TempDir()
	var outputs []string
	for i, line := range append(dotenv, jsonFiles...) {
		file := filepath.Join(dir, fmt.Sprintf("f%d", i))
		if err := os.WriteFile(file, []byte("GOOD=fine\n"+line+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		for _, args := range [][]string{
			append(append([]string{}, create...), "--environment", "sec", "--image", "registry.test/app:1", "--region", "eu", "--secret-env-file", file),
			{"sentinel", "deploy", "s-none", "--credentials-file", file},
		} {
			if i >= len(dotenv) && args[0] == "deploy" {
				continue // --secret-env-file is dotenv only
			}
			code, out, errOut := run(t, args...)
			if code == 0 {
				t.Errorf("%s with line %q: accepted", args[len(args)-2], line)
			}
			if !strings.Contains(errOut, file) {
				t.Errorf("%s with line %q: the error does not name the file: %q", args[len(args)-2], line, errOut)
			}
			outputs = append(outputs, out, errOut)
		}
	}

	// ctrl's own checks, for a caller that is not this CLI.
	ctx := context.Background()
	_, err := env.Deployments(t).CreateDeployment(ctx, &ctrlv1.CreateDeploymentRequest{
		WorkspaceId: "ws1", ProjectId: "p1", AppId: "a1", EnvironmentId: "sec", Image: "registry.test/app:1", Regions: []string{"eu"},
		SecretEnv: map[string]string{"DB_URL:" + marker: "v", "GOOD": marker},
	})
	if err == nil {
		t.Error("CreateDeployment with a secret variable whose name is no variable name: accepted")
	} else {
		outputs = append(outputs, err.Error())
	}
	_, err = env.Sentinels(t).DeploySentinel(ctx, &ctrlv1.DeploySentinelRequest{
		SentinelId: "s-none", Credentials: map[string]string{marker + "-x": "v", "GOOD": marker},
	})
	if err == nil {
		t.Error("DeploySentinel with a credential whose name is no variable name: accepted")
	} else {
		outputs = append(outputs, err.Error())
	}

	code, out, errOut := run(t, "vault", "audit")
	outputs = append(outputs, out, errOut)
	if code != 0 {
		t.Errorf("vault audit: %d %q", code, errOut)
	}
	rows, err := env.Store.DB().QueryContext(ctx, "SELECT CONCAT_WS(' ', deployment_id, cluster_id, region, token_id, outcome, reason, key_id) FROM vault_audit")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var row string
		if err := rows.Scan(&row); err != nil {
			t.Fatal(err)
		}
		outputs = append(outputs, row)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	outputs = append(outputs, env.Logs.String())
	for _, o := range outputs {
		if i := strings.Index(o, marker); i >= 0 {
			t.Errorf("the marker shows: ...%s...", o[max(0, i-120):min(len(o), i+len(marker)+20)])
		}
	}
}
