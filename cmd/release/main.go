// Command release writes the krane, ctrl and krane-sentinel container images as OCI image
// layouts from binaries built with CGO_ENABLED=0 (see internal/release),
// and the built-in plugins' pins (plugins.hcl); `make release` runs it. No Docker daemon and no registry are needed.
//
//	go run ./cmd/release -bin dist/v1.2.0/bin -out dist/v1.2.0/images -version v1.2.0 -pins dist/v1.2.0/plugins.hcl
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"krane.dev/internal/release"
)

func main() {
	bin := flag.String("bin", "bin", "directory holding the binaries (krane, ctrl, krane-plugin-*)")
	out := flag.String("out", "dist/images", "directory to write one OCI image layout per image into")
	version := flag.String("version", "dev", "the images' version (their tag and org.opencontainers.image.version)")
	ca := flag.String("ca", "/etc/ssl/certs/ca-certificates.crt", "PEM bundle of CA certificates to put in the images")
	pins := flag.String("pins", "", "also write the built-in plugins' sha256 pins, as krane.hcl controller blocks, to this file")
	flag.Parse()
	if *pins != "" {
		data, err := release.PluginPins(*bin, *version)
		if err == nil {
			err = os.WriteFile(*pins, data, 0o644)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "release:", err)
			os.Exit(1)
		}
	}
	digests, err := release.Write(*out, *bin, *ca, *version)
	if err != nil {
		fmt.Fprintln(os.Stderr, "release:", err)
		os.Exit(1)
	}
	for _, img := range release.Images {
		fmt.Printf("%s\t%s@%s\t(OCI layout; push with: crane push %s REGISTRY/%s:%s)\n", img.Name, filepath.Join(*out, img.Name), digests[img.Name], filepath.Join(*out, img.Name), img.Name, *version)
	}
}
