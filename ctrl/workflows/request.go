package workflows

import "krane.dev/ctrl/deployspec"

// DeployRequest is the input of DeployWorkflow's Run handler. The workflow's
// key is the deployment's id.
type DeployRequest struct {
	Deployment deployspec.Spec `json:"deployment"`
	// Regions to run in; empty means every region with a registered
	// cluster.
	Regions []string `json:"regions,omitempty"`
	// TimeoutSeconds bounds the wait for every region to run; 0 means
	// ctrl's deploy.timeout.
	TimeoutSeconds int32 `json:"timeout_seconds,omitempty"`
	// Note is the first entry of the deployment's history when the
	// workflow creates the row (e.g. "rollback of dep_x").
	Note string `json:"note,omitempty"`
}

func (r DeployRequest) validate(key string) error {
	if r.Deployment.ID != key {
		return deployspec.Errorf("deployment.id", "%q differs from the workflow's key %q (start the workflow with the deployment id as its key)", r.Deployment.ID, key)
	}
	if err := r.Deployment.Validate(); err != nil {
		return err
	}
	if err := deployspec.ValidRegions("regions", r.Regions); err != nil {
		return err
	}
	if r.TimeoutSeconds < 0 || r.TimeoutSeconds > deployspec.MaxTimeout {
		return deployspec.Errorf("timeout_seconds", "%d is out of range 0..%d", r.TimeoutSeconds, deployspec.MaxTimeout)
	}
	return nil
}
