package main

// configSchema is the JSON Schema of the `config {}` block: the host
// checks the block against it before Configure, naming a wrong key.
const configSchema = `{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "type": "object",
  "additionalProperties": false,
  "properties": {
    "allowed_namespaces": {
      "type": "array",
      "items": {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"}
    }
  }
}`

// specSchema is the JSON Schema of a resource's spec. `--describe` prints
// it and `ctrl kind register` takes it, so ctrl refuses a spec this plugin
// would refuse before it reaches a cluster.
const specSchema = `{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "type": "object",
  "additionalProperties": false,
  "required": ["namespace", "name"],
  "properties": {
    "namespace": {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "maxLength": 63},
    "name": {"type": "string", "minLength": 1, "maxLength": 253},
    "data": {"type": "object", "additionalProperties": {"type": "string"}}
  }
}`
