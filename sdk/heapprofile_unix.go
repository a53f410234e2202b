//go:build unix

package sdk

import (
	"os"
	"os/signal"
	"syscall"
)

func notifyHeapProfileSignal() <-chan os.Signal {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGUSR1)
	return ch
}
