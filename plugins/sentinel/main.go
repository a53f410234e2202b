// Command krane-plugin-sentinel is the Krane plugin for kind "sentinel":
// each environment's routing proxy layer (Deployment, Service,
// PodDisruptionBudget, gossip Service and CiliumNetworkPolicy).
package main

import (
	"github.com/hashicorp/go-hclog"

	"krane.dev/plugins/sentinel/controller"
	"krane.dev/sdk"
)

func main() {
	sdk.Serve(func(log hclog.Logger) sdk.Controller { return controller.New(log) })
}
