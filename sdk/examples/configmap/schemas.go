package main

import "krane.dev/sdk"

// The schemas are generated from the Go types (Spec, Config, with their
// jsonschema tags), so each is written once: the host checks a `config {}`
// block against configSchema before Configure, naming a wrong key;
// `--describe` prints specSchema and `ctrl kind register` takes it, so
// ctrl refuses a spec this plugin would refuse before it reaches a
// cluster. validate (controller.go) keeps what a schema cannot say.
var (
	configSchema = sdk.MustSchemaFor[Config]()
	specSchema   = sdk.MustSchemaFor[Spec]()
)
