// Package server runs a krane-sentinel process: its configuration from the
// environment (config.go), the data port (the proxy and its probe paths),
// the admin port (/metrics, /healthz, /readyz) and the cluster watch, and
// the order of a graceful shutdown: readiness goes false, the process waits
// ShutdownDelay so load balancers and endpoints stop sending, then in-flight
// requests drain for at most DrainTimeout.
package server
