// Package ctrl is Krane's control plane. It holds no code itself; its
// subpackages are (a test, doc_test.go, holds this list to `go list
// ./ctrl/...` and to the Restate services workflows declares):
//
//   - store: the MySQL schema (migrations), version stamping (the
//     no-lost-change design and its proof), desired-state reads, status
//     reports, clusters and tokens;
//   - actual: the one rule that turns what each cluster reported on an
//     object into its actual state in a region;
//   - clusterapi: the ClusterService agents talk to (watch streams, reports,
//     heartbeats) and the per-process head poller;
//   - auth: API tokens and the gRPC interceptors that check every call;
//   - bounds: the interceptor that enforces every request field's declared
//     bound, and the Limits table of docs/operating.md;
//   - deployspec: the deployment domain model (the spec a deploy carries,
//     its validation, ids and names) and its conversions between the API,
//     the store and the cluster types;
//   - deploytrace: the span names and derived trace ids of one deploy;
//   - vault: sealing deployments' secret environments and sentinels'
//     credentials, and opening them for the clusters that run them;
//   - workflows: the durable handlers Restate runs (VersioningService,
//     DeployWorkflow, SentinelService, SentinelRolloutService,
//     SentinelRolloutWorker and CtrlIngress, the signed gateway for ctrl's
//     own calls);
//   - restateendpoint: the HTTP endpoint Restate calls those services on,
//     its request identity keys, and its registration with Restate;
//   - restateingress: the signed client of Restate's ingress through which
//     ctrl calls those services from outside Restate;
//   - background: the loops Restate does not run (the Notifier that wakes
//     deploys when clusters report, the sentinel sweeper);
//   - rules: the domain rules the handlers apply (when a deploy or a
//     sentinel's deploy is decided, how a rollout cuts its waves);
//   - api: what every gRPC service shares at its boundary: the one
//     field-error type, the one mapping of errors to gRPC statuses (an
//     interceptor) and paging with its page-token codec;
//   - deployapi: the operators' DeploymentService (and SentinelService
//     and rollouts);
//   - resourceapi: the operators' ResourceService for plugin kinds;
//   - fleetapi: the operators' FleetService (clusters, heartbeats, lag);
//   - console: the web console;
//   - serve: `ctrl serve` wiring (configuration, gRPC and HTTP servers, the
//     Restate side);
//   - cli: the `ctrl` command line (cmd/ctrl is its main);
//   - internal/ctrltest: a real ctrl for tests.
package ctrl
