package sdk_test

import (
	"errors"
	"strings"
	"testing"

	"krane.dev/sdk"
)

type schemaSpec struct {
	Namespace string            `json:"namespace" jsonschema:"required,pattern=^[a-z0-9]([-a-z0-9]*[a-z0-9])?$,maxLength=63"`
	Name      string            `json:"name" jsonschema:"required,minLength=1"`
	Replicas  int32             `json:"replicas,omitempty" jsonschema:"minimum=0,maximum=10"`
	Labels    map[string]string `json:"labels,omitempty"`
	Ports     []schemaPort      `json:"ports,omitempty"`
	//lint:ignore U1000 an unexported field, which the schema must leave out
	internal string
}

type schemaPort struct {
	Port int32  `json:"port" jsonschema:"required,minimum=1,maximum=65535"`
	Name string `json:"name,omitempty"`
}

// TestSchemaForIsStrictAndFollowsTheTags: the schema generated from a Go
// type accepts what the type decodes, and refuses, naming the field, an
// unknown key (nested ones too), a missing required field, a wrong type and
// a value outside a tag's bound.
func TestSchemaForIsStrictAndFollowsTheTags(t *testing.T) {
	schema, err := sdk.SchemaFor[schemaSpec]()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(schema, `"$schema": "https://json-schema.org/draft/2020-12/schema"`) || strings.Contains(schema, "$defs") || strings.Contains(schema, "internal") {
		t.Errorf("schema:\n%s\nwant draft 2020-12, nested types inlined, unexported fields left out", schema)
	}
	if err := sdk.ValidateJSON(schema, []byte(`{"namespace": "team-a", "name": "web", "replicas": 3, "labels": {"a": "b"}, "ports": [{"port": 8080, "name": "http"}]}`)); err != nil {
		t.Errorf("a valid spec refused: %v", err)
	}
	for doc, pointer := range map[string]string{
		`{"namespace": "team-a", "name": "web", "replica": 3}`:                        "/replica",
		`{"namespace": "team-a", "name": "web", "ports": [{"port": 80, "prot": 80}]}`: "/ports/0/prot",
		`{"namespace": "team-a"}`:                                        "/name",
		`{"namespace": "Team_A", "name": "web"}`:                         "/namespace",
		`{"namespace": "team-a", "name": ""}`:                            "/name",
		`{"namespace": "team-a", "name": "web", "replicas": 11}`:         "/replicas",
		`{"namespace": "team-a", "name": "web", "replicas": "3"}`:        "/replicas",
		`{"namespace": "team-a", "name": "web", "ports": [{"port": 0}]}`: "/ports/0/port",
	} {
		err := sdk.ValidateJSON(schema, []byte(doc))
		var se *sdk.SchemaError
		if !errors.As(err, &se) || se.Pointer != pointer {
			t.Errorf("%s: %v, want a *SchemaError at %s", doc, err, pointer)
		}
	}
}

type badPattern struct {
	Name string `json:"name" jsonschema:"pattern=([a-z"`
}

// TestSchemaForRefusesABadTag: a tag that makes no valid schema is an
// error (MustSchemaFor panics), not a schema that accepts everything.
func TestSchemaForRefusesABadTag(t *testing.T) {
	if _, err := sdk.SchemaFor[badPattern](); err == nil {
		t.Fatal("SchemaFor accepted an invalid pattern")
	}
	defer func() {
		if recover() == nil {
			t.Error("MustSchemaFor did not panic on an invalid pattern")
		}
	}()
	sdk.MustSchemaFor[badPattern]()
}
