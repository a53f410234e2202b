// Package compat holds this tree to docs/compatibility.md against the
// baseline: the newest release RELEASES names, built from this
// repository's own history. It gives the gates and the upgrade suite the
// baseline's sources (git archive of its commit) and binaries (built from
// them, version-stamped as the release), each made once per commit into
// the cache shared by every test process, and the gates themselves:
// migrations expand and contract (migrations.go), the wire only grows and
// no bound tightens on what older hosts send (wire.go), the sdk's exported
// API keeps compiling (sdkapi.go).
package compat

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"

	"krane.dev/sdk/envtest"
)

// Release is a line of RELEASES.
type Release struct {
	Version, Commit, Date string
}

// Releases reads RELEASES at the repository root, oldest first.
func Releases(root string) ([]Release, error) {
	f, err := os.Open(filepath.Join(root, "RELEASES"))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []Release
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 3 || !strings.HasPrefix(f[0], "v") || len(f[1]) != 40 {
			return nil, fmt.Errorf("RELEASES line %d: %q: want VERSION COMMIT(40 hex) DATE", n, line)
		}
		out = append(out, Release{Version: f[0], Commit: f[1], Date: f[2]})
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("RELEASES names no release")
	}
	return out, nil
}

// Baseline is the newest release: what every gate compares against.
func Baseline(root string) (Release, error) {
	rs, err := Releases(root)
	if err != nil {
		return Release{}, err
	}
	return rs[len(rs)-1], nil
}

// cacheDir is where a release's sources and binaries are kept.
func cacheDir(r Release) string {
	return filepath.Join(envtest.CacheDir(), "baseline", r.Version+"-"+r.Commit[:12])
}

// Source is the baseline's tree, extracted from the repository's history
// (git archive) once into the cache.
func Source(ctx context.Context, root string) (string, Release, error) {
	r, err := Baseline(root)
	if err != nil {
		return "", r, err
	}
	dir := filepath.Join(cacheDir(r), "src")
	err = once(filepath.Join(cacheDir(r), "src.done"), func() error {
		if err := os.RemoveAll(dir); err != nil {
			return err
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		// The commit must be in this clone's history: a shallow clone
		// lacks it.
		cmd := exec.CommandContext(ctx, "bash", "-c", "set -o pipefail; git -C \"$1\" archive --format=tar \"$2\" | tar -x -C \"$3\"", "archive", root, r.Commit, dir)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("extract release %s (commit %s) from the repository's history: %v\n%s(a shallow clone lacks it: git fetch --unshallow)", r.Version, r.Commit, err, out)
		}
		return nil
	})
	return dir, r, err
}

// Binaries of a release, as its `make release` names them.
var Binaries = []string{"ctrl", "krane", "krane-plugin-deployment", "krane-plugin-sentinel", "krane-plugin-cilium", "krane-plugin-configmap"}

// BaselineBinaries builds the baseline's binaries from its sources once
// into the cache, stamped with its version as `make release` stamps them,
// and returns their directory.
func BaselineBinaries(ctx context.Context, root string) (string, Release, error) {
	src, r, err := Source(ctx, root)
	if err != nil {
		return "", r, err
	}
	bin := filepath.Join(cacheDir(r), "bin")
	err = once(filepath.Join(cacheDir(r), "bin.done"), func() error {
		// Releases before v0.3 keep the version in internal/version, later
		// ones in shared/version; the linker ignores the -X of a package
		// the tree does not have, so both are set.
		ld := "-X krane.dev/internal/version.Version=" + r.Version + " -X krane.dev/shared/version.Version=" + r.Version
		for _, b := range []struct{ name, dir, pkg, ldflags string }{
			{"ctrl", ".", "./cmd/ctrl", ld},
			{"krane", ".", "./cmd/krane", ld},
			{"krane-plugin-deployment", ".", "./plugins/deployment", ld},
			{"krane-plugin-sentinel", ".", "./plugins/sentinel", ld},
			{"krane-plugin-cilium", ".", "./plugins/cilium", ld},
			{"krane-plugin-configmap", "sdk", "./examples/configmap", "-X krane.dev/sdk.version=" + r.Version},
		} {
			cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags", b.ldflags, "-o", filepath.Join(bin, b.name), b.pkg)
			cmd.Dir = filepath.Join(src, b.dir)
			cmd.Env = append(os.Environ(), "GOFLAGS=-mod=readonly", "GOWORK=off")
			if out, err := cmd.CombinedOutput(); err != nil {
				return fmt.Errorf("build %s of release %s: %v\n%s", b.name, r.Version, err, out)
			}
		}
		return nil
	})
	return bin, r, err
}

// once runs make unless marker exists, holding an exclusive lock on
// marker+".lock" so that concurrent test processes make it once.
func once(marker string, make func() error) error {
	if _, err := os.Stat(marker); err == nil {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(marker), 0o755); err != nil {
		return err
	}
	lock, err := os.OpenFile(marker+".lock", os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return err
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
	if _, err := os.Stat(marker); err == nil {
		return nil // made while we waited
	}
	if err := make(); err != nil {
		return err
	}
	return os.WriteFile(marker, nil, 0o644)
}
