package sdk

import (
	"encoding/json"
	"fmt"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
)

// Spec is a kind's payload as it travels from ctrl: a proto message of the
// kind's SpecType, or a google.protobuf.Struct for JSON specs.
type Spec struct {
	// TypeURL is "type.googleapis.com/<full message name>".
	TypeURL string
	Value   []byte
}

// IsZero reports whether the spec is empty (as for deletes).
func (s Spec) IsZero() bool { return s.TypeURL == "" && len(s.Value) == 0 }

// Decode unmarshals the spec into m. It fails with a permanent error when the
// spec holds another message type or is malformed.
func (s Spec) Decode(m proto.Message) error {
	want := string(m.ProtoReflect().Descriptor().FullName())
	if got := typeName(s.TypeURL); got != want {
		return Permanent(fmt.Errorf("spec is a %q, want %q", got, want))
	}
	if err := proto.Unmarshal(s.Value, m); err != nil {
		return Permanent(fmt.Errorf("decode %s spec: %w", want, err))
	}
	return nil
}

// DecodeJSON decodes a google.protobuf.Struct spec into v with
// encoding/json, rejecting unknown fields.
func (s Spec) DecodeJSON(v any) error {
	var st structpb.Struct
	if err := s.Decode(&st); err != nil {
		return err
	}
	raw, err := protojson.Marshal(&st)
	if err != nil {
		return Permanent(fmt.Errorf("re-encode spec as JSON: %w", err))
	}
	if err := decodeStrictJSON(raw, v); err != nil {
		return Permanent(fmt.Errorf("decode spec: %w", err))
	}
	return nil
}

// SpecOf packs a proto message into a Spec (used by tests and the host).
func SpecOf(m proto.Message) (Spec, error) {
	a, err := anypb.New(m)
	if err != nil {
		return Spec{}, err
	}
	return Spec{TypeURL: a.TypeUrl, Value: a.Value}, nil
}

// JSONSpec packs a JSON-encodable value as a google.protobuf.Struct spec.
func JSONSpec(v any) (Spec, error) {
	st, err := toStruct(v)
	if err != nil {
		return Spec{}, err
	}
	return SpecOf(st)
}

// JSONStatus packs a JSON-encodable value as a status message for kinds
// whose status is JSON.
func JSONStatus(v any) (proto.Message, error) { return toStruct(v) }

func toStruct(v any) (*structpb.Struct, error) {
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	st := &structpb.Struct{}
	if err := protojson.Unmarshal(raw, st); err != nil {
		return nil, fmt.Errorf("value is not a JSON object: %w", err)
	}
	return st, nil
}

func typeName(typeURL string) string {
	for i := len(typeURL) - 1; i >= 0; i-- {
		if typeURL[i] == '/' {
			return typeURL[i+1:]
		}
	}
	return typeURL
}
