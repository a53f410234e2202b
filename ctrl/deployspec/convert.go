package deployspec

import (
	"google.golang.org/protobuf/proto"

	clusterv1 "krane.dev/proto/krane/cluster/v1"
	ctrlv1 "krane.dev/proto/krane/ctrl/v1"
)

// A deployment's workload is one message (krane.cluster.v1.Workload) from
// the operators' request through the journaled Spec and the store's
// document to the cluster wire; this file fills its defaults and reads
// the request's older top-level form.

// Defaults of a deployment's size and port when a request leaves them 0.
const (
	DefaultReplicas       = 1
	DefaultCPUMillicores  = 250
	DefaultMemoryMiB      = 256
	DefaultPort           = 8080
	DefaultShutdownSignal = "SIGTERM"
)

// FromCreateRequest is the spec a CreateDeployment request asks for, as
// deployment id (defaults filled in; not validated, and without secrets:
// the API seals those for the id). A request sets its workload either in
// workload or in the top-level fields of the previous release, not both.
func FromCreateRequest(id string, req *ctrlv1.CreateDeploymentRequest) (Spec, error) {
	w := req.GetWorkload()
	legacy := legacyWorkload(req)
	switch {
	case w != nil && proto.Size(legacy) > 0:
		return Spec{}, Errorf("workload", "set either workload or the top-level image, cpu_millicores, memory_mib, env_vars, healthcheck, port, command and shutdown_signal, not both")
	case w == nil:
		w = legacy
	}
	return Spec{
		ID: id, WorkspaceID: req.GetWorkspaceId(), ProjectID: req.GetProjectId(), EnvironmentID: req.GetEnvironmentId(), AppID: req.GetAppId(),
		K8sName: K8sName(id), K8sNamespace: Namespace(req.GetWorkspaceId()),
		Replicas: or(req.GetReplicas(), DefaultReplicas), Workload: WithDefaults(w),
	}, nil
}

// legacyWorkload is the workload in a request's top-level fields (the
// previous release's form, accepted for one more release). It never
// grows: new workload fields are set in workload only.
func legacyWorkload(req *ctrlv1.CreateDeploymentRequest) *clusterv1.Workload {
	return &clusterv1.Workload{
		//lint:ignore SA1019 legacy-workload: removed no earlier than v0.3.0 (docs/compatibility.md)
		Image: req.GetImage(), Command: req.GetCommand(), EnvVars: req.GetEnvVars(), CpuMillicores: req.GetCpuMillicores(),
		//lint:ignore SA1019 legacy-workload: removed no earlier than v0.3.0 (docs/compatibility.md)
		MemoryMib: req.GetMemoryMib(), Port: req.GetPort(), Healthcheck: req.GetHealthcheck(), ShutdownSignal: req.GetShutdownSignal(),
	}
}

// WithDefaults is a copy of w with the defaults of what it leaves 0: CPU,
// memory, port and shutdown signal.
func WithDefaults(w *clusterv1.Workload) *clusterv1.Workload {
	out := proto.CloneOf(w)
	if out == nil {
		out = &clusterv1.Workload{}
	}
	out.CpuMillicores = or(out.GetCpuMillicores(), DefaultCPUMillicores)
	out.MemoryMib = or(out.GetMemoryMib(), DefaultMemoryMiB)
	out.Port = or(out.GetPort(), DefaultPort)
	if out.GetShutdownSignal() == "" {
		out.ShutdownSignal = DefaultShutdownSignal
	}
	return out
}

func or[T int32 | int64](v, def T) T {
	if v == 0 {
		return def
	}
	return v
}
