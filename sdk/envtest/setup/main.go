// Command setup installs the binaries krane.dev/sdk/envtest runs: etcd,
// kube-apiserver, kube-controller-manager, kube-scheduler and kwok, built
// from source through the Go module proxy into envtest.KubeBinDir() (by
// default ~/.cache/krane/testenv/k8s-v<version>/bin), once per version.
// Binaries already there are kept, so running it again is cheap.
//
//	go run krane.dev/sdk/envtest/setup
//
// k8s.io/kubernetes cannot be `go install`ed: its go.mod replaces every
// staging module (k8s.io/api, k8s.io/client-go, ...) with ./staging/...
// It is built here from a throwaway module that requires it and replaces
// each staging module with its published v0.X.Y tag. The first build takes
// a while (about 6 minutes on two cores); later runs reuse the Go build
// cache.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"

	"krane.dev/sdk/envtest"
)

func main() {
	kube := flag.String("kube", envOr("K8S_VERSION", envtest.KubeVersion), "Kubernetes version (env K8S_VERSION)")
	etcd := flag.String("etcd", envOr("ETCD_VERSION", "3.6.6"), "etcd version (env ETCD_VERSION)")
	kwok := flag.String("kwok", envOr("KWOK_VERSION", "0.7.0"), "kwok version (env KWOK_VERSION)")
	flag.Parse()
	bin := envtest.KubeBinDir()
	if *kube != envtest.KubeVersion && os.Getenv("KRANE_KUBE_BIN_DIR") == "" {
		bin = filepath.Join(envtest.CacheDir(), "testenv", "k8s-v"+*kube, "bin")
	}
	if err := setup(bin, *kube, *etcd, *kwok); err != nil {
		fmt.Fprintln(os.Stderr, "envtest setup:", err)
		os.Exit(1)
	}
	step("kube test binaries ready in %s", bin)
}

func setup(bin, kube, etcd, kwok string) error {
	if _, err := exec.LookPath("go"); err != nil {
		return errors.New("'go' not found in PATH; install Go 1.26+")
	}
	work := filepath.Join(envtest.CacheDir(), "testenv", "build")
	for _, d := range []string{bin, work} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	var missing []string
	for _, b := range []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler"} {
		if need(bin, b) {
			missing = append(missing, b)
		}
	}
	if len(missing) > 0 {
		if err := buildKube(bin, work, kube, missing); err != nil {
			return err
		}
	}
	if need(bin, "etcd") {
		mod := filepath.Join(work, "etcd-v"+etcd)
		if err := writeModule(mod, "krane.local/etcdbuild", "require go.etcd.io/etcd/server/v3 v"+etcd+"\n",
			"package main\n\nimport (\n\t\"os\"\n\n\t\"go.etcd.io/etcd/server/v3/etcdmain\"\n)\n\nfunc main() { etcdmain.Main(os.Args) }\n", "main.go"); err != nil {
			return err
		}
		step("building etcd v%s", etcd)
		if err := buildTo(mod, filepath.Join(bin, "etcd"), "."); err != nil {
			return err
		}
	}
	if need(bin, "kwok") {
		step("building kwok v%s", kwok)
		cmd := goCmd(work, "install", "sigs.k8s.io/kwok/cmd/kwok@v"+kwok)
		cmd.Env = append(cmd.Env, "GOBIN="+bin)
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("go install kwok v%s: %w", kwok, err)
		}
	}
	return nil
}

// buildKube builds the control plane from a module that requires
// k8s.io/kubernetes and pins its staging modules to their tags.
func buildKube(bin, work, kube string, missing []string) error {
	mod := filepath.Join(work, "kubernetes-v"+kube)
	step("resolving k8s.io/kubernetes v%s and its staging modules", kube)
	out, err := goCmd(work, "mod", "download", "-json", "k8s.io/kubernetes@v"+kube).Output()
	if err != nil {
		return fmt.Errorf("download k8s.io/kubernetes@v%s from the Go module proxy: %w", kube, err)
	}
	var info struct{ GoMod string }
	if err := json.Unmarshal(out, &info); err != nil || info.GoMod == "" {
		return fmt.Errorf("go mod download named no go.mod for k8s.io/kubernetes@v%s", kube)
	}
	gomod, err := os.ReadFile(info.GoMod)
	if err != nil {
		return err
	}
	staging := "v0." + strings.TrimPrefix(kube, "1.") // 1.36.3 -> v0.36.3
	stagingRE := regexp.MustCompile(`^\s*(k8s\.io/[a-z0-9-]+) => \./staging`)
	var requires strings.Builder
	requires.WriteString("require k8s.io/kubernetes v" + kube + "\n\n")
	sc := bufio.NewScanner(bytes.NewReader(gomod))
	for sc.Scan() {
		if m := stagingRE.FindStringSubmatch(sc.Text()); m != nil {
			fmt.Fprintf(&requires, "replace %s => %s %s\n", m[1], m[1], staging)
		}
	}
	src := "package main\n\nimport (\n\t_ \"k8s.io/kubernetes/cmd/kube-apiserver/app\"\n\t_ \"k8s.io/kubernetes/cmd/kube-controller-manager/app\"\n\t_ \"k8s.io/kubernetes/cmd/kube-scheduler/app\"\n)\n\nfunc main() {}\n"
	if err := writeModule(mod, "krane.local/kubebuild", requires.String(), src, "deps.go"); err != nil {
		return err
	}
	for _, b := range missing {
		step("building %s v%s (the first build takes minutes)", b, kube)
		if err := buildTo(mod, filepath.Join(bin, b), "k8s.io/kubernetes/cmd/"+b); err != nil {
			return err
		}
	}
	return nil
}

// writeModule writes a throwaway module and tidies it, once: an existing
// go.sum means it was tidied before.
func writeModule(dir, path, requires, src, file string) error {
	if _, err := os.Stat(filepath.Join(dir, "go.sum")); err == nil {
		return nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module "+path+"\n\ngo 1.26\n\n"+requires), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, file), []byte(src), 0o644); err != nil {
		return err
	}
	step("go mod tidy in %s (the first run downloads many modules)", dir)
	if err := goCmd(dir, "mod", "tidy").Run(); err != nil {
		os.Remove(filepath.Join(dir, "go.sum"))
		return fmt.Errorf("go mod tidy in %s: %w", dir, err)
	}
	return nil
}

func buildTo(dir, out, pkg string) error {
	if err := goCmd(dir, "build", "-trimpath", "-o", out+".tmp", pkg).Run(); err != nil {
		return fmt.Errorf("go build %s: %w", pkg, err)
	}
	return os.Rename(out+".tmp", out)
}

func goCmd(dir string, args ...string) *exec.Cmd {
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off", "CGO_ENABLED=0")
	cmd.Stderr = os.Stderr
	return cmd
}

func need(bin, name string) bool {
	if envtest.IsExecutable(filepath.Join(bin, name)) {
		step("%s: cached in %s", name, bin)
		return false
	}
	return true
}

func step(format string, args ...any) { fmt.Fprintf(os.Stderr, "==> "+format+"\n", args...) }

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
