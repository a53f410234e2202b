package cli

import (
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestReadDotenv(t *testing.T) {
	path := filepath.Join(t.TempDir(), ".env")
	content := `# a comment

export DB_URL=postgres://u:p@db/x
PLAIN = value with spaces # a trailing comment
SINGLE='it''s # not a comment'
SINGLE2='a # b'
DOUBLE="line\nnext \"q\" \\ end" # comment
EMPTY=
HASH=abc#def
`
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := readDotenv(path)
	if err == nil {
		t.Fatalf("text after a closing quote accepted: %v", got)
	}
	content = strings.Replace(content, "SINGLE='it''s # not a comment'\n", "", 1)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err = readDotenv(path)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"DB_URL": "postgres://u:p@db/x", "PLAIN": "value with spaces", "SINGLE2": "a # b",
		"DOUBLE": "line\nnext \"q\" \\ end", "EMPTY": "", "HASH": "abc#def"}
	if !maps.Equal(got, want) {
		t.Fatalf("got %q\nwant %q", got, want)
	}
	for name, bad := range map[string]string{
		"no equals":      "JUST_A_NAME\n",
		"unterminated":   "A=\"open\n",
		"duplicate":      "A=1\nA=2\n",
		"space in name":  "A B=1\n",
		"unterminated '": "A='open\n",
	} {
		if err := os.WriteFile(path, []byte("SECRETVALUE_OK=hunter2\n"+bad), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := readDotenv(path)
		if err == nil || !strings.Contains(err.Error(), ", line ") || strings.Contains(err.Error(), "hunter2") || strings.Contains(err.Error(), "open\"") {
			t.Errorf("%s: %v, want an error naming the line without values", name, err)
		}
	}
}

func TestSecretEnvFrom(t *testing.T) {
	path := filepath.Join(t.TempDir(), ".env")
	if err := os.WriteFile(path, []byte("A=from-file\nB=from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	lookup := func(k string) (string, bool) {
		if k == "C" {
			return "from-environment", true
		}
		return "", false
	}
	got, err := secretEnvFrom([]string{path}, []string{"B=from-flag", "C"}, lookup)
	want := map[string]string{"A": "from-file", "B": "from-flag", "C": "from-environment"}
	if err != nil || !maps.Equal(got, want) {
		t.Fatalf("got %v, %v; want %v", got, err, want)
	}
	if _, err := secretEnvFrom(nil, []string{"MISSING"}, lookup); err == nil || !strings.Contains(err.Error(), "MISSING") {
		t.Fatalf("a name absent from the environment: %v", err)
	}
	if _, err := secretEnvFrom(nil, []string{"A=1", "A=2"}, lookup); err == nil || strings.Contains(err.Error(), "=") {
		t.Fatalf("a name given twice: %v", err)
	}
	if got, err := secretEnvFrom(nil, nil, lookup); got != nil || err != nil {
		t.Fatalf("nothing given: %v, %v", got, err)
	}
}
