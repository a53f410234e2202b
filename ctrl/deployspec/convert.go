package deployspec

import (
	"google.golang.org/protobuf/types/known/timestamppb"

	"krane.dev/ctrl/store"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
	ctrlv1 "krane.dev/proto/krane/ctrl/v1"
)

// The conversions between the deployment's forms: the operators' API
// (krane.ctrl.v1), the journaled Spec, the deployments row (store) and the
// cluster wire types (krane.cluster.v1).

// Defaults of a deployment's size when a request leaves them 0.
const (
	DefaultReplicas      = 1
	DefaultCPUMillicores = 250
	DefaultMemoryMiB     = 256
	DefaultPort          = 8080
)

// FromCreateRequest is the spec a CreateDeployment request asks for, as
// deployment id (defaults filled in; not validated, and without secrets:
// the API seals those for the id).
func FromCreateRequest(id string, req *ctrlv1.CreateDeploymentRequest) Spec {
	return Spec{
		ID: id, WorkspaceID: req.GetWorkspaceId(), ProjectID: req.GetProjectId(), EnvironmentID: req.GetEnvironmentId(), AppID: req.GetAppId(),
		K8sName: K8sName(id), K8sNamespace: Namespace(req.GetWorkspaceId()),
		Image: req.GetImage(), Replicas: or(req.GetReplicas(), DefaultReplicas), CPUMillicores: or(req.GetCpuMillicores(), DefaultCPUMillicores),
		MemoryMiB: or(req.GetMemoryMib(), DefaultMemoryMiB), EnvVars: req.GetEnvVars(), Healthcheck: HealthcheckFromProto(req.GetHealthcheck()),
		Port: or(req.GetPort(), DefaultPort), Command: req.GetCommand(), ShutdownSignal: req.GetShutdownSignal(),
	}
}

func or[T int32 | int64](v, def T) T {
	if v == 0 {
		return def
	}
	return v
}

// HealthcheckFromProto converts the wire form (nil stays nil).
func HealthcheckFromProto(h *clusterv1.Healthcheck) *Healthcheck {
	if h == nil {
		return nil
	}
	return &Healthcheck{Method: h.GetMethod(), Path: h.GetPath(), Port: h.GetPort(), InitialDelaySeconds: h.GetInitialDelaySeconds(),
		PeriodSeconds: h.GetPeriodSeconds(), TimeoutSeconds: h.GetTimeoutSeconds(), FailureThreshold: h.GetFailureThreshold()}
}

// Proto converts to the wire form (nil stays nil).
func (h *Healthcheck) Proto() *clusterv1.Healthcheck {
	if h == nil {
		return nil
	}
	return &clusterv1.Healthcheck{Method: h.Method, Path: h.Path, Port: h.Port, InitialDelaySeconds: h.InitialDelaySeconds,
		PeriodSeconds: h.PeriodSeconds, TimeoutSeconds: h.TimeoutSeconds, FailureThreshold: h.FailureThreshold}
}

// FromStore is the spec of a stored deployment.
func FromStore(d store.Deployment) Spec {
	return Spec{
		ID: d.ID, WorkspaceID: d.WorkspaceID, ProjectID: d.ProjectID, EnvironmentID: d.EnvironmentID, AppID: d.AppID,
		K8sNamespace: d.K8sNamespace, K8sName: d.K8sName, Image: d.Image, CPUMillicores: d.CPUMillicores, MemoryMiB: d.MemoryMiB,
		Replicas: d.Replicas, EnvVars: d.EnvVars, EncryptedEnv: d.EncryptedEnv, SecretEnvKeys: d.SecretEnvKeys, Healthcheck: HealthcheckFromProto(d.Healthcheck),
		Port: d.Port, Command: d.Command, ShutdownSignal: d.ShutdownSignal, RolledBackFrom: d.RolledBackFrom,
	}
}

