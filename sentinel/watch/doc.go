// Package watch feeds a sentinel's Router from the cluster: the routes from
// one ConfigMap, the instances of the routed deployment from its
// EndpointSlices. Nothing on the request path calls the API server.
//
// Why these sources: the sentinel plugin writes the routes it gets from
// ctrl into the ConfigMap, so the sentinel needs no connection to ctrl; and
// EndpointSlices are the standard, least-privilege list of a Service's
// ready endpoints (readable with get/list/watch on endpointslices, no pod
// access), maintained by Kubernetes from the pods' readiness probes, so an
// instance failing its health check leaves the pool within a watch event.
//
// Both are informers with narrow selectors: the ConfigMap by
// metadata.name in its namespace, the slices by
// kubernetes.io/service-name=<service> in the backend's namespace.
//
// A new backend (promote, rollback) is switched to only once its slices
// are synced, so the old deployment keeps serving until the new one can
// take requests; the old backend's watch stops after its last in-flight
// request finished (or after DrainTimeout).
package watch
