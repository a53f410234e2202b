# krane.hcl: configuration of the krane host, one per cluster.
#
# Every value can be overridden with a KRANE_* environment variable; nested
# keys use a double underscore: KRANE_CONTROL_PLANE__URL, KRANE_SYNC__WORKERS,
# KRANE_CONTROLLER__CILIUM__ENABLED=false. The demo (`make demo`) runs one
# krane per region with this file and such overrides.
#
# Check a file without running anything but the plugins' self-description:
#   krane validate -c krane.hcl
# Reload after editing: send SIGHUP (krane also notices the file changing).
# Only the controllers whose block changed are restarted.

# Which region this cluster serves and its id; both must match the token.
region     = "local-a"
cluster_id = "local-a-1"

control_plane {
  # https:// for TLS (recommended); http:// only for a local, trusted network.
  url = "http://127.0.0.1:7070"
  # Exactly one of token, token_file (re-read when it changes) or token_env.
  token_env = "KRANE_TOKEN"
  # ca_file          = "/etc/krane/ctrl-ca.pem"
  # client_cert_file = "/etc/krane/tls.crt"   # mTLS
  # client_key_file  = "/etc/krane/tls.key"
}

kubernetes {
  # Empty: use the pod's ServiceAccount (in-cluster).
  kubeconfig = ""
  qps        = 500    # client-side limits of each plugin (the API server also protects itself)
  burst      = 1000
}

sync {
  resync_interval = "1m"   # desired state re-read, drift repaired
  reconnect_min   = "1s"   # jittered reconnect to ctrl
  reconnect_max   = "5s"
  workers         = 16     # parallel applies per kind
  # A stream from ctrl silent this long (no change, no keep-alive) is torn
  # down and resumed from the cursor: three of ctrl's watch.keepalive (15s).
  stream_timeout  = "45s"
}

# The garbage collection brake: one pass may delete at most this fraction of
# a kind's managed objects (or min_deletes, whichever is larger). Beyond it
# nothing is deleted and the brake trips (log line + metric
# krane_host_gc_brake_trips_total). Set allow_mass_delete = true, for one
# deliberate pass, to override.
gc {
  max_delete_fraction = 0.25
  min_deletes         = 5
  allow_mass_delete   = false
}

# Several krane replicas per cluster: only the holder of a Lease runs the
# controllers; a standby takes over when the holder stops renewing it
# (within lease_duration + retry_period, then it re-bootstraps). A standby's
# /readyz says "standby".
leader_election {
  enabled        = false
  namespace      = "krane"
  name           = "krane"
  lease_duration = "10s"
  renew_deadline = "7s"
  retry_period   = "2s"
}

# /healthz, /readyz (ready once every enabled kind has bootstrapped), /metrics.
server {
  listen = "127.0.0.1:9464"
}

log {
  level = "info"   # trace, debug, info, warn, error
  json  = false
}

# Plugin binaries are looked up here unless a controller gives an absolute path.
plugin_dir = "bin"

# One block per controller plugin. `enabled` defaults to true; `path`
# defaults to krane-plugin-NAME; `sha256` pins the binary (sha256sum) and the
# plugin is refused if it does not match. `config` is the plugin's own block,
# checked against the schema the plugin publishes.
controller "deployment" {
  enabled = true
  config {
    runtime_class = "gvisor"
    # A change of the pod template (this block, a plugin upgrade) rolls at
    # most this many deployments at once, each new ReplicaSet available
    # before its old one goes.
    max_concurrent_rolls = 10
    # A roll whose new pods are not available within this long gives up its
    # slot; the deployment keeps its old pods and its Apply reports why.
    roll_progress_deadline = "10m"
    # Pull credentials per registry host: Secrets of pull_secret_namespace
    # (default "krane") that the plugin copies into every workload
    # namespace and keeps in sync, e.g.:
    # image_pull_secrets = { "registry.example.com" = "build-registry" }
  }
}

controller "sentinel" {
  enabled = true
  config {
    namespace = "sentinel"
  }
}

controller "cilium" {
  enabled = true
  config {
    # Where ctrl's policies may live: the workload namespaces (ws-<workspace>)
    # and the sentinels'. Anything else is refused before it reaches the
    # cluster.
    allowed_namespace_prefixes = ["ws-"]
    allowed_namespaces         = ["sentinel"]
    # Peers a policy may allow traffic from/to outside its own namespace.
    allowed_peer_namespaces    = ["sentinel"]
  }
}
