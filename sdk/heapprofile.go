package sdk

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
)

// EnvHeapProfileDir names a directory: when it is set, the krane host and
// every plugin write a heap profile there each time they receive SIGUSR1
// (see HeapProfileOnSignal). Unset, nothing listens for the signal. The host
// passes the variable on to its plugins.
const EnvHeapProfileDir = "KRANE_PLUGIN_HEAP_PROFILE_DIR"

// HeapProfileOnSignal writes a heap profile of this process into the
// directory EnvHeapProfileDir names each time it receives SIGUSR1, as
// NAME-PID-N.pprof (read it with `go tool pprof -top -inuse_space`). It
// does nothing when the variable is unset or on systems without SIGUSR1.
// Serve calls it for every plugin; the krane host calls it for itself.
func HeapProfileOnSignal(log hclog.Logger, name string) {
	dir := os.Getenv(EnvHeapProfileDir)
	if dir == "" {
		return
	}
	ch := notifyHeapProfileSignal()
	if ch == nil {
		return
	}
	var n atomic.Int64
	go func() {
		for range ch {
			path := filepath.Join(dir, fmt.Sprintf("%s-%d-%d.pprof", name, os.Getpid(), n.Add(1)))
			if err := writeHeapProfile(path); err != nil {
				log.Error("heap profile not written", "path", path, "error", err)
				continue
			}
			log.Info("heap profile written", "path", path)
		}
	}()
}

// writeHeapProfile collects garbage first, so that in-use figures are the
// live heap rather than whatever the last cycle left, and writes the file
// under a temporary name so a reader never sees half a profile.
func writeHeapProfile(path string) error {
	runtime.GC()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp := path + ".tmp-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		f.Close()
		os.Remove(tmp)
		return err
	}
	if err := f.Close(); err != nil {
		os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, path)
}
