package agent

import (
	"slices"
	"testing"
)

func TestPluginEnvironHidesTheToken(t *testing.T) {
	in := []string{"PATH=/bin", "HOME=/nonexistent", "CTRL_CLUSTER_TOKEN=krane_c_x_y", "KRANE_CONTROL_PLANE__TOKEN=krane_c_x_y", "KRANE_REGION=eu", "KUBECONFIG=/k", "KRANE_PLUGIN_HEAP_PROFILE_DIR=/tmp/p"}
	got := pluginEnviron(in, "CTRL_CLUSTER_TOKEN")
	if want := []string{"PATH=/bin", "HOME=/nonexistent", "KUBECONFIG=/k", "KRANE_PLUGIN_HEAP_PROFILE_DIR=/tmp/p", "GOGC=50"}; !slices.Equal(got, want) {
		t.Fatalf("plugin environment %v, want %v", got, want)
	}
	if len(in) != 7 {
		t.Fatal("the host's environment was changed")
	}
}

func TestPluginEnvironKeepsTheOperatorsGOGC(t *testing.T) {
	got := pluginEnviron([]string{"PATH=/bin", "GOGC=200"}, "")
	if want := []string{"PATH=/bin", "GOGC=200"}; !slices.Equal(got, want) {
		t.Fatalf("plugin environment %v, want %v", got, want)
	}
}
