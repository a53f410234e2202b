package sdk

import (
	"errors"
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
