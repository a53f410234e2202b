package sdk

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
	"golang.org/x/text/language"
	"golang.org/x/text/message"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"
	"k8s.io/utils/lru"
)

// schemaCacheSize bounds the compiled schemas kept: each distinct schema
// a ctrl or host sees (kinds registered, plugins' config schemas) costs
// memory, and a caller can send many.
const schemaCacheSize = 128

// compiled holds compiled schemas by the SHA-256 of their text, least
// recently used out first (client-go's LRU: small, already a dependency).
var compiled = lru.New(schemaCacheSize)

// schemaBase is the URL a schema is compiled at. Not a file: a reference
// relative to it resolves under it, never to the working directory.
const (
	schemaBaseDir = "https://schema.krane.invalid/"
	schemaBase    = schemaBaseDir + "spec.json"
)

// noLoader refuses every document outside the schema: nothing is read
// from files or the network. The drafts' meta-schemas are built into the
// library and need no loader.
type noLoader struct{}

func (noLoader) Load(u string) (any, error) {
	return nil, fmt.Errorf("%s is outside the schema: a schema may refer only to itself (e.g. \"$ref\": \"#/$defs/name\") "+
		"and to the JSON Schema drafts; nothing is read from files or the network", strings.TrimPrefix(u, schemaBaseDir))
}

// CompileSchema checks that schema is a valid JSON Schema (draft 2020-12
// unless it names another with $schema) and returns it compiled. A $ref or
// $schema that names anything outside the schema itself (a file, a URL)
// other than a draft's meta-schema is refused, naming it.
func CompileSchema(schema string) (*jsonschema.Schema, error) {
	key := sha256.Sum256([]byte(schema))
	if s, ok := compiled.Get(key); ok {
		return s.(*jsonschema.Schema), nil
	}
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(schema))
	if err != nil {
		return nil, fmt.Errorf("the schema is not JSON: %w", err)
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	c.UseLoader(noLoader{})
	if err := c.AddResource(schemaBase, doc); err != nil {
		return nil, schemaCompileError(err)
	}
	s, err := c.Compile(schemaBase)
	if err != nil {
		return nil, schemaCompileError(err)
	}
	compiled.Add(key, s)
	return s, nil
}

// schemaCompileError words a compile error with locations as the schema
// wrote them ("#/$defs/x", "other.json"), without the base URL.
func schemaCompileError(err error) error {
	var le *jsonschema.LoadURLError
	if errors.As(err, &le) {
		return fmt.Errorf("schema: %w", le.Err)
	}
	msg := strings.ReplaceAll(err.Error(), schemaBase, "")
	return fmt.Errorf("schema: %s", strings.ReplaceAll(msg, schemaBaseDir, ""))
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
