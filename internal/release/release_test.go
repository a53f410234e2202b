package release_test

import (
	"archive/tar"
	"bytes"
	"crypto/x509"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"

	"krane.dev/host/config"
	"krane.dev/internal/release"
)

const testVersion = "v9.8.7-releasetest"

var (
	builtOnce sync.Once
	builtDir  string
	builtErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if builtDir != "" {
		os.RemoveAll(builtDir)
	}
	os.Exit(code)
}

// buildBinaries builds what the images hold as `make release` does:
// static (CGO_ENABLED=0), trimmed, version-stamped; once for the tests
// of the package.
func buildBinaries(t *testing.T) string {
	t.Helper()
	builtOnce.Do(func() { builtDir, builtErr = build() })
	if builtErr != nil {
		t.Fatal(builtErr)
	}
	return builtDir
}

func build() (string, error) {
	root, err := filepath.Abs("../..")
	if err != nil {
		return "", err
	}
	bin, err := os.MkdirTemp("", "krane-release-test-")
	if err != nil {
		return "", err
	}
	// One go build for all: the packages they share compile once.
	pkgs := map[string]string{
		"krane": "./cmd/krane", "ctrl": "./cmd/ctrl",
		"krane-plugin-deployment": "./plugins/deployment", "krane-plugin-sentinel": "./plugins/sentinel", "krane-plugin-cilium": "./plugins/cilium",
		"krane-sentinel": "./cmd/krane-sentinel",
	}
	args := []string{"build", "-trimpath", "-ldflags", "-s -w -X krane.dev/shared/version.Version=" + testVersion, "-o", bin + "/"}
	for _, pkg := range pkgs {
		args = append(args, pkg)
	}
	cmd := exec.Command("go", args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	for name, pkg := range pkgs {
		if err := os.Rename(filepath.Join(bin, filepath.Base(pkg)), filepath.Join(bin, name)); err != nil && filepath.Base(pkg) != name {
			return "", err
		}
	}
	return bin, nil
}

// extract writes the image's flattened filesystem under dir and returns
// each regular file's mode and owner by path.
func extract(t *testing.T, img v1.Image, dir string) map[string]*tar.Header {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	out := map[string]*tar.Header{}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		name := filepath.Clean(h.Name)
		if !filepath.IsLocal(name) {
			t.Fatalf("the image holds %q, outside its root", h.Name)
		}
		out[filepath.ToSlash(name)] = h
		p := filepath.Join(dir, name)
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			data, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, data, os.FileMode(h.Mode).Perm()); err != nil {
				t.Fatal(err)
			}
		default:
			t.Errorf("the image holds %s of type %c: only files and directories are expected", h.Name, h.Typeflag)
		}
	}
}

