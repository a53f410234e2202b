//go:build !unix

package sdk

import "os"

// notifyHeapProfileSignal is nil where there is no SIGUSR1.
func notifyHeapProfileSignal() <-chan os.Signal { return nil }
