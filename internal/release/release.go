// Package release builds the two container images the Dockerfile
// describes (krane with its plugins, and ctrl) without a Docker daemon and
// without pulling a base image: each is a static base layer made here
// (ca-certificates from the build machine, a passwd and group naming the
// non-root user 65532, /tmp, the user's home) and a layer of binaries,
// written as an OCI image layout (github.com/google/go-containerregistry).
// `make release` runs it through cmd/release on binaries built with
// CGO_ENABLED=0, which need nothing else in the image.
//
// The images are reproducible: every file and the image config carry the
// Unix epoch as their time, so the same binaries make the same digests.
package release

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"sort"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"krane.dev/host/config"
)

// User is the non-root user the images run as (distroless's "nonroot").
const (
	UID  = 65532
	User = "65532:65532"
)

// Image is one image: its binaries (file name in the bin directory ->
// path in the image), entrypoint and default arguments.
type Image struct {
	Name       string
	Binaries   map[string]string
	Entrypoint []string
	Cmd        []string
}

// Images are the Dockerfile's three stages.
var Images = []Image{
	{
		Name: "krane",
		Binaries: map[string]string{
			"krane":                   "/usr/local/bin/krane",
			"krane-plugin-deployment": "/usr/local/lib/krane/plugins/krane-plugin-deployment",
			"krane-plugin-sentinel":   "/usr/local/lib/krane/plugins/krane-plugin-sentinel",
			"krane-plugin-cilium":     "/usr/local/lib/krane/plugins/krane-plugin-cilium",
		},
		Entrypoint: []string{"/usr/local/bin/krane"},
		Cmd:        []string{"run", "-c", "/etc/krane/krane.hcl"},
	},
	{
		Name:       "ctrl",
		Binaries:   map[string]string{"ctrl": "/usr/local/bin/ctrl"},
		Entrypoint: []string{"/usr/local/bin/ctrl"},
		Cmd:        []string{"serve"},
	},
	{
		// The sentinel a deploy starts per environment and region
		// (ctrl's default sentinel.default_image, version.SentinelImage).
		Name:       "krane-sentinel",
		Binaries:   map[string]string{"krane-sentinel": "/usr/local/bin/krane-sentinel"},
		Entrypoint: []string{"/usr/local/bin/krane-sentinel"},
	},
}

// file is one entry of a layer.
type file struct {
	name string // path in the image, without the leading "/"
	mode int64
	dir  bool
	uid  int
	data []byte
}

// baseFiles are the static base: what a Go binary built with
// CGO_ENABLED=0 and running as a non-root user needs of its image.
func baseFiles(caCerts []byte) []file {
	return []file{
		{name: "etc", mode: 0o755, dir: true},
		{name: "etc/passwd", mode: 0o644, data: []byte("root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n")},
		{name: "etc/group", mode: 0o644, data: []byte("root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n")},
		{name: "etc/nsswitch.conf", mode: 0o644, data: []byte("hosts: files dns\n")},
		{name: "etc/ssl", mode: 0o755, dir: true},
		{name: "etc/ssl/certs", mode: 0o755, dir: true},
		{name: "etc/ssl/certs/ca-certificates.crt", mode: 0o644, data: caCerts},
		{name: "home", mode: 0o755, dir: true},
		{name: "home/nonroot", mode: 0o700, dir: true, uid: UID},
		{name: "root", mode: 0o700, dir: true},
		{name: "tmp", mode: 0o1777, dir: true},
	}
}

