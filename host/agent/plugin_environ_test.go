package agent_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestPluginEnvironmentHoldsNoHostSecret: a real plugin process started by
// the host reports its environment. The host's ctrl token (in the
// variables an operator sets it with) and any other secret the host's
// environment holds are absent: the plugin gets an allowlist, not the
// host's environment minus what the host knows to be secret.
func TestPluginEnvironmentHoldsNoHostSecret(t *testing.T) {
	secrets := map[string]string{
		"KRANE_TOKEN":                "krane_c_host_token",
		"KRANE_CONTROL_PLANE__TOKEN": "krane_c_second_token",
		"CTRL_CLUSTER_TOKEN":         "krane_c_third_token",
		"AWS_SECRET_ACCESS_KEY":      "aws-secret",
		"DATABASE_PASSWORD":          "db-secret",
		"KRANE_POD_UID":              "0f0e",
	}
	for k, v := range secrets {
		t.Setenv(k, v)
	}
	t.Setenv("TZ", "UTC")
	out := filepath.Join(t.TempDir(), "environ")
	h := newHostHarness(t, fmt.Sprintf(`controller "noop-a" {
  config { environ_file = %q }
}`, out), pluginDir(t))
	h.start()
	var env []string
	eventually(t, time.Minute, "the plugin reported its environment", func() error {
		b, err := os.ReadFile(out)
		if err != nil {
			return err
		}
		env = strings.Split(string(b), "\n")
		return nil
	})
	for _, kv := range env {
		name, value, _ := strings.Cut(kv, "=")
		if _, ok := secrets[name]; ok {
			t.Errorf("the plugin's environment holds the host's %s", name)
		}
		for k, v := range secrets {
			if strings.Contains(value, v) {
				t.Errorf("the plugin's environment holds the value of the host's %s (in %s)", k, name)
			}
		}
	}
	for _, want := range []string{"PATH=" + os.Getenv("PATH"), "TZ=UTC", "GOGC=50"} {
		if !contains(env, want) {
			t.Errorf("the plugin's environment lacks %s: %q", want, env)
		}
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
