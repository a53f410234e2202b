// Package check proves the manifests in deploy/ (`make deploy-check`,
// part of `make test`). Its test renders every overlay under
// deploy/overlays with the kustomize library `kubectl apply -k` uses and,
// for each one:
//
//   - has the programs read their own configuration from the rendered
//     objects, with the pod's environment: ctrl's loader and validation
//     (ctrl.yaml and CTRL_* variables), `restate-server --dump-config`
//     (restate.toml and RESTATE_* variables; every key must take effect)
//     and krane's (krane.hcl and KRANE_* variables);
//   - follows every address those configurations name (Restate's ingress
//     and admin API, ctrl's Restate endpoint, ctrl's gRPC for krane,
//     Restate's node addresses) to a Service and a container port, and
//     evaluates the NetworkPolicies for each: the configured caller is
//     allowed; for Restate's ports and ctrl's endpoint, everyone else is
//     refused;
//   - runs the overlay's Restate nodes as local processes from the
//     rendered restate.toml and the pods' environment (only addresses and
//     the memory budget made local), provisions a multi-node cluster with
//     the `restatectl provision` command docs/operating.md shows, and
//     requires every node to serve its ingress;
//   - checks images are pinned and set by the overlay, pods get no
//     Service environment and a token only when their ServiceAccount has
//     roles, every Secret a pod uses is named in docs/operating.md;
//   - installs it into a real API server (internal/testenv/kubeenv, kwok
//     nodes, a stand-in volume provisioner) with server-side apply, which
//     must draw no warning (Pod Security "restricted" is enforced in both
//     namespaces) and be a no-op the second time, and waits for every
//     Deployment and StatefulSet to run all its replicas;
//   - proves each ServiceAccount's permissions (below);
//   - runs the real krane host as the overlay's krane ServiceAccount, with
//     its plugins as their own accounts (the host requests their tokens):
//     it must win the Lease, every plugin must configure itself, the API
//     server must refuse none of them anything, and stopping must release
//     the Lease.
//
// # What each component's code uses
//
// ctrl links no Kubernetes client (the check asks `go list -deps` and
// fails the day it does) and Restate never calls the API server: their
// ServiceAccounts must hold nothing. krane's own code uses the
// leader-election Lease in leader_election.namespace (get, create, update:
// client-go's LeaseLock) and a token of each enabled plugin's account
// (create serviceaccounts/token, by name). Each enabled plugin runs as its
// own account (krane.hcl's service_account, default krane-plugin-NAME),
// whose code uses what its plugins/NAME/rbac.yaml grants, read from that
// file (not from the overlay). A plugin's rbac.yaml is exact because the
// plugin's integration tests apply it and run the plugin under a token of
// exactly that role, so code that uses anything else fails there; and the
// real host run above fails here if the overlay's RBAC does not deliver
// it.
//
// For each ServiceAccount the check then asks the API server
// (SubjectAccessReview) that every permission its code uses is allowed;
// that what the allowed set implies it must not do (the other verbs on the
// same resources, other names where a rule names one, other namespaces
// where a Role is namespaced), a sample of dangerous permissions (Dangerous)
// and the other components' permissions are denied; and, with a
// SelfSubjectRulesReview made as the account in each namespace, that it
// holds nothing beyond its uses and what every authenticated user holds.
// Each plugin's account is denied what only another plugin needs (the
// cilium plugin reads no Secrets, the sentinel plugin writes no
// ReplicaSets, ...): the log lists, per plugin, what it was refused.
//
// # Covering a new permission
//
// A plugin that starts using a new verb or resource adds it to its
// rbac.yaml (its own tests fail until it does); this check then requires
// every overlay to grant it to the plugin's account, and refuses any grant
// beyond it. A new API use in the host goes into leaseUses (or a
// list like it) here and into deploy/base/krane/rbac.yaml. ctrl starting to
// use the API fails the `go list` check until its ServiceAccount and this
// check learn what it uses.
package check
