package sdk

import (
	"runtime/debug"
	"testing"
)

func TestBuildVersionSources(t *testing.T) {
	for _, tc := range []struct {
		bi   debug.BuildInfo
		want string
	}{
		{debug.BuildInfo{Main: debug.Module{Version: "v1.4.0"}}, "v1.4.0"},
		{debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "0123456789abcdef"}, {Key: "vcs.modified", Value: "true"}}}, "0.0.0-0123456789ab-dirty"},
		{debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, "devel"},
	} {
		if got := fromBuildInfo(&tc.bi); got != tc.want {
			t.Errorf("fromBuildInfo(%+v) = %q, want %q", tc.bi.Main, got, tc.want)
		}
	}
	// -ldflags "-X krane.dev/sdk.version=..." sets version; it wins.
	was := version
	t.Cleanup(func() { version = was })
	version = "2.3.4"
	if got := BuildVersion(); got != "2.3.4" {
		t.Errorf("BuildVersion with version set = %q", got)
	}
}
