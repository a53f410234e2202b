package controller_test

import (
	"testing"

	"krane.dev/plugins/cilium/controller"
	"krane.dev/sdk/plugintest"
)

// TestRBACManifestGrantsDeclaredPermissions: rbac.yaml, which operators
// apply, grants everything the plugin declares and checks at Configure.
func TestRBACManifestGrantsDeclaredPermissions(t *testing.T) {
	plugintest.RBACGrantsOnly(t, "../rbac.yaml", controller.Permissions)
}
