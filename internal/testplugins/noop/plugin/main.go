// Command plugin serves the no-op controller; build it as
// krane-plugin-noop-X to get kind "noop-x.test.krane.dev".
package main

import (
	"os"
	"path/filepath"
	"strings"

	"github.com/hashicorp/go-hclog"

	"krane.dev/internal/testplugins/noop"
	"krane.dev/sdk"
)

func main() {
	name := strings.TrimPrefix(filepath.Base(os.Args[0]), "krane-plugin-")
	sdk.Serve(func(hclog.Logger) sdk.Controller { return noop.New(name) })
}
