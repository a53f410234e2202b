//go:build unix

package sdk

import (
	"bytes"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
)

func TestHeapProfileOnSIGUSR1(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(EnvHeapProfileDir, dir)
	HeapProfileOnSignal(hclog.NewNullLogger(), "test")
	if err := syscall.Kill(os.Getpid(), syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	// The profile is renamed into place when complete: its appearance is
	// the event waited for.
	var files []string
	deadline := time.Now().Add(30 * time.Second)
	for len(files) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no heap profile in %s within 30s of SIGUSR1", dir)
		}
		time.Sleep(20 * time.Millisecond)
		files, _ = filepath.Glob(filepath.Join(dir, "test-*-1.pprof"))
	}
	b, err := os.ReadFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	// pprof's protobuf format is gzipped.
	if !bytes.HasPrefix(b, []byte{0x1f, 0x8b}) {
		t.Fatalf("%s is not a gzipped pprof profile (%d bytes)", files[0], len(b))
	}
}
