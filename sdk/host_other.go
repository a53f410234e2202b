//go:build !linux

package sdk

import (
	"crypto/sha256"
	"hash"
	"os/exec"
)

// setParentDeathSignal is a no-op off Linux; the plugin's parent watcher in
// Serve ends it when the host goes away.
func setParentDeathSignal(*exec.Cmd) {}

func newSHA256() hash.Hash { return sha256.New() }
