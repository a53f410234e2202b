//go:build !linux

package main

// protectEnviron does nothing here: only Linux can make a process's
// environment unreadable to other processes of its user, and krane runs on
// Linux in production. A plugin could read krane's environment (the ctrl
// token with control_plane.token_env) on other systems.
func protectEnviron() error { return nil }

// environProtected says whether protectEnviron applies on this platform.
const environProtected = false
