// Package routes is the contract between the sentinel plugin, which writes
// an environment's routes into a ConfigMap, and the krane-sentinel data
// plane, which reads them: the JSON document under key "routes.json".
//
// It is kept free of Kubernetes and HTTP code so that both sides can import
// it without pulling in the other's dependencies.
package routes
