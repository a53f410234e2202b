// Package controller reconciles kind "sentinel" (krane.cluster.v1.Sentinel):
// the routing proxy of one environment in one region.
//
// Per sentinel, in one namespace ("sentinel" by default, created on demand),
// it server-side applies (field manager "krane", force):
//
//   - a Deployment <k8s_name>: rolling updates that never drop below the
//     desired count, spread across zones, on the tainted sentinel node pool;
//   - a ClusterIP Service <k8s_name> on the HTTP port;
//   - a PodDisruptionBudget <k8s_name> that keeps a pod available;
//   - a headless Service <k8s_name>-gossip selecting every sentinel pod of
//     the environment, for peer discovery;
//   - a CiliumNetworkPolicy <k8s_name>-gossip allowing gossip between them,
//     through the dynamic client, and only while the CRD is served;
//   - for a sentinel with encrypted_credentials, a Secret
//     <k8s_name>-credentials holding them, opened through the krane host
//     (credentials.go), and read as the container's last envFrom.
//
// The others are owned by the Deployment. Writes happen only when an
// informer cache shows drift from the desired state, so a resync of
// unchanged sentinels makes no API writes.
//
// WatchStatus reports each sentinel's rollout and health from the
// Deployment, its ReplicaSets and pods. A report names a running image only
// once every pod runs it and is available (see sentinelStatus): ctrl treats
// "healthy on image X" as the end of a rollout.
//
// Files: config.go (the config block), validate.go (desired-state checks),
// build.go (pure object builders), cluster.go (clients, caches, the CRD
// watch), credentials.go (the credentials Secret), controller.go (the
// sdk.Controller), status.go (WatchStatus).
package controller
