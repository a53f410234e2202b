// Command krane-plugin-configmap is the example Krane plugin: it reconciles
// kind "configmap.example.krane.dev", one ConfigMap per resource. Copy this
// folder to start a plugin of your own: it imports only krane.dev/sdk (and
// client-go); README.md walks through it.
package main

import (
	"github.com/hashicorp/go-hclog"

	"krane.dev/sdk"
)

func main() {
	sdk.Serve(func(log hclog.Logger) sdk.Controller { return NewController(log) })
}
