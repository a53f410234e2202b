package sdk

import (
	"crypto/sha256"
	"hash"
	"os/exec"
	"syscall"
)

// setParentDeathSignal makes the kernel kill the plugin when the host dies,
// even by SIGKILL, so no plugin outlives its host.
func setParentDeathSignal(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

func newSHA256() hash.Hash { return sha256.New() }
