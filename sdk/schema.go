package sdk

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
	"golang.org/x/text/language"
	"golang.org/x/text/message"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"
)

var compiled sync.Map // schema text -> *jsonschema.Schema

// CompileSchema checks that schema is a valid JSON Schema (draft 2020-12
// unless it names another with $schema) and returns it compiled.
func CompileSchema(schema string) (*jsonschema.Schema, error) {
	if s, ok := compiled.Load(schema); ok {
		return s.(*jsonschema.Schema), nil
	}
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(schema))
	if err != nil {
		return nil, fmt.Errorf("the schema is not JSON: %w", err)
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	if err := c.AddResource("schema.json", doc); err != nil {
		return nil, fmt.Errorf("schema: %w", err)
	}
	s, err := c.Compile("schema.json")
	if err != nil {
		return nil, fmt.Errorf("schema: %w", err)
	}
	compiled.Store(schema, s)
	return s, nil
}

// CompileConfigSchema checks that a config schema is a valid JSON Schema.
func CompileConfigSchema(schema string) (*jsonschema.Schema, error) {
	s, err := CompileSchema(schema)
	if err != nil {
		return nil, fmt.Errorf("config %w", err)
	}
	return s, nil
}

// SchemaError is a JSON document that fails its schema. Pointer is the
// JSON pointer (RFC 6901) of the failing value: "/replicas", "/env/0/name",
// "" for the document itself; for an unknown or missing property it points
// at that property.
type SchemaError struct {
	Pointer string
	Reason  string
}

func (e *SchemaError) Error() string {
	if e.Pointer == "" {
		return e.Reason
	}
	return e.Pointer + ": " + e.Reason
}

// ValidateJSON checks a JSON document against a JSON Schema; a failure is
// a [*SchemaError] naming the field.
func ValidateJSON(schema string, doc []byte) error {
	s, err := CompileSchema(schema)
	if err != nil {
		return err
	}
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(doc))
	if err != nil {
		return &SchemaError{Reason: "not valid JSON: " + err.Error()}
	}
	return schemaError(s.Validate(inst))
}

// ValidateSpec checks a JSON spec (a google.protobuf.Struct, as a kind
// registered with ctrl arrives) against a JSON Schema.
func ValidateSpec(schema string, spec Spec) error {
	var st structpb.Struct
	if err := spec.Decode(&st); err != nil {
		return err
	}
	doc, err := protojson.Marshal(&st)
	if err != nil {
		return err
	}
	return ValidateJSON(schema, doc)
}

// schemaError turns the library's error tree into the first failing leaf.
func schemaError(err error) error {
	var verr *jsonschema.ValidationError
	if !errors.As(err, &verr) {
		return err
	}
	leaf := firstLeaf(verr)
	path := leaf.InstanceLocation
	reason := leaf.ErrorKind.LocalizedString(message.NewPrinter(language.English))
	switch k := leaf.ErrorKind.(type) {
	case *kind.AdditionalProperties:
		if len(k.Properties) > 0 {
			path, reason = append(path, k.Properties[0]), "unknown property"
		}
	case *kind.Required:
		if len(k.Missing) > 0 {
			path, reason = append(path, k.Missing[0]), "missing required property"
		}
	}
	return &SchemaError{Pointer: pointer(path), Reason: reason}
}

// pointer joins path segments into a JSON pointer, escaping "~" and "/".
func pointer(path []string) string {
	var b strings.Builder
	for _, p := range path {
		b.WriteByte('/')
		b.WriteString(strings.NewReplacer("~", "~0", "/", "~1").Replace(p))
	}
	return b.String()
}

// ValidateConfig checks a config block (JSON object) against a plugin's
// config schema. The error is a [*ConfigError] naming the offending key as a
// dotted path inside the block. An empty schema accepts only "{}".
func ValidateConfig(schema string, config json.RawMessage) error {
	if len(bytes.TrimSpace(config)) == 0 {
		config = json.RawMessage("{}")
	}
	if strings.TrimSpace(schema) == "" {
		schema = `{"type":"object","additionalProperties":false}`
	}
	if _, err := CompileConfigSchema(schema); err != nil {
		return err
	}
	err := ValidateJSON(schema, config)
	var se *SchemaError
	if !errors.As(err, &se) {
		return err
	}
	if strings.HasPrefix(se.Reason, "not valid JSON: ") {
		return &ConfigError{Reason: se.Reason}
	}
	key := strings.ReplaceAll(strings.TrimPrefix(se.Pointer, "/"), "/", ".")
	if se.Reason == "unknown property" {
		se.Reason = "unknown key"
	}
	return &ConfigError{Key: key, Reason: se.Reason}
}

func firstLeaf(e *jsonschema.ValidationError) *jsonschema.ValidationError {
	for len(e.Causes) > 0 {
		e = e.Causes[0]
	}
	return e
}
