// Command krane-plugin-quota reconciles kind quota.acme.example: one
// ResourceQuota per object, in the namespace the spec names. It is built
// the way a plugin author outside the krane repository builds a plugin:
// its own module, importing only krane.dev/sdk (and client-go).
package main

import (
	"github.com/hashicorp/go-hclog"

	"krane.dev/sdk"
)

func main() {
	sdk.Serve(func(log hclog.Logger) sdk.Controller { return New(log) })
}
