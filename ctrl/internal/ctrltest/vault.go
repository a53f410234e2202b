package ctrltest

import (
	"path/filepath"
	"testing"
	"time"

	"krane.dev/ctrl/serve"
	"krane.dev/ctrl/vault"
)

// Keyring creates a vault keyring file with one key and returns its path.
func Keyring(t testing.TB) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "keyring.yaml")
	if _, err := vault.Init(path, time.Now()); err != nil {
		t.Fatal(err)
	}
	return path
}

// WithKeyring is an Options.Configure that sets vault.keyring_file.
func WithKeyring(path string) func(*serve.Config) {
	return func(c *serve.Config) { c.Vault.KeyringFile = path }
}
