# krane.hcl in a cluster (the ConfigMap krane-config). The commented sample
# at the repository root explains every key; `krane validate -c krane.hcl`
# checks a copy, plugins' own blocks included. Editing this ConfigMap
# reloads krane without a restart once the kubelet has synced the file
# (about a minute); only the controllers whose block changed restart.
#
# region, cluster_id and control_plane.url differ per cluster: they come
# from the ConfigMap krane-cluster (KRANE_REGION, KRANE_CLUSTER_ID,
# KRANE_CONTROL_PLANE__URL), which each overlay generates.

control_plane {
  # The Secret krane-token reaches the pod as KRANE_TOKEN.
  token_env = "KRANE_TOKEN"
  # ca_file          = "/etc/krane/tls/ca.crt"   # ctrl's CA, when not a public one
  # client_cert_file = "/etc/krane/tls/tls.crt"  # mTLS
  # client_key_file  = "/etc/krane/tls/tls.key"
  # The connection is TLS only when control_plane.url is https:// (the ha
  # overlay); an http:// URL (the demo) is plaintext. These files are read
  # again when they change: a renewed certificate needs no restart.
}

kubernetes {
  kubeconfig = ""   # in-cluster: the pod's ServiceAccount
}

# Two replicas: one holds the Lease and runs the controllers, the other
# stands by (its /readyz answers "standby").
leader_election {
  enabled   = true
  namespace = "krane"
  name      = "krane"
}

server {
  listen = "0.0.0.0:9464"
}

log {
  level = "info"
  json  = true
}

# The image ships the built-in plugins here.
plugin_dir = "/usr/local/lib/krane/plugins"

controller "deployment" {
  config {
    runtime_class = "gvisor"
  }
}

controller "sentinel" {
  config {
    namespace = "sentinel"
  }
}

controller "cilium" {
  config {
    allowed_namespace_prefixes = ["ws-"]
    allowed_namespaces         = ["sentinel"]
    allowed_peer_namespaces    = ["sentinel"]
  }
}