// layer makes a layer of files (their parents first, as created).
func layer(files []file) (v1.Layer, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		h := &tar.Header{Name: f.name, Mode: f.mode, Uid: f.uid, Gid: f.uid, Format: tar.FormatPAX}
		if f.dir {
			h.Typeflag, h.Name = tar.TypeDir, f.name+"/"
		} else {
			h.Typeflag, h.Size = tar.TypeReg, int64(len(f.data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	data := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil },
		tarball.WithMediaType(types.OCILayer))
}

// binaryLayer holds img's binaries from binDir, with their directories.
func binaryLayer(img Image, binDir string) (v1.Layer, error) {
	dirs := map[string]bool{}
	var bins []file
	for src, dst := range img.Binaries {
		data, err := os.ReadFile(filepath.Join(binDir, src))
		if err != nil {
			return nil, fmt.Errorf("image %s: %w (build the binaries first: CGO_ENABLED=0 make build)", img.Name, err)
		}
		name := strings.TrimPrefix(dst, "/")
		for d := path.Dir(name); d != "."; d = path.Dir(d) {
			dirs[d] = true
		}
		bins = append(bins, file{name: name, mode: 0o755, data: data})
	}
	var files []file
	for d := range dirs {
		files = append(files, file{name: d, mode: 0o755, dir: true})
	}
	// Sorted, so a parent comes before its children and the digest does
	// not depend on map order.
	files = append(files, bins...)
	sort.Slice(files, func(i, j int) bool { return files[i].name < files[j].name })
	return layer(files)
}

// Build makes img from the binaries in binDir over the base layer made of
// caFile (a PEM bundle, the build machine's ca-certificates).
func Build(img Image, binDir, caFile, version string) (v1.Image, error) {
	ca, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("read the CA certificates to put in the image: %w (install ca-certificates, or name a bundle)", err)
	}
	base, err := layer(baseFiles(ca))
	if err != nil {
		return nil, fmt.Errorf("image %s: base layer: %w", img.Name, err)
	}
	bins, err := binaryLayer(img, binDir)
	if err != nil {
		return nil, err
	}
	out, err := mutate.AppendLayers(empty.Image, base, bins)
	if err != nil {
		return nil, err
	}
	out = mutate.MediaType(out, types.OCIManifestSchema1)
	out = mutate.ConfigMediaType(out, types.OCIConfigJSON)
	cfg, err := out.ConfigFile()
	if err != nil {
		return nil, err
	}
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture = "linux", runtime.GOARCH
	cfg.Config.Entrypoint, cfg.Config.Cmd = img.Entrypoint, img.Cmd
	cfg.Config.User = User
	cfg.Config.WorkingDir = "/home/nonroot"
	cfg.Config.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"}
	cfg.Config.Labels = map[string]string{
		"org.opencontainers.image.title":   img.Name,
		"org.opencontainers.image.version": version,
		"org.opencontainers.image.source":  "krane",
	}
	return mutate.ConfigFile(out, cfg)
}

// Write builds every image into outDir/<name> as an OCI image layout,
// tagged version (org.opencontainers.image.ref.name), and returns their
// digests by name.
func Write(outDir, binDir, caFile, version string) (map[string]v1.Hash, error) {
	digests := map[string]v1.Hash{}
	for _, img := range Images {
		built, err := Build(img, binDir, caFile, version)
		if err != nil {
			return nil, err
		}
		dir := filepath.Join(outDir, img.Name)
		if err := os.RemoveAll(dir); err != nil {
			return nil, err
		}
		p, err := layout.Write(dir, empty.Index)
		if err != nil {
			return nil, fmt.Errorf("image %s: %w", img.Name, err)
		}
		if err := p.AppendImage(built, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": version})); err != nil {
			return nil, fmt.Errorf("image %s: write %s: %w", img.Name, dir, err)
		}
		if digests[img.Name], err = built.Digest(); err != nil {
			return nil, err
		}
	}
	return digests, nil
}

// PluginPins is the krane.hcl fragment that pins the built-in plugins of
// the krane image of version, built from binDir: one controller block per
// plugin with the sha256 of the binary the image ships. `make release`
// writes it as plugins.hcl beside SHA256SUMS; cluster admins who pin the
// built-ins copy the digests before moving the image (docs/operating.md,
// "Upgrading").
func PluginPins(binDir, version string) ([]byte, error) {
	var krane Image
	for _, img := range Images {
		if img.Name == "krane" {
			krane = img
		}
	}
	var names []string
	for src := range krane.Binaries {
		if strings.HasPrefix(src, "krane-plugin-") {
			names = append(names, src)
		}
	}
	sort.Strings(names)
	var b strings.Builder
	fmt.Fprintf(&b, "# The built-in plugins of krane %s, as its image ships them\n", version)
	fmt.Fprintf(&b, "# (%s). To pin them, merge these sha256 lines into the controller\n", path.Dir(krane.Binaries[names[0]]))
	b.WriteString("# blocks of krane.hcl before the image moves to this release, listing the\n")
	b.WriteString("# previous release's digests too while the roll runs:\n")
	b.WriteString("#   sha256 = [\"<previous>\", \"<this>\"]\n")
	b.WriteString("# then this release's alone (docs/operating.md, \"Upgrading\").\n")
	for _, src := range names {
		sum, err := config.FileSHA256(filepath.Join(binDir, src))
		if err != nil {
			return nil, fmt.Errorf("pin %s: %w", src, err)
		}
		fmt.Fprintf(&b, "\ncontroller %q {\n  sha256 = %q\n}\n", strings.TrimPrefix(src, "krane-plugin-"), sum)
	}
	return []byte(b.String()), nil
}
