package sdk

import (
	"encoding/json"
	"fmt"
	"reflect"

	"github.com/invopop/jsonschema"
)

// SchemaFor returns the JSON Schema (draft 2020-12) of T, generated from
// the Go type, so a spec or config is described once: by the struct the
// plugin decodes into. Use it for KindInfo.SpecSchema and
// Info.ConfigSchema.
//
// The schema follows the json tags (names, omitted fields) and is strict:
// every struct, nested ones included, has "additionalProperties": false, so
// an unknown key is refused by name. A field is required only when its
// jsonschema tag says so; the same tag adds constraints, e.g.
//
//	Name string `json:"name" jsonschema:"required,minLength=1,maxLength=253"`
//	Namespace string `json:"namespace" jsonschema:"required,pattern=^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"`
//	Replicas int32 `json:"replicas" jsonschema:"minimum=0,maximum=100"`
//
// and a field's description comes from jsonschema_description (see
// github.com/invopop/jsonschema for every keyword). Nested types are
// inlined (no $defs), and the result is compiled before it is returned,
// so an error means a tag the schema language refuses (a bad pattern, say).
// What a schema cannot express (a check against the cluster's
// configuration) stays in the plugin's own validation.
func SchemaFor[T any]() (string, error) {
	r := &jsonschema.Reflector{
		DoNotReference:             true,
		ExpandedStruct:             true,
		RequiredFromJSONSchemaTags: true,
		Anonymous:                  true,
	}
	s := r.ReflectFromType(reflect.TypeFor[T]())
	s.Version = "https://json-schema.org/draft/2020-12/schema"
	s.ID = ""
	out, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return "", fmt.Errorf("schema of %s: %w", reflect.TypeFor[T](), err)
	}
	if _, err := CompileSchema(string(out)); err != nil {
		return "", fmt.Errorf("schema of %s: %w", reflect.TypeFor[T](), err)
	}
	return string(out), nil
}

// MustSchemaFor is SchemaFor for a package-level variable: it panics when
// T's tags make no valid schema, which the plugin's first test run shows.
func MustSchemaFor[T any]() string {
	s, err := SchemaFor[T]()
	if err != nil {
		panic(err)
	}
	return s
}
