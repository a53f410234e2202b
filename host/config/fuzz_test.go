package config

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// FuzzLoad: any krane.hcl either loads into a valid config or fails with an
// error; it never panics or hangs.
func FuzzLoad(f *testing.F) {
	sample, err := os.ReadFile("../../krane.hcl")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(string(sample))
	f.Add(base)
	f.Add(base + `controller "a" { config { x = [{ y = 1 }] } }`)
	f.Add(base + `controller "a" {} controller "a" {}`)
	f.Add(`{"region": "r", "controller": {"a": {"enabled": true}}}`)
	f.Add("region = <<EOF\nx\nEOF\n")
	f.Add(base + `sync { workers = 1e999 }`)
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, content string) {
		p := filepath.Join(dir, "krane.hcl")
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		type result struct {
			cfg *Config
			err error
		}
		done := make(chan result, 1)
		go func() {
			cfg, err := Load(p, []string{})
			done <- result{cfg, err}
		}()
		var res result
		select {
		case res = <-done:
		case <-time.After(2 * time.Second):
			t.Fatalf("Load hangs on %q", content)
		}
		cfg, err := res.cfg, res.err
		if err != nil {
			return
		}
		if cfg.Region == "" || cfg.ClusterID == "" || cfg.Sync.Workers < 1 {
			t.Fatalf("invalid config accepted: %+v", cfg)
		}
		for name, c := range cfg.Controllers {
			if c.Name != name || c.Path == "" {
				t.Fatalf("controller %q incomplete: %+v", name, c)
			}
		}
	})
}