// TestImagesRunAsTheDockerfileSays: the krane, ctrl and krane-sentinel images written as OCI
// layouts open as images of this machine's platform with the Dockerfile's
// entrypoint, arguments and non-root user; they hold the passwd entry of
// that user, CA certificates that parse, a writable /tmp and static
// binaries, which run (`--version`) from the extracted layers and print the
// release's version. The same binaries make the same digests.
func TestImagesRunAsTheDockerfileSays(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binaries")
	}
	bin := buildBinaries(t)
	out := t.TempDir()
	digests, err := release.Write(out, bin, "/etc/ssl/certs/ca-certificates.crt", testVersion)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range release.Images {
		t.Run(want.Name, func(t *testing.T) {
			p, err := layout.FromPath(filepath.Join(out, want.Name))
			if err != nil {
				t.Fatal(err)
			}
			idx, err := p.ImageIndex()
			if err != nil {
				t.Fatal(err)
			}
			im, err := idx.IndexManifest()
			if err != nil {
				t.Fatal(err)
			}
			if len(im.Manifests) != 1 || im.Manifests[0].Annotations["org.opencontainers.image.ref.name"] != testVersion {
				t.Fatalf("index %+v, want one image tagged %s", im.Manifests, testVersion)
			}
			img, err := idx.Image(im.Manifests[0].Digest)
			if err != nil {
				t.Fatal(err)
			}
			if d, _ := img.Digest(); d != digests[want.Name] {
				t.Errorf("digest %s in the layout, Write said %s", d, digests[want.Name])
			}
			cfg, err := img.ConfigFile()
			if err != nil {
				t.Fatal(err)
			}
			c := cfg.Config
			if !slices.Equal(c.Entrypoint, want.Entrypoint) || !slices.Equal(c.Cmd, want.Cmd) || c.User != "65532:65532" || cfg.OS != "linux" {
				t.Errorf("config: entrypoint %v cmd %v user %q os %s; want %v %v 65532:65532 linux", c.Entrypoint, c.Cmd, c.User, cfg.OS, want.Entrypoint, want.Cmd)
			}
			if c.Labels["org.opencontainers.image.version"] != testVersion {
				t.Errorf("labels %v, want org.opencontainers.image.version %s", c.Labels, testVersion)
			}

			root := t.TempDir()
			files := extract(t, img, root)
			passwd, _ := os.ReadFile(filepath.Join(root, "etc/passwd"))
			if !strings.Contains(string(passwd), "nonroot:x:65532:65532:") {
				t.Errorf("etc/passwd has no entry for user 65532:\n%s", passwd)
			}
			ca, _ := os.ReadFile(filepath.Join(root, "etc/ssl/certs/ca-certificates.crt"))
			if pool := x509.NewCertPool(); !pool.AppendCertsFromPEM(ca) {
				t.Error("etc/ssl/certs/ca-certificates.crt holds no certificate")
			}
			if h := files["tmp"]; h == nil || h.Mode&0o1777 != 0o1777 {
				t.Errorf("/tmp: %+v, want a directory with mode 1777", h)
			}
			if h := files["home/nonroot"]; h == nil || h.Uid != release.UID {
				t.Errorf("/home/nonroot: %+v, want a directory of user %d", h, release.UID)
			}
			for _, dst := range want.Binaries {
				name := strings.TrimPrefix(dst, "/")
				h := files[name]
				if h == nil || h.Mode&0o111 == 0 {
					t.Errorf("%s: %+v, want an executable file", dst, h)
					continue
				}
				f, err := elf.Open(filepath.Join(root, name))
				if err != nil {
					t.Fatal(err)
				}
				for _, prog := range f.Progs {
					if prog.Type == elf.PT_INTERP {
						t.Errorf("%s is dynamically linked: the image has no libc (build with CGO_ENABLED=0)", dst)
					}
				}
				f.Close()
				cmd := exec.Command(filepath.Join(root, name), "--version")
				cmd.Dir = root
				var buf bytes.Buffer
				cmd.Stdout, cmd.Stderr = &buf, &buf
				if err := cmd.Run(); err != nil || !strings.Contains(buf.String(), testVersion) {
					t.Errorf("%s --version, run from the extracted image: %v\n%s\nwant it to print %s", dst, err, buf.String(), testVersion)
				}
			}
		})
	}
	again, err := release.Write(t.TempDir(), bin, "/etc/ssl/certs/ca-certificates.crt", testVersion)
	if err != nil {
		t.Fatal(err)
	}
	for name, d := range digests {
		if again[name] != d {
			t.Errorf("image %s: digest %s, then %s from the same binaries: not reproducible", name, d, again[name])
		}
	}
}

// TestPluginPinsAreWhatTheImageShips: the plugins.hcl `make release`
// writes pins each built-in plugin with the digest of the binary in the
// krane image, in the form krane.hcl takes: loaded as part of a krane.hcl,
// every pin accepts the file the image holds at the plugin's path.
func TestPluginPinsAreWhatTheImageShips(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binaries")
	}
	bin := buildBinaries(t)
	out := t.TempDir()
	if _, err := release.Write(out, bin, "/etc/ssl/certs/ca-certificates.crt", testVersion); err != nil {
		t.Fatal(err)
	}
	pins, err := release.PluginPins(bin, testVersion)
	if err != nil {
		t.Fatal(err)
	}
	p, err := layout.FromPath(filepath.Join(out, "krane"))
	if err != nil {
		t.Fatal(err)
	}
	idx, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	img, err := idx.Image(im.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	extract(t, img, root)
	hcl := filepath.Join(t.TempDir(), "krane.hcl")
	conf := "region = \"r\"\ncluster_id = \"c\"\ncontrol_plane {\n  url = \"http://ctrl:7443\"\n  token = \"t\"\n}\nplugin_dir = \"" + filepath.Join(root, "usr/local/lib/krane/plugins") + "\"\n" + string(pins)
	if err := os.WriteFile(hcl, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(hcl, nil)
	if err != nil {
		t.Fatalf("plugins.hcl as part of krane.hcl: %v\n%s", err, pins)
	}
	for _, name := range config.BuiltIn {
		ctl, ok := cfg.Controllers[name]
		if !ok || len(ctl.SHA256) != 1 {
			t.Errorf("plugins.hcl pins controller %q as %+v", name, ctl)
			continue
		}
		digest, err := config.FileSHA256(ctl.Path)
		if err != nil {
			t.Fatal(err)
		}
		if err := ctl.PinError(digest, testVersion); err != nil {
			t.Errorf("the image's %s: %v", ctl.Path, err)
		}
	}
	if !strings.Contains(string(pins), testVersion) {
		t.Errorf("plugins.hcl does not name its release:\n%s", pins)
	}
}
