package cli

import (
	"bytes"
	"context"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The value every malformed input below holds: no error may show it.
const leak = "hunter2-leak"

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestCredentialsFile: --credentials-file takes dotenv lines or a JSON
// object of strings, and a malformed file is an error naming the file and
// the line, never a value.
func TestCredentialsFile(t *testing.T) {
	dotenv := writeFile(t, "sentinel.env", "# database\nexport DATABASE_PRIMARY='mysql://u:p@db/x'\nREDIS_URL=redis://r:6379 # comment\n")
	got, err := readCredentialsFile(dotenv)
	want := map[string]string{"DATABASE_PRIMARY": "mysql://u:p@db/x", "REDIS_URL": "redis://r:6379"}
	if err != nil || !maps.Equal(got, want) {
		t.Fatalf("dotenv: %v, %v; want %v", got, err, want)
	}
	js := writeFile(t, "sentinel.json", "\n  {\n  \"CLICKHOUSE_URL\": \"clickhouse://c\",\n  \"EMPTY\": \"\"\n}\n")
	got, err = readCredentialsFile(js)
	want = map[string]string{"CLICKHOUSE_URL": "clickhouse://c", "EMPTY": ""}
	if err != nil || !maps.Equal(got, want) {
		t.Fatalf("JSON: %v, %v; want %v", got, err, want)
	}

	for name, c := range map[string]struct{ content, line string }{
		"dotenv without =":          {"A=1\nJUST_" + leak + "\n", "line 2"},
		"dotenv key twice":          {"A=" + leak + "\nB=2\nA=3\n", "line 3"},
		"dotenv bad name":           {"A=1\n\n1BAD=" + leak + "\n", "not a variable name"},
		"dotenv open quote":         {"A=\"" + leak + "\n", "line 1"},
		"JSON number":               {"{\n\"A\": \"x\",\n\"PIN\": 1234" + leak[:0] + "\n}", "line 3"},
		"JSON key twice":            {"{\"A\": \"" + leak + "\",\n\"A\": \"y\"}", "line 2"},
		"JSON syntax":               {"{\n\"A\": \"" + leak + "\",\n\"B\" \"y\"\n}", "line 3"},
		"JSON not closed":           {"{\"A\": \"" + leak + "\"", "not closed"},
		"JSON text after":           {"{\"A\": \"" + leak + "\"}\n{}", "text after"},
		"JSON bad name":             {"{\"a-b\": \"" + leak + "\"}", "not a variable name"},
		"JSON array is not allowed": {"[\"" + leak + "\"]", "dotenv"}, // not '{': read as dotenv lines, refused
	} {
		path := writeFile(t, "bad", c.content)
		_, err := readCredentialsFile(path)
		if err == nil {
			t.Errorf("%s: accepted", name)
			continue
		}
		msg := err.Error()
		if !strings.Contains(msg, "--credentials-file") || strings.Contains(msg, leak) || strings.Contains(msg, "1234") {
			t.Errorf("%s: %q, want an error naming the flag and no value", name, msg)
		}
		if c.line != "dotenv" && !strings.Contains(msg, c.line) {
			t.Errorf("%s: %q, want it to say %q", name, msg, c.line)
		}
	}
	if _, err := readCredentialsFile(filepath.Join(t.TempDir(), "missing")); err == nil || !strings.Contains(err.Error(), "--credentials-file") {
		t.Errorf("a missing file: %v", err)
	}
}

// TestCredentialsFrom: files first, --credential KEY from the environment
// or (KEY=-) stdin wins; a value on the command line is refused.
func TestCredentialsFrom(t *testing.T) {
	file := writeFile(t, "c.env", "A=from-file\nB=from-file\n")
	env := map[string]string{"B": "from-environment"}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }

	got, err := credentialsFrom([]string{file}, []string{"B", "C=-"}, lookup, strings.NewReader("from-stdin\n"))
	want := map[string]string{"A": "from-file", "B": "from-environment", "C": "from-stdin"}
	if err != nil || !maps.Equal(got, want) {
		t.Fatalf("got %v, %v; want %v", got, err, want)
	}
	if got, err := credentialsFrom(nil, nil, lookup, strings.NewReader("")); got != nil || err != nil {
		t.Fatalf("nothing given: %v, %v (want no credentials: the sentinel keeps its own)", got, err)
	}
	for name, c := range map[string]struct {
		keys []string
		want string
	}{
		"value on the command line": {[]string{"B=" + leak}, "never taken from the command line"},
		"missing variable":          {[]string{"MISSING"}, "no variable MISSING"},
		"twice":                     {[]string{"B", "B"}, "given twice"},
		"stdin twice":               {[]string{"B=-", "C=-"}, "stdin is read once"},
		"bad name":                  {[]string{"1X"}, "variable name"},
	} {
		_, err := credentialsFrom(nil, c.keys, lookup, strings.NewReader(leak))
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), leak) {
			t.Errorf("%s: %v, want an error saying %q without the value", name, err, c.want)
		}
	}
}

// TestSentinelDeployRefusesCredentialOnArgv: the command fails before it
// dials ctrl when a value is on the command line.
func TestSentinelDeployRefusesCredentialOnArgv(t *testing.T) {
	run := func(_ *testing.T, args ...string) (int, string, string) {
		var out, errOut bytes.Buffer
		code := Main(context.Background(), args, &out, &errOut)
		return code, out.String(), errOut.String()
	}
	code, _, errOut := run(t, "sentinel", "deploy", "sen_x", "--credential", "DATABASE_PASSWORD="+leak)
	if code == 0 || !strings.Contains(errOut, "never taken from the command line") || strings.Contains(errOut, leak) {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	bad := writeFile(t, "bad.env", "OK=1\nNOT A LINE\n")
	code, _, errOut = run(t, "sentinel", "deploy", "sen_x", "--credentials-file", bad)
	if code == 0 || !strings.Contains(errOut, bad+", line 2") {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
}
