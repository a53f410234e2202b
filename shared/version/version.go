// Package version carries the build's version, stamped by the Makefile
// (-ldflags "-X krane.dev/shared/version.Version=..."; scripts/version.sh
// computes it), and the skew policy of docs/compatibility.md: which krane
// host versions a ctrl serves.
//
// A version is semver with a leading v: a release (v0.2.0), or a
// development build of the next minor line (v0.2.0-dev.14+0123456789ab),
// which belongs to that line. A build made without the Makefile says
// "dev"; nothing can be concluded from it, so the policy serves it and
// says it is unknown.
package version

import (
	"fmt"

	"golang.org/x/mod/semver"
)

// Version is the release or development version of this build; "dev" when
// built without the Makefile.
var Version = "dev"

// Line is a version's minor release line ("v0.2"), or "" when v is not a
// version (a "dev" build).
func Line(v string) string {
	if !semver.IsValid(v) {
		return ""
	}
	return semver.MajorMinor(v)
}

// Skew is where a krane host's version stands against ctrl's.
type Skew int

const (
	// InWindow: ctrl's own minor line or the one before; served.
	InWindow Skew = iota
	// Unknown: one of the two is not a version (a build made without the
	// Makefile); served, since nothing says it is not.
	Unknown
	// Newer: a line after ctrl's. Served, but outside the tested window:
	// ctrl is upgraded before the hosts (docs/compatibility.md).
	Newer
	// TooOld: older than the line before ctrl's; refused, with words that
	// say why and what to do.
	TooOld
)

// String is the word the fleet views and the metrics use.
func (s Skew) String() string {
	switch s {
	case InWindow:
		return "in-window"
	case Newer:
		return "newer-than-ctrl"
	case TooOld:
		return "too-old"
	default:
		return "unknown"
	}
}

// HostSkew places a krane host's version against ctrl's: ctrl vX.Y serves
// hosts of vX.Y and of the minor line before it (vX.(Y-1); at Y = 0, the
// last line of the major before cannot be named, so only vX.0 itself).
func HostSkew(ctrl, host string) Skew {
	c, h := Line(ctrl), Line(host)
	if c == "" || h == "" {
		return Unknown
	}
	switch d := semver.Compare(h, c); {
	case d == 0:
		return InWindow
	case d > 0:
		return Newer
	}
	if OldestHostLine(ctrl) == h {
		return InWindow
	}
	return TooOld
}

// OldestHostLine is the oldest minor line of krane a ctrl of version ctrl
// serves ("" when ctrl is not a version).
func OldestHostLine(ctrl string) string {
	c := Line(ctrl)
	if c == "" {
		return ""
	}
	var major, minor int
	if _, err := fmt.Sscanf(c, "v%d.%d", &major, &minor); err != nil || minor == 0 {
		return c
	}
	return fmt.Sprintf("v%d.%d", major, minor-1)
}

// HostSkewMessage says, in words a krane log shows its reader, why a host
// of version host is outside the window of a ctrl of version ctrl and what
// to do; "" when it is served without remark.
func HostSkewMessage(ctrl, host string) string {
	switch HostSkew(ctrl, host) {
	case TooOld:
		return fmt.Sprintf("this krane (%s) is too old for ctrl %s, which serves krane %s.x and %s.x: upgrade krane to %s or later (docs/compatibility.md); until then ctrl sends this cluster nothing and records nothing it reports",
			host, ctrl, OldestHostLine(ctrl), Line(ctrl), OldestHostLine(ctrl)+".0")
	case Newer:
		return fmt.Sprintf("this krane (%s) is newer than ctrl %s: upgrade ctrl first, then the hosts (docs/compatibility.md); ctrl serves it, but outside the window the release tests",
			host, ctrl)
	}
	return ""
}

// SentinelImageName is the name of the krane-sentinel image (make release
// builds it beside krane's and ctrl's; push it where your cluster pulls).
const SentinelImageName = "krane-sentinel"

// SentinelImage is the sentinel image of this build, ctrl's default
// sentinel.default_image: the release's tag for a release, "dev" (what the
// demo and a local build load) for anything else, since a development
// version's "+commit" is not a valid image tag.
func SentinelImage(v string) string {
	if semver.IsValid(v) && semver.Prerelease(v) == "" && semver.Build(v) == "" {
		return SentinelImageName + ":" + v
	}
	return SentinelImageName + ":dev"
}
