package deployspec

import (
	"bytes"
	"encoding/json"
	"fmt"

	"google.golang.org/protobuf/encoding/protojson"

	clusterv1 "krane.dev/proto/krane/cluster/v1"
)

// The JSON of a Spec (the deploy workflow journals it) carries the
// workload as its protojson form (proto field names) under "workload".
// A Spec journaled by the previous release had the workload's fields at
// its top level under the same names; such a Spec reads back with them as
// its workload, so a deploy in flight across an upgrade keeps its
// workload.

// specJSON is Spec without its methods.
type specJSON Spec

// MarshalJSON writes the spec with its workload in protojson.
func (s Spec) MarshalJSON() ([]byte, error) {
	var w json.RawMessage
	if s.Workload != nil {
		var err error
		if w, err = (protojson.MarshalOptions{UseProtoNames: true}).Marshal(s.Workload); err != nil {
			return nil, fmt.Errorf("deployment %s: encode its workload: %w", s.ID, err)
		}
	}
	return json.Marshal(struct {
		specJSON
		Workload json.RawMessage `json:"workload,omitempty"`
	}{specJSON(s), w})
}

// UnmarshalJSON reads what MarshalJSON writes, and the previous release's
// form (no "workload": its fields at the top level).
func (s *Spec) UnmarshalJSON(b []byte) error {
	var v struct {
		specJSON
		Workload json.RawMessage `json:"workload"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*s = Spec(v.specJSON)
	raw, opts := v.Workload, protojson.UnmarshalOptions{}
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		raw, opts.DiscardUnknown = b, true
	}
	s.Workload = &clusterv1.Workload{}
	if err := opts.Unmarshal(raw, s.Workload); err != nil {
		return fmt.Errorf("deployment %s: its workload: %w", s.ID, err)
	}
	return nil
}
