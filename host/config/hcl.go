package config

import (
	"errors"
	"fmt"

	"github.com/knadh/koanf/parsers/hcl"
)

// hclParser is koanf's HCL (v1) parser plus the normalisation it lacks:
// HCL v1 decodes every block into a list of maps, so two `controller "x" {}`
// blocks come out as [{x: [{...}]}, {y: [{...}]}]; koanf's own flattening
// only unwraps one-element lists, which leaves such configs unusable.
type hclParser struct{}

func (hclParser) Unmarshal(b []byte) (_ map[string]any, err error) {
	// The HCL v1 parser panics on some malformed input (found by FuzzLoad,
	// e.g. `{"\0`); a bad file must be an error, never a crash of a running
	// agent on reload.
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("not valid HCL or JSON (parser failed: %v)", r)
		}
	}()
	m, err := hcl.Parser(false).Unmarshal(b)
	if err != nil {
		return nil, err
	}
	out, err := normalize("", m)
	if err != nil {
		return nil, err
	}
	return out.(map[string]any), nil
}

func (hclParser) Marshal(map[string]any) ([]byte, error) {
	return nil, errors.New("writing HCL is not supported")
}

// normalize turns HCL v1's block lists back into what the file says. HCL v1
// decodes blocks as []map[string]any and list attributes as []any, so the
// two never mix:
//   - a single block (one-element block list) becomes its map;
//   - labelled blocks (controller "a" {} controller "b" {}) become one map
//     keyed by label; a label used twice is an error;
//   - repeated unlabelled blocks (rule {} rule {}) stay a list of maps;
//   - list attributes stay lists, their elements normalised.
//
// A single unlabelled block meant as a one-element list reads as a map;
// plugin config blocks resolve that with the plugin's schema (coerceToSchema).
func normalize(path string, v any) (any, error) {
	switch t := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(t))
		for k, x := range t {
			n, err := normalize(join(path, k), x)
			if err != nil {
				return nil, err
			}
			out[k] = n
		}
		return out, nil
	case []map[string]any:
		return normalizeBlocks(path, t)
	case []any:
		out := make([]any, len(t))
		for i, x := range t {
			n, err := normalize(fmt.Sprintf("%s[%d]", path, i), x)
			if err != nil {
				return nil, err
			}
			out[i] = n
		}
		return out, nil
	}
	return v, nil
}

func normalizeBlocks(path string, blocks []map[string]any) (any, error) {
	if len(blocks) == 1 {
		return normalize(path, blocks[0])
	}
	labelled := true
	for _, b := range blocks {
		if len(b) != 1 || !isBlockList(onlyValue(b)) {
			labelled = false
			break
		}
	}
	if labelled {
		merged := map[string]any{}
		for _, b := range blocks {
			for label, body := range b {
				if _, dup := merged[label]; dup {
					return nil, fmt.Errorf("%s: block %q is defined twice", orRoot(path), label)
				}
				n, err := normalize(join(path, label), body)
				if err != nil {
					return nil, err
				}
				merged[label] = n
			}
		}
		return merged, nil
	}
	out := make([]any, len(blocks))
	for i, b := range blocks {
		n, err := normalize(fmt.Sprintf("%s[%d]", path, i), b)
		if err != nil {
			return nil, err
		}
		out[i] = n
	}
	return out, nil
}

func isBlockList(v any) bool {
	_, ok := v.([]map[string]any)
	return ok
}

func onlyValue(m map[string]any) any {
	for _, v := range m {
		return v
	}
	return nil
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func orRoot(path string) string {
	if path == "" {
		return "(top level)"
	}
	return path
}
