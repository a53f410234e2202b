// Package sdk is what a krane controller plugin imports: the module
// krane.dev/sdk, which a plugin's go.mod requires (and nothing else of
// Krane).
//
// A plugin is a separate binary that reconciles one or more resource kinds
// in a Kubernetes cluster. The krane host runs it as a go-plugin gRPC
// process, streams it the desired state it receives from ctrl, and forwards
// the status it reports. A plugin author implements [Controller] in plain Go
// types (and, optionally, [StatusWatcher] and [Shutdowner]) and calls
// [Serve] from main:
//
//	func main() {
//		sdk.Serve(func(log hclog.Logger) sdk.Controller { return mycontroller.New(log) })
//	}
//
// [StatusFeed] is a plugin's WatchStatus, written once; package sdk/kube
// holds the Kubernetes side (clients and the RBAC check, informers, the
// cache by resource id, apply and delete, validators), sdk/plugintest the
// test harness and conformance suite, and sdk/envtest a real control plane
// for a plugin's tests. docs/plugin-authoring.md in the krane repository
// walks through a plugin from its source to every cluster.
//
// The wire protocol (krane.plugin.v1) never appears in this package's API:
// wire.go converts between it and the types here, in one place, for both
// ends. The host uses [NewClientConfig] and [Dispense] to start a plugin
// binary and talk to it through the same types ([Plugin]).
//
// This module must stay light: it may not import the host, ctrl, Restate,
// MySQL or cilium (a test enforces it), so a plugin links and downloads only
// what it needs.
package sdk
