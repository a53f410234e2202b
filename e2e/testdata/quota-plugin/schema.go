package main

// specSchema is what ctrl checks before anything reaches a cluster; what
// only the plugin can judge (a quantity that does not parse) it refuses
// itself, naming the field.
const specSchema = `{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "type": "object",
  "additionalProperties": false,
  "required": ["namespace"],
  "properties": {
    "namespace": {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "maxLength": 63},
    "cpu": {"type": "string"},
    "memory": {"type": "string"},
    "pods": {"type": "integer", "minimum": 0}
  }
}`
