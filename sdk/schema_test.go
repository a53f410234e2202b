package sdk

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const testSchema = `{
  "type": "object",
  "additionalProperties": false,
  "properties": {
    "namespace": {"type": "string", "pattern": "^[a-z0-9-]+$"},
    "probe": {"type": "object", "additionalProperties": false, "properties": {"path": {"type": "string"}}},
    "workers": {"type": "integer", "minimum": 1}
  }
}`

func TestValidateConfigNamesTheKey(t *testing.T) {
	cases := map[string]string{
		`{"namespace":"ok","workers":4,"probe":{"path":"/h"}}`: "",
		`{}`:                     "",
		`{"namspace":"typo"}`:    "namspace",
		`{"probe":{"pth":"/x"}}`: "probe.pth",
		`{"workers":"four"}`:     "workers",
		`{"workers":0}`:          "workers",
		`{"namespace":"Bad_NS"}`: "namespace",
	}
	for cfg, wantKey := range cases {
		err := ValidateConfig(testSchema, []byte(cfg))
		if wantKey == "" {
			if err != nil {
				t.Errorf("%s: unexpected error %v", cfg, err)
			}
			continue
		}
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.Key != wantKey {
			t.Errorf("%s: got %v, want a ConfigError for key %q", cfg, err, wantKey)
		}
	}
}

func TestDecodeConfigStrict(t *testing.T) {
	var cfg struct {
		Namespace string `json:"namespace"`
		Workers   int    `json:"workers"`
	}
	var ce *ConfigError
	if err := DecodeConfig([]byte(`{"namespace":"a","extra":1}`), &cfg); !errors.As(err, &ce) || ce.Key != "extra" {
		t.Errorf("unknown key: got %v", err)
	}
	if err := DecodeConfig([]byte(`{"workers":"x"}`), &cfg); !errors.As(err, &ce) || ce.Key != "workers" {
		t.Errorf("wrong type: got %v", err)
	}
	if err := DecodeConfig([]byte(`{"namespace":"a","workers":2}`), &cfg); err != nil || cfg.Workers != 2 {
		t.Errorf("valid: got %v %+v", err, cfg)
	}
}

// TestSchemasReadNothingOutsideThemselves: a $ref or $schema naming a
// file (absolute, or relative to the working directory) or a remote
// document is refused, naming it; nothing is read, and the error does not
// show the working directory unless the schema named it.
func TestSchemasReadNothingOutsideThemselves(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	for name, doc := range map[string]string{
		"other.json": `{"type": "string"}`,
		"meta.json":  `{"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": "meta.json"}`,
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(doc), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for schema, names := range map[string]string{
		`{"$ref": "other.json"}`:                                    "other.json",
		`{"properties": {"a": {"$ref": "./other.json#/type"}}}`:     "other.json",
		`{"$ref": "file://` + dir + `/other.json"}`:                 "other.json",
		`{"$ref": "file:///etc/passwd"}`:                            "/etc/passwd",
		`{"$schema": "meta.json"}`:                                  "meta.json",
		`{"$ref": "https://schemas.example.com/s.json"}`:            "https://schemas.example.com/s.json",
		`{"$id": "https://x.example/a.json", "$ref": "b.json"}`:     "https://x.example/b.json",
		`{"$defs": {"s": {"type": "string"}}, "$ref": "#/$defs/t"}`: "#/$defs/t",
	} {
		_, err := CompileSchema(schema)
		if err == nil {
			t.Errorf("%s: compiled", schema)
			continue
		}
		if !strings.Contains(err.Error(), names) || (strings.Contains(err.Error(), dir) && !strings.Contains(schema, dir)) {
			t.Errorf("%s: %v; want an error naming %s, without the working directory", schema, err, names)
		}
	}
	// References inside the schema, and the drafts' own meta-schemas, work.
	for _, schema := range []string{
		`{"$defs": {"s": {"type": "string"}}, "properties": {"a": {"$ref": "#/$defs/s"}}}`,
		`{"$schema": "http://json-schema.org/draft-07/schema#", "definitions": {"s": {"type": "string"}}, "properties": {"a": {"$ref": "#/definitions/s"}}}`,
		`{"$id": "https://x.example/a.json", "$defs": {"b": {"$id": "b.json", "type": "string"}}, "$ref": "b.json"}`,
	} {
		if _, err := CompileSchema(schema); err != nil {
			t.Errorf("%s: %v", schema, err)
		}
	}
}

// TestCompiledSchemaCacheIsBounded: however many distinct schemas are
// compiled (each registration of a kind may bring one), the cache keeps at
// most schemaCacheSize of them.
func TestCompiledSchemaCacheIsBounded(t *testing.T) {
	for i := range schemaCacheSize + 50 {
		if _, err := CompileSchema(fmt.Sprintf(`{"type": "object", "maxProperties": %d}`, i)); err != nil {
			t.Fatal(err)
		}
	}
	if n := compiledSchemas(); n > schemaCacheSize {
		t.Fatalf("%d compiled schemas cached, want at most %d", n, schemaCacheSize)
	}
}
