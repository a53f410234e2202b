package bench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// profileCtrl records ctrl's CPU profile over d (at most 30 s) and then its
// mutex, block and goroutine profiles (ctrl runs with http.pprof), into
// $KRANE_BENCH_PROFILES or a temporary directory, and sends the files'
// paths with the top of each (go tool pprof -top) when done.
func (f *fleet) profileCtrl(ctx context.Context, name string, d time.Duration) <-chan string {
	out := make(chan string, 1)
	go func() {
		out <- f.profiles(ctx, name, min(d, 30*time.Second))
	}()
	return out
}

func (f *fleet) profiles(ctx context.Context, name string, d time.Duration) string {
	dir := os.Getenv("KRANE_BENCH_PROFILES")
	if dir == "" {
		var err error
		if dir, err = os.MkdirTemp("", "krane-bench-profiles-"); err != nil {
			return "cannot make a directory for the profiles: " + err.Error()
		}
	}
	base := f.e.St.CtrlHTTP + "/debug/pprof/"
	var b strings.Builder
	for _, p := range []struct{ file, path string }{
		{"cpu", fmt.Sprintf("profile?seconds=%d", int(d.Seconds()))},
		{"mutex", "mutex"},
		{"block", "block"},
		{"goroutine", "goroutine"},
	} {
		path := filepath.Join(dir, fmt.Sprintf("ctrl-%s-%s.pprof", name, p.file))
		if err := download(ctx, base+p.path, path, d+time.Minute); err != nil {
			fmt.Fprintf(&b, "    %s profile: %v\n", p.file, err)
			continue
		}
		top, err := exec.CommandContext(ctx, "go", "tool", "pprof", "-top", "-nodecount=12", path).CombinedOutput()
		if err != nil {
			fmt.Fprintf(&b, "    %s profile %s: go tool pprof: %v\n", p.file, path, err)
			continue
		}
		fmt.Fprintf(&b, "    %s profile (%s):\n", p.file, path)
		for _, line := range strings.Split(strings.TrimRight(string(top), "\n"), "\n") {
			fmt.Fprintf(&b, "      %s\n", line)
		}
	}
	return b.String()
}

func download(ctx context.Context, url, path string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	file, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(file, resp.Body); err != nil {
		file.Close()
		return err
	}
	return file.Close()
}
