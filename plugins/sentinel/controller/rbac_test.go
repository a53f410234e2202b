package controller

import (
	"testing"

	"krane.dev/sdk/plugintest"
)

// TestRBACManifestGrantsDeclaredPermissions: rbac.yaml, which operators
// apply, grants everything the plugin declares and checks at Configure
// (for the default namespace, the one rbac.yaml names).
func TestRBACManifestGrantsDeclaredPermissions(t *testing.T) {
	plugintest.RBACGrantsOnly(t, "../rbac.yaml", permissions(DefaultNamespace, DefaultServiceAccount))
}
