package config

import "encoding/json"

// coerceToSchema resolves HCL v1's one ambiguity in plugin config blocks:
// a one-element list of objects and a single block read the same, so where
// the plugin's schema wants an array and the block holds an object, the
// object is wrapped in a list. Only "properties" and "items" are followed;
// anything the schema does not describe is left as written.
func coerceToSchema(v any, schema string) any {
	var s map[string]any
	if json.Unmarshal([]byte(schema), &s) != nil {
		return v
	}
	return coerce(v, s)
}

func coerce(v any, s map[string]any) any {
	if s == nil {
		return v
	}
	if s["type"] == "array" {
		if m, ok := v.(map[string]any); ok {
			v = []any{m}
		}
		if list, ok := v.([]any); ok {
			items, _ := s["items"].(map[string]any)
			for i := range list {
				list[i] = coerce(list[i], items)
			}
		}
		return v
	}
	if m, ok := v.(map[string]any); ok {
		props, _ := s["properties"].(map[string]any)
		for k, x := range m {
			sub, _ := props[k].(map[string]any)
			m[k] = coerce(x, sub)
		}
	}
	return v
}
