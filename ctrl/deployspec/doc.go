// Package deployspec is the deployment domain model: the configuration a
// deploy carries (Spec), whose workload is the one message
// krane.cluster.v1.Workload shared by the operators' API, the store and
// the cluster wire; the workload's defaults (WithDefaults) and validation
// (FieldError and the Valid* checks, with the limits they enforce);
// deployment and sentinel ids and the Kubernetes names derived from them;
// and the request's previous top-level form of the workload (convert.go).
// It holds no I/O and imports no store: the deploy API validates with it,
// the durable handlers in ctrl/workflows journal its Spec (json.go), and
// ctrl/store keeps a Spec in each deployments row.
package deployspec
