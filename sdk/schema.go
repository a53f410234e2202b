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
)

var compiled sync.Map // schema text -> *jsonschema.Schema

// CompileConfigSchema checks that schema is a valid JSON Schema.
func CompileConfigSchema(schema string) (*jsonschema.Schema, error) {
	if s, ok := compiled.Load(schema); ok {
		return s.(*jsonschema.Schema), nil
	}
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(schema))
	if err != nil {
		return nil, fmt.Errorf("config schema is not JSON: %w", err)
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	if err := c.AddResource("config.schema.json", doc); err != nil {
		return nil, fmt.Errorf("config schema: %w", err)
	}
	s, err := c.Compile("config.schema.json")
	if err != nil {
		return nil, fmt.Errorf("config schema: %w", err)
	}
	compiled.Store(schema, s)
	return s, nil
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
	s, err := CompileConfigSchema(schema)
	if err != nil {
		return err
	}
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(config))
	if err != nil {
		return &ConfigError{Reason: "not valid JSON: " + err.Error()}
	}
	err = s.Validate(inst)
	var verr *jsonschema.ValidationError
	if !errors.As(err, &verr) {
		return err
	}
	leaf := firstLeaf(verr)
	key := strings.Join(leaf.InstanceLocation, ".")
	if ap, ok := leaf.ErrorKind.(*kind.AdditionalProperties); ok && len(ap.Properties) > 0 {
		if key != "" {
			key += "."
		}
		return &ConfigError{Key: key + ap.Properties[0], Reason: "unknown key"}
	}
	return &ConfigError{Key: key, Reason: leaf.ErrorKind.LocalizedString(message.NewPrinter(language.English))}
}

func firstLeaf(e *jsonschema.ValidationError) *jsonschema.ValidationError {
	for len(e.Causes) > 0 {
		e = e.Causes[0]
	}
	return e
}
