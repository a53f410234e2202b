// Package sdk is what a krane controller plugin imports.
//
// A plugin is a separate binary that reconciles one or more resource kinds in
// a Kubernetes cluster. The krane host runs it as a go-plugin gRPC process,
// streams it the desired state it receives from ctrl, and forwards the status
// it reports. A plugin author implements [Controller] in plain Go types and
// calls [Serve] from main:
//
//	func main() {
//		sdk.Serve(func(log hclog.Logger) sdk.Controller { return mycontroller.New(log) })
//	}
//
// The wire protocol (krane.plugin.v1) never appears in this package's API:
// server.go and client.go convert between it and the types here, the same way
// for every plugin. The host uses [NewClientConfig] and [Dispense] to start a
// plugin binary and talk to it through the same Controller interface.
//
// This package must stay light: it may not import the host, ctrl, Restate,
// MySQL or cilium (a test enforces it), so a plugin links only what it needs.
package sdk
