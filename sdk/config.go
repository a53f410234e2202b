package sdk

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
)

// DecodeConfig decodes a config block into v (a pointer to a struct with json
// tags), rejecting unknown keys and wrong types with a [*ConfigError] naming
// the key. An empty block leaves v unchanged, so set defaults before calling.
func DecodeConfig(raw json.RawMessage, v any) error {
	if len(bytes.TrimSpace(raw)) == 0 {
		return nil
	}
	if err := decodeStrictJSON(raw, v); err != nil {
		return toConfigError(err)
	}
	return nil
}

func decodeStrictJSON(raw []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("trailing data after the JSON object")
	}
	return nil
}

func toConfigError(err error) error {
	var typeErr *json.UnmarshalTypeError
	if errors.As(err, &typeErr) {
		return &ConfigError{Key: typeErr.Field, Reason: fmt.Sprintf("got %s, want %s", typeErr.Value, typeErr.Type)}
	}
	// encoding/json reports unknown keys only as text: `json: unknown field "x"`.
	if msg := err.Error(); strings.HasPrefix(msg, `json: unknown field "`) {
		return &ConfigError{Key: strings.TrimSuffix(strings.TrimPrefix(msg, `json: unknown field "`), `"`), Reason: "unknown key"}
	}
	return &ConfigError{Reason: err.Error()}
}
