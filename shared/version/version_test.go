package version

import (
	"strings"
	"testing"
)

// TestHostSkewWindow holds the skew rule of docs/compatibility.md: ctrl
// vX.Y serves krane vX.Y and vX.(Y-1), development builds count in their
// minor line, older hosts are refused, newer ones are served but flagged.
func TestHostSkewWindow(t *testing.T) {
	for _, c := range []struct {
		ctrl, host string
		want       Skew
	}{
		{"v0.2.0", "v0.2.0", InWindow},
		{"v0.2.3", "v0.2.0", InWindow},
		{"v0.2.0", "v0.1.0", InWindow},
		{"v0.2.0", "v0.1.7", InWindow},
		{"v0.2.0-dev.14+0123456789ab", "v0.1.0", InWindow},
		{"v0.2.0-dev.14+0123456789ab", "v0.2.0-dev.3+ab", InWindow},
		{"v0.3.0", "v0.1.9", TooOld},
		{"v1.4.0", "v0.9.0", TooOld},
		{"v0.1.0", "v0.2.0-dev.1+ab", Newer},
		{"v0.2.0", "v1.0.0", Newer},
		{"v0.0.5", "v0.0.1", InWindow},
		{"dev", "v0.1.0", Unknown},
		{"v0.2.0", "dev", Unknown},
		{"v0.2.0", "", Unknown},
		{"v0.2.0", "200d838", Unknown},
	} {
		if got := HostSkew(c.ctrl, c.host); got != c.want {
			t.Errorf("HostSkew(ctrl %s, host %s) = %s, want %s", c.ctrl, c.host, got, c.want)
		}
	}
}

func TestHostSkewMessageSaysWhatToDo(t *testing.T) {
	msg := HostSkewMessage("v0.3.0", "v0.1.2")
	for _, want := range []string{"v0.1.2", "v0.3.0", "v0.2.x", "upgrade krane to v0.2.0"} {
		if !strings.Contains(msg, want) {
			t.Errorf("message %q does not say %q", msg, want)
		}
	}
	if m := HostSkewMessage("v0.2.0", "v0.1.0"); m != "" {
		t.Errorf("a host in the window gets a remark: %q", m)
	}
}

func TestSentinelImageIsAValidReferenceForEveryBuild(t *testing.T) {
	for v, want := range map[string]string{
		"v0.2.0":                           "krane-sentinel:v0.2.0",
		"v0.2.0-dev.14+0123456789ab":       "krane-sentinel:dev",
		"v0.2.0-dev.14+0123456789ab.dirty": "krane-sentinel:dev",
		"dev":                              "krane-sentinel:dev",
	} {
		if got := SentinelImage(v); got != want {
			t.Errorf("SentinelImage(%q) = %q, want %q", v, got, want)
		}
	}
}
