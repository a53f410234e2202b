package sdk

import (
	"runtime/debug"
	"strings"
)

// BuildVersion is the version of the plugin binary as Go recorded it: the
// main module's version (a release tag, or a pseudo-version Go derives
// from the VCS commit when built in a checkout), else the commit, else
// "devel". Use it as Info.Version unless the plugin sets its own.
func BuildVersion() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "devel"
	}
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	var rev, modified string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				modified = "-dirty"
			}
		}
	}
	if rev != "" {
		return "0.0.0-" + strings.TrimSpace(rev[:min(12, len(rev))]) + modified
	}
	return "devel"
}
