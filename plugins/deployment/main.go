// Command krane-plugin-deployment is Krane's deployment plugin: it runs
// user workloads (kind "deployment") as ReplicaSets and reports their pods
// as instances. The krane host starts it; see README.md.
package main

import (
	"github.com/hashicorp/go-hclog"

	"krane.dev/plugins/deployment/controller"
	"krane.dev/sdk"
)

func main() {
	sdk.Serve(func(log hclog.Logger) sdk.Controller { return controller.New(log) })
}
