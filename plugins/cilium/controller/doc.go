// Package controller is the reconcile code of the cilium plugin: it applies
// the CiliumNetworkPolicies ctrl authors as JSON (kind
// "ciliumnetworkpolicy", spec krane.cluster.v1.CiliumNetworkPolicy).
//
// The path of one policy:
//
//   - policy.go decodes the JSON strictly into cilium's own types
//     (github.com/cilium/cilium/pkg/k8s/apis/cilium.io/v2), validates it
//     against the CRD's schema (unknown fields, and every value validation,
//     as the API server would), as cilium's validator does, and with the
//     agent's own entry point (CiliumNetworkPolicy.Parse, which
//     runs Rule.Sanitize on every rule), then builds the object with Krane's
//     name, namespace, labels and annotations. It is pure, and fuzzed.
//   - scope.go keeps a policy inside its namespace (see the comment there).
//   - controller.go and cluster.go apply it with server-side apply (field
//     manager krane, force) through the dynamic client, skip the write when
//     the informer's copy shows no drift, delete, and list the inventory.
//   - status.go reports applied / rejected / deleted per policy.
//
// Only this plugin links cilium's large module tree; a test keeps sdk/ and
// the host free of it.
package controller
