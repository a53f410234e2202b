// Package upgrade is the upgrade suite: the baseline release (RELEASES),
// built from this repository's history by internal/compat, and this tree
// run side by side on one real stack, as a fleet meets a release. It
// holds the promises of docs/compatibility.md that need running binaries:
// a rolling ctrl upgrade with deploys and scale writes in flight loses no
// change and fails no call a retry would not answer; a deploy the old ctrl
// started finishes on the old ctrl's code; krane hosts of the baseline,
// with the baseline's plugins, keep working against the new ctrl; and a
// plugin built with the baseline's sdk runs on the new host.
package upgrade
