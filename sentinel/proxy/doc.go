// Package proxy is the sentinel's data plane: an HTTP reverse proxy that
// sends a request for one of an environment's hosts to a ready instance of
// the environment's live deployment.
//
// The Router holds the current table (hosts, backend, instance pool) behind
// an atomic pointer, so a request reads it without locks and a route switch
// is one pointer swap: requests that already picked the old pool finish on
// it, new ones go to the new pool. Something outside (package
// krane.dev/sentinel/watch in production, tests directly) feeds it routes
// and instances.
//
// Per request (handler.go): the probe paths under /_krane/sentinel/ answer
// first; otherwise the Host is normalized (host.go) and must be one of the
// routes' hosts, else 421 Misdirected Request, so the sentinel is never an
// open proxy. The pool picks an instance by the power of two choices over
// in-flight counts (pool.go); a failed connect ejects the instance for a
// growing backoff and the request moves to another instance, which is safe
// because nothing was sent (transport.go). No instance gives 503 with a
// plain-text reason at once.
//
// X-Forwarded-*: a request from an address outside TrustedProxies has its
// X-Forwarded-For/-Host/-Proto and Forwarded headers dropped and replaced
// with what the sentinel saw (the peer address, the Host, "http"); a request
// from a trusted proxy (the load balancer in front) keeps its chain, to
// which the peer is appended. Hop-by-hop headers are removed by
// httputil.ReverseProxy.
package proxy
