package sdk

import (
	"runtime/debug"
	"strings"
)

// version, when set at build time, is what BuildVersion returns:
//
//	go build -ldflags "-X krane.dev/sdk.version=1.2.0" -o bin/krane-plugin-x .
//
// A plugin built from a checkout without version control (a copied
// folder, a source archive) has no other version to report.
var version string

// BuildVersion is the version of the plugin binary: the one set at build
// time with -ldflags "-X krane.dev/sdk.version=VERSION"; else the main
// module's version as Go recorded it (a release tag when the plugin is
// installed with `go install module@vX.Y.Z`, or a pseudo-version Go
// derives from the VCS commit when built in a checkout); else the commit;
// else "devel". Use it as Info.Version unless the plugin sets its own.
func BuildVersion() string {
	if version != "" {
		return version
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "devel"
	}
	return fromBuildInfo(bi)
}

func fromBuildInfo(bi *debug.BuildInfo) string {
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
