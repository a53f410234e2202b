// Package ctrl is Krane's control plane. It holds no code itself; its
// subpackages are:
//
//   - store: the MySQL schema (migrations), version stamping (the
//     no-lost-change design and its proof), desired-state reads, status
//     reports, clusters and tokens;
//   - clusterapi: the ClusterService agents talk to (watch streams, reports,
//     heartbeats) and the per-process head poller;
//   - auth: API tokens and the gRPC interceptors that check every call;
//   - deployspec: the deployment domain model (the spec a deploy carries,
//     its validation, ids and names) and its conversions between the API,
//     the store and the cluster types;
//   - workflows: the Restate services (VersioningService, DeployWorkflow),
//     their endpoint and registration, and the Notifier that wakes deploys
//     when clusters report;
//   - deployapi: the operators' DeploymentService;
//   - serve: `ctrl serve` wiring (configuration, gRPC and HTTP servers, the
//     Restate side);
//   - cli: the `ctrl` command line (cmd/ctrl is its main).
package ctrl
