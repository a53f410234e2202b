// Package kinds names the built-in resource kinds shared by ctrl, the krane
// host's tests and the built-in plugins. Plugin authors' kinds need no entry
// here: ctrl serves any other kind from its generic resources table.
package kinds

import "strings"

const (
	// Deployment is a user workload in one region (krane.cluster.v1.Deployment).
	Deployment = "deployment"
	// Sentinel is an environment's routing proxy in one region
	// (krane.cluster.v1.Sentinel).
	Sentinel = "sentinel"
	// CiliumNetworkPolicy is a network policy authored by ctrl as JSON
	// (krane.cluster.v1.CiliumNetworkPolicy).
	CiliumNetworkPolicy = "ciliumnetworkpolicy"
)

// BuiltIn lists the built-in kinds.
var BuiltIn = []string{Deployment, Sentinel, CiliumNetworkPolicy}

// OfBuiltInController is the kind the built-in controller of that name
// (its block in krane.hcl) reconciles, "" for another name: what a host
// serves while such a controller has never started and so has not
// described its kinds yet.
func OfBuiltInController(name string) string {
	switch name {
	case "deployment":
		return Deployment
	case "sentinel":
		return Sentinel
	case "cilium":
		return CiliumNetworkPolicy
	}
	return ""
}

// SentinelIDPrefix starts every sentinel id ctrl makes. Sealed secrets are
// told apart by it: a sentinel id names a sentinel's credentials, any other
// id a deployment's secret environment.
const SentinelIDPrefix = "sen_"

// SecretsKind is the kind whose controller may open the sealed secrets of
// the object id names: Sentinel for a sentinel id (sen_...), Deployment
// for any other.
func SecretsKind(id string) string {
	if strings.HasPrefix(id, SentinelIDPrefix) {
		return Sentinel
	}
	return Deployment
}