// Store is the spec as a deployments row (status pending).
func (s Spec) Store() store.Deployment {
	return store.Deployment{
		ID: s.ID, WorkspaceID: s.WorkspaceID, ProjectID: s.ProjectID, EnvironmentID: s.EnvironmentID, AppID: s.AppID,
		K8sNamespace: s.K8sNamespace, K8sName: s.K8sName, Image: s.Image, CPUMillicores: s.CPUMillicores, MemoryMiB: s.MemoryMiB,
		Replicas: s.Replicas, EnvVars: s.EnvVars, EncryptedEnv: s.EncryptedEnv, SecretEnvKeys: s.SecretEnvKeys, Healthcheck: s.Healthcheck.Proto(),
		Port: s.Port, Command: s.Command, ShutdownSignal: s.ShutdownSignal, RolledBackFrom: s.RolledBackFrom,
		Status: store.StatusPending,
	}
}

// Info is the API view of a deployment; instances only when withInstances.
func Info(d store.Deployment, regions []store.RegionState, live, withInstances bool) *ctrlv1.DeploymentInfo {
	out := &ctrlv1.DeploymentInfo{
		Id: d.ID, WorkspaceId: d.WorkspaceID, ProjectId: d.ProjectID, EnvironmentId: d.EnvironmentID, AppId: d.AppID,
		Image: d.Image, Status: StatusEnum(d.Status), Error: d.Error, Replicas: askedReplicas(d, regions), CpuMillicores: d.CPUMillicores,
		MemoryMib: d.MemoryMiB, Port: d.Port, Command: d.Command, EnvVars: d.EnvVars, SecretEnvKeys: d.SecretEnvKeys, Healthcheck: d.Healthcheck,
		Live: live, RolledBackFrom: d.RolledBackFrom, ShutdownSignal: d.ShutdownSignal,
		CreatedAt: timestamppb.New(d.CreatedAt), UpdatedAt: timestamppb.New(d.UpdatedAt),
	}
	for _, r := range regions {
		rs := &ctrlv1.RegionStatus{Region: r.Region, DesiredReplicas: r.DesiredReplicas, DesiredStatus: r.DesiredStatus,
			Running: r.Running, Pending: r.Pending, Failed: r.Failed}
		if withInstances {
			for _, in := range r.Instances {
				rs.Instances = append(rs.Instances, &ctrlv1.InstanceInfo{K8SName: in.K8sName, Address: in.Address, Status: in.Status,
					Reason: in.Reason, Message: in.Message, ClusterId: in.ClusterID})
			}
		}
		out.Regions = append(out.Regions, rs)
	}
	return out
}

// askedReplicas is what the deployment's clusters are asked to run per
// region now: the topology's count (a scale changes it), none once every
// region is stopped. Before the deploy has written its regions, the count
// it will ask for.
func askedReplicas(d store.Deployment, regions []store.RegionState) int32 {
	if len(regions) == 0 {
		return d.Replicas
	}
	var n int32
	for _, r := range regions {
		if r.DesiredStatus == "running" && r.DesiredReplicas > n {
			n = r.DesiredReplicas
		}
	}
	return n
}

// History is a deployment's history (store.DeploymentEvents) as the API
// returns it.
func History(events []store.DeploymentEvent) []*ctrlv1.DeploymentEvent {
	out := make([]*ctrlv1.DeploymentEvent, len(events))
	for i, e := range events {
		out[i] = &ctrlv1.DeploymentEvent{Status: StatusEnum(e.Status), Message: e.Message, At: timestamppb.New(e.At)}
	}
	return out
}

// StatusEnum is a deployments.status value in the API's enum.
func StatusEnum(s string) ctrlv1.DeploymentStatus {
	switch s {
	case store.StatusPending:
		return ctrlv1.DeploymentStatus_DEPLOYMENT_STATUS_PENDING
	case store.StatusDeploying:
		return ctrlv1.DeploymentStatus_DEPLOYMENT_STATUS_DEPLOYING
	case store.StatusNetwork:
		return ctrlv1.DeploymentStatus_DEPLOYMENT_STATUS_NETWORK
	case store.StatusReady:
		return ctrlv1.DeploymentStatus_DEPLOYMENT_STATUS_READY
	case store.StatusFailed:
		return ctrlv1.DeploymentStatus_DEPLOYMENT_STATUS_FAILED
	case store.StatusStopped:
		return ctrlv1.DeploymentStatus_DEPLOYMENT_STATUS_STOPPED
	}
	return ctrlv1.DeploymentStatus_DEPLOYMENT_STATUS_UNSPECIFIED
}
