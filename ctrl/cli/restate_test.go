package cli_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"krane.dev/ctrl/restateendpoint"
)

// TestIdentityKeyCreatesAndReadsTheKey: --create writes a private key only
// the owner reads and prints its public key; reading the file prints the
// same key; an existing key is never replaced.
func TestIdentityKeyCreatesAndReadsTheKey(t *testing.T) {
	path := filepath.Join(t.TempDir(), "restate-identity.pem")
	code, created, errOut := run(t, "restate", "identity-key", "--create", path)
	if code != 0 {
		t.Fatalf("identity-key --create: exit %d: %s", code, errOut)
	}
	created = strings.TrimSpace(created)
	if err := restateendpoint.CheckIdentityKey(created); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v, mode %v; want 0600", err, fi.Mode().Perm())
	}
	code, read, errOut := run(t, "restate", "identity-key", path)
	if code != 0 || strings.TrimSpace(read) != created {
		t.Fatalf("identity-key %s = %d %q (%s), want %q", path, code, read, errOut, created)
	}
	before, _ := os.ReadFile(path)
	if code, _, errOut := run(t, "restate", "identity-key", "--create", path); code == 0 || !strings.Contains(errOut, "never replaced") {
		t.Fatalf("identity-key --create over an existing key: exit %d, %q", code, errOut)
	}
	if after, _ := os.ReadFile(path); string(after) != string(before) {
		t.Fatal("the existing key was replaced")
	}
}

// TestIdentityKeyReadsOpenSSLKeys: the key the operating guide makes with
// openssl is read; a key of another type is refused by name.
func TestIdentityKeyReadsOpenSSLKeys(t *testing.T) {
	if _, err := exec.LookPath("openssl"); err != nil {
		t.Skip("openssl not installed")
	}
	dir := t.TempDir()
	gen := func(name string, args ...string) string {
		p := filepath.Join(dir, name)
		if out, err := exec.Command("openssl", append([]string{"genpkey", "-out", p}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("openssl genpkey: %v: %s", err, out)
		}
		return p
	}
	code, out, errOut := run(t, "restate", "identity-key", gen("ed.pem", "-algorithm", "ed25519"))
	if code != 0 || restateendpoint.CheckIdentityKey(strings.TrimSpace(out)) != nil {
		t.Fatalf("an openssl ed25519 key: exit %d, %q, %s", code, out, errOut)
	}
	code, _, errOut = run(t, "restate", "identity-key", gen("ec.pem", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"))
	if code == 0 || !strings.Contains(errOut, "needs Ed25519") {
		t.Fatalf("an EC key: exit %d, %q", code, errOut)
	}
}
