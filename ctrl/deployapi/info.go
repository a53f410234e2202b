package deployapi

import (
	"google.golang.org/protobuf/types/known/timestamppb"

	"krane.dev/ctrl/store"
	ctrlv1 "krane.dev/proto/krane/ctrl/v1"
)

// info is the API view of a deployment; instances only when withInstances.
func info(d store.Deployment, regions []store.RegionState, live, withInstances bool) *ctrlv1.DeploymentInfo {
	out := withLegacyFields(&ctrlv1.DeploymentInfo{
		Id: d.ID, WorkspaceId: d.WorkspaceID, ProjectId: d.ProjectID, EnvironmentId: d.EnvironmentID, AppId: d.AppID,
		Status: statusEnum(d.Status), Error: d.Error, Replicas: askedReplicas(d, regions), Workload: d.Workload,
		SecretEnvKeys: d.SecretEnvKeys, Live: live, RolledBackFrom: d.RolledBackFrom,
		CreatedAt: timestamppb.New(d.CreatedAt), UpdatedAt: timestamppb.New(d.UpdatedAt),
	})
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

// withLegacyFields is info with its workload also in the top-level fields
// clients of the previous release read (for one more release). It never
// grows: new workload fields are in info.workload only.
func withLegacyFields(info *ctrlv1.DeploymentInfo) *ctrlv1.DeploymentInfo {
	w := info.GetWorkload()
	//lint:ignore SA1019 legacy-workload: removed no earlier than v0.3.0 (docs/compatibility.md)
	info.Image, info.CpuMillicores, info.MemoryMib, info.Port = w.GetImage(), w.GetCpuMillicores(), w.GetMemoryMib(), w.GetPort()
	//lint:ignore SA1019 legacy-workload: removed no earlier than v0.3.0 (docs/compatibility.md)
	info.Command, info.EnvVars, info.Healthcheck, info.ShutdownSignal = w.GetCommand(), w.GetEnvVars(), w.GetHealthcheck(), w.GetShutdownSignal()
	return info
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

// history is a deployment's history (store.DeploymentEvents) as the API
// returns it.
func history(events []store.DeploymentEvent) []*ctrlv1.DeploymentEvent {
	out := make([]*ctrlv1.DeploymentEvent, len(events))
	for i, e := range events {
		out[i] = &ctrlv1.DeploymentEvent{Status: statusEnum(e.Status), Message: e.Message, At: timestamppb.New(e.At)}
	}
	return out
}

// statusEnum is a deployments.status value in the API's enum.
func statusEnum(s string) ctrlv1.DeploymentStatus {
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
