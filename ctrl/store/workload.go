package store

import (
	"encoding/json"
	"fmt"

	"google.golang.org/protobuf/encoding/protojson"

	clusterv1 "krane.dev/proto/krane/cluster/v1"
)

// A deployment's workload (krane.cluster.v1.Workload) is one JSON
// document in deployments.workload: {"version": 1, "workload": {...}},
// the workload in protojson with proto field names. A field added to the
// message is stored, read and streamed with no change here and no
// migration; version changes only if a field ever changes its meaning,
// with a migration that rewrites the documents.
const workloadDocVersion = 1

type workloadDoc struct {
	Version  int             `json:"version"`
	Workload json.RawMessage `json:"workload"`
}

// encodeWorkload is the deployments.workload document of w (text: MySQL 8
// refuses binary strings in JSON columns).
func encodeWorkload(w *clusterv1.Workload) (string, error) {
	if w == nil {
		w = &clusterv1.Workload{}
	}
	b, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(w)
	if err != nil {
		return "", err
	}
	doc, err := json.Marshal(workloadDoc{Version: workloadDocVersion, Workload: b})
	return string(doc), err
}

// decodeWorkload reads a deployments.workload document. A document of
// another version, or with a field this ctrl does not know, was written
// by a newer ctrl: it is refused rather than streamed without the field.
func decodeWorkload(id string, doc []byte) (*clusterv1.Workload, error) {
	var d workloadDoc
	if err := json.Unmarshal(doc, &d); err != nil {
		return nil, fmt.Errorf("deployments.workload of %s is not a workload document: %w", id, err)
	}
	if d.Version != workloadDocVersion {
		return nil, fmt.Errorf("deployments.workload of %s is version %d; this ctrl reads version %d (a newer ctrl wrote it: upgrade this one)",
			id, d.Version, workloadDocVersion)
	}
	w := &clusterv1.Workload{}
	if err := protojson.Unmarshal(d.Workload, w); err != nil {
		return nil, fmt.Errorf("deployments.workload of %s: %w (a field this ctrl does not know was written by a newer ctrl: upgrade this one)", id, err)
	}
	return w, nil
}

// withLegacyFields is d with its workload also in the top-level fields
// plugins of the previous release read (for one more release). It never
// grows: new workload fields reach plugins in d.workload only.
func withLegacyFields(d *clusterv1.Deployment) *clusterv1.Deployment {
	w := d.GetWorkload()
	//lint:ignore SA1019 legacy-workload: removed no earlier than v0.3.0 (docs/compatibility.md)
	d.Image, d.CpuMillicores, d.MemoryMib, d.EnvVars = w.GetImage(), w.GetCpuMillicores(), w.GetMemoryMib(), w.GetEnvVars()
	//lint:ignore SA1019 legacy-workload: removed no earlier than v0.3.0 (docs/compatibility.md)
	d.Healthcheck, d.Port, d.Command, d.ShutdownSignal = w.GetHealthcheck(), w.GetPort(), w.GetCommand(), w.GetShutdownSignal()
	return d
}
