package agent

import (
	"slices"
	"testing"
)

func TestPluginEnvironHidesTheToken(t *testing.T) {
	// KUBECONFIG names the host's own credentials: a plugin gets its
	// identity through Configure.
	in := []string{"PATH=/bin", "HOME=/nonexistent", "CTRL_CLUSTER_TOKEN=krane_c_x_y", "KRANE_CONTROL_PLANE__TOKEN=krane_c_x_y", "KRANE_REGION=eu", "KUBECONFIG=/k", "KRANE_PLUGIN_HEAP_PROFILE_DIR=/tmp/p"}
	got := pluginEnviron(in, "CTRL_CLUSTER_TOKEN")
	if want := []string{"PATH=/bin", "HOME=/nonexistent", "KRANE_PLUGIN_HEAP_PROFILE_DIR=/tmp/p", "GOGC=50"}; !slices.Equal(got, want) {
		t.Fatalf("plugin environment %v, want %v", got, want)
	}
	if len(in) != 7 {
		t.Fatal("the host's environment was changed")
	}
}

// TestPluginEnvironIsAnAllowlist: a variable the host does not know to be
// secret is not passed either; the token_env variable is dropped even when
// named like an allowed one.
func TestPluginEnvironIsAnAllowlist(t *testing.T) {
	got := pluginEnviron([]string{"PATH=/bin", "AWS_SECRET_ACCESS_KEY=s", "TZ=UTC", "LC_ALL=C", "HTTPS_PROXY=http://p", "KUBERNETES_SERVICE_HOST=10.0.0.1"}, "TZ")
	if want := []string{"PATH=/bin", "LC_ALL=C", "HTTPS_PROXY=http://p", "KUBERNETES_SERVICE_HOST=10.0.0.1", "GOGC=50"}; !slices.Equal(got, want) {
		t.Fatalf("plugin environment %v, want %v", got, want)
	}
}

func TestPluginEnvironKeepsTheOperatorsGOGC(t *testing.T) {
	got := pluginEnviron([]string{"PATH=/bin", "GOGC=200"}, "")
	if want := []string{"PATH=/bin", "GOGC=200"}; !slices.Equal(got, want) {
		t.Fatalf("plugin environment %v, want %v", got, want)
	}
}
