// Package version carries the build's version, stamped by the Makefile
// (-ldflags "-X krane.dev/internal/version.Version=...").
package version

// Version is the release or git description of this build; "dev" when built
// without the Makefile.
var Version = "dev"
