// Package deployspec is the deployment domain model: the configuration a
// deploy carries (Spec), its validation (FieldError and the Valid*
// checks, with the limits they enforce), deployment and sentinel ids and
// the Kubernetes names derived from them, and the conversions between the
// operators' API, the journaled spec, the deployments row and the cluster
// wire types (convert.go). It holds no I/O: the deploy API validates with
// it, and the durable handlers in ctrl/workflows journal its Spec.
package deployspec
