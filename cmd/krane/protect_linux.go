//go:build linux

package main

import "golang.org/x/sys/unix"

// protectEnviron makes krane non-dumpable. The ctrl token reaches krane in
// its environment (control_plane.token_env, from a Secret), and every
// process of the same user may read another's /proc/<pid>/environ and
// /proc/<pid>/mem: the plugins, which run as krane's user, included. A
// non-dumpable process's /proc files belong to root, so they can no longer
// (a process with CAP_SYS_PTRACE still can; krane's pod drops every
// capability). The kernel resets the flag at exec, so the plugins are
// ordinary processes; the host never hands them the token either
// (pluginEnviron).
func protectEnviron() error { return unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0) }

// environProtected says whether protectEnviron applies on this platform.
const environProtected = true
