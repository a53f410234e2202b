package controller

import (
	"k8s.io/apimachinery/pkg/util/validation"

	clusterv1 "krane.dev/proto/krane/cluster/v1"
	"krane.dev/sdk"
	"krane.dev/sdk/kube"
)

// Limits on desired state. They are far above what a routing proxy needs and
// exist so that a typo in ctrl (replicas 10000, memory in bytes instead of
// MiB) is refused with a clear error instead of starving a cluster.
const (
	MaxReplicas      = 100
	MaxCPUMillicores = 64_000  // 64 cores
	MaxMemoryMiB     = 262_144 // 256 GiB
	// maxK8sNameLen leaves room for the "-gossip" suffix within the 63
	// characters of a Service name.
	maxK8sNameLen = 63 - len(gossipSuffix)
)

// validate checks a decoded sentinel before anything reaches the cluster.
// Errors are permanent and name the field: retrying cannot fix them.
func validate(id string, s *clusterv1.Sentinel) error {
	if s.GetId() != id {
		return sdk.InvalidField("id", "spec id %q differs from the change's id %q", s.GetId(), id)
	}
	if errs := validation.IsDNS1035Label(s.GetK8SName()); len(errs) > 0 {
		return sdk.InvalidField("k8s_name", "%q: %s", s.GetK8SName(), errs[0])
	}
	if len(s.GetK8SName()) > maxK8sNameLen {
		return sdk.InvalidField("k8s_name", "%q is %d characters; at most %d leave room for the %q suffix of the gossip Service", s.GetK8SName(), len(s.GetK8SName()), maxK8sNameLen, gossipSuffix)
	}
	for _, f := range []struct{ name, value string }{
		{"id", s.GetId()},
		{"workspace_id", s.GetWorkspaceId()},
		{"project_id", s.GetProjectId()},
		{"app_id", s.GetAppId()},
		{"environment_id", s.GetEnvironmentId()},
	} {
		if err := labelValue(f.name, f.value); err != nil {
			return err
		}
	}
	if err := kube.ValidateImage("image", s.GetImage()); err != nil {
		return err
	}
	if r := s.GetReplicas(); r < 0 || r > MaxReplicas {
		return sdk.InvalidField("replicas", "%d is outside 0..%d", r, MaxReplicas)
	}
	if c := s.GetCpuMillicores(); c <= 0 || c > MaxCPUMillicores {
		return sdk.InvalidField("cpu_millicores", "%d is outside 1..%d", c, MaxCPUMillicores)
	}
	if mem := s.GetMemoryMib(); mem <= 0 || mem > MaxMemoryMiB {
		return sdk.InvalidField("memory_mib", "%d is outside 1..%d", mem, MaxMemoryMiB)
	}
	return nil
}

// labelValue checks an id that becomes a label value (and a selector term,
// so it may not be empty).
func labelValue(field, v string) error {
	if v == "" {
		return sdk.InvalidField(field, "is empty; it labels and selects the sentinel's objects")
	}
	if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
		return sdk.InvalidField(field, "%q is not usable as a label value: %s", v, errs[0])
	}
	return nil
}
