// Command krane-plugin-cilium is the Krane plugin that applies the
// CiliumNetworkPolicies ctrl authors as JSON. See README.md.
package main

import (
	"github.com/hashicorp/go-hclog"

	"krane.dev/plugins/cilium/controller"
	"krane.dev/sdk"
)

func main() {
	sdk.Serve(func(log hclog.Logger) sdk.Controller { return controller.New(log) })
}
