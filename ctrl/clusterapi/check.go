package clusterapi

import (
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	clusterv1 "krane.dev/proto/krane/cluster/v1"
)

// Limits of a status report, checked before anything is stored: a report
// past one is refused with InvalidArgument naming the field (the rest of a
// batch still lands), never with the database's "data too long", which
// would read as "retry". The limits fit the columns the values go to, and
// are documented on the messages in proto/krane/cluster/v1/cluster.proto.
const (
	MaxReportIDBytes        = 253 // report id
	MaxK8sNameBytes         = 253 // Kubernetes object names
	MaxAddressBytes         = 255 // Instance.address
	MaxInstanceReasonBytes  = 255 // Instance.reason
	MaxInstanceMessageBytes = 4096
	MaxZoneBytes            = 64
	MaxInstances            = 10_000 // DeploymentStatus.instances
	MaxRunningImageBytes    = 512
	MaxHealthReasonBytes    = 1024 // SentinelStatus.reason
	MaxPolicyMessageBytes   = 16 << 10
	MaxApplyErrorBytes      = 16 << 10 // ApplyError.message
	MaxApplyErrorFieldBytes = 255
	MaxGenericStatusBytes   = 256 << 10 // a generic kind's status, as JSON
	// MaxClockSkew is how far in the future of ctrl's clock observed_at may
	// be. A later time would make the cluster's own next reports look
	// older than the last accepted one.
	MaxClockSkew = time.Hour
)

// invalidField is InvalidArgument for one field: "field: reason".
func invalidField(field, format string, args ...any) error {
	return status.Error(codes.InvalidArgument, field+": "+fmt.Sprintf(format, args...))
}

func checkLen(field, v string, max int) error {
	if len(v) > max {
		return invalidField(field, "%d bytes; at most %d", len(v), max)
	}
	return nil
}

func checkCount[T int32 | int64](field string, v T) error {
	if v < 0 {
		return invalidField(field, "%d is negative", v)
	}
	return nil
}

// checkObservedAt refuses a time that is not one (nanos out of range), is
// before 1970, or is more than MaxClockSkew ahead of now. A missing time is
// fine: the report counts as observed when it arrived.
func checkObservedAt(field string, at *timestamppb.Timestamp, now time.Time) error {
	if at == nil {
		return nil
	}
	if err := at.CheckValid(); err != nil {
		return invalidField(field, "not a valid time: %v", err)
	}
	t := at.AsTime()
	if t.Before(time.Unix(0, 0)) {
		return invalidField(field, "%s is before 1970", t.Format(time.RFC3339))
	}
	if t.After(now.Add(MaxClockSkew)) {
		return invalidField(field, "%s is more than %s ahead of ctrl's clock (%s): fix the cluster's clock", t.Format(time.RFC3339), MaxClockSkew, now.UTC().Format(time.RFC3339))
	}
	return nil
}

// checkApplyError checks an apply error's fields (its version is checked
// against the object's when it is stored).
func checkApplyError(ae *clusterv1.ApplyError) error {
	if ae == nil {
		return nil
	}
	if err := checkLen("apply_error.message", ae.GetMessage(), MaxApplyErrorBytes); err != nil {
		return err
	}
	return checkLen("apply_error.field", ae.GetField(), MaxApplyErrorFieldBytes)
}

// checkStatus checks every field of a built-in kind's status; prefix names
// the status in the request ("status").
func checkStatus(prefix string, msg proto.Message) error {
	f := func(name string) string { return prefix + "." + name }
	switch st := msg.(type) {
	case *clusterv1.DeploymentStatus:
		for _, c := range []struct {
			name string
			v    int32
		}{{"desired_replicas", st.GetDesiredReplicas()}, {"ready_replicas", st.GetReadyReplicas()}, {"available_replicas", st.GetAvailableReplicas()}} {
			if err := checkCount(f(c.name), c.v); err != nil {
				return err
			}
		}
		if err := checkLen(f("k8s_name"), st.GetK8SName(), MaxK8sNameBytes); err != nil {
			return err
		}
		if n := len(st.GetInstances()); n > MaxInstances {
			return invalidField(f("instances"), "%d instances; at most %d", n, MaxInstances)
		}
		for i, in := range st.GetInstances() {
			if err := checkInstance(fmt.Sprintf("%s.instances[%d]", prefix, i), in); err != nil {
				return err
			}
		}
	case *clusterv1.SentinelStatus:
		for _, c := range []struct {
			name string
			v    int32
		}{{"desired_replicas", st.GetDesiredReplicas()}, {"available_replicas", st.GetAvailableReplicas()},
			{"updated_replicas", st.GetUpdatedReplicas()}, {"ready_replicas", st.GetReadyReplicas()}} {
			if err := checkCount(f(c.name), c.v); err != nil {
				return err
			}
		}
		if err := checkCount(f("observed_generation"), st.GetObservedGeneration()); err != nil {
			return err
		}
		if _, ok := clusterv1.Health_name[int32(st.GetHealth())]; !ok {
			return invalidField(f("health"), "%d is not a krane.cluster.v1.Health value", st.GetHealth())
		}
		for _, c := range []struct {
			name string
			v    string
			max  int
		}{{"k8s_name", st.GetK8SName(), MaxK8sNameBytes}, {"running_image", st.GetRunningImage(), MaxRunningImageBytes}, {"reason", st.GetReason(), MaxHealthReasonBytes}} {
			if err := checkLen(f(c.name), c.v, c.max); err != nil {
				return err
			}
		}
	case *clusterv1.CiliumNetworkPolicyStatus:
		return checkLen(f("message"), st.GetMessage(), MaxPolicyMessageBytes)
	}
	return nil
}

func checkInstance(prefix string, in *clusterv1.Instance) error {
	f := func(name string) string { return prefix + "." + name }
	if in.GetK8SName() == "" {
		return invalidField(f("k8s_name"), "empty: every instance needs its pod's name")
	}
	for _, c := range []struct {
		name string
		v    string
		max  int
	}{{"k8s_name", in.GetK8SName(), MaxK8sNameBytes}, {"address", in.GetAddress(), MaxAddressBytes}, {"reason", in.GetReason(), MaxInstanceReasonBytes},
		{"message", in.GetMessage(), MaxInstanceMessageBytes}, {"zone", in.GetZone(), MaxZoneBytes}} {
		if err := checkLen(f(c.name), c.v, c.max); err != nil {
			return err
		}
	}
	if err := checkCount(f("cpu_millicores"), in.GetCpuMillicores()); err != nil {
		return err
	}
	if err := checkCount(f("memory_mib"), in.GetMemoryMib()); err != nil {
		return err
	}
	if _, ok := clusterv1.Instance_Status_name[int32(in.GetStatus())]; !ok {
		return invalidField(f("status"), "%d is not a krane.cluster.v1.Instance.Status value", in.GetStatus())
	}
	return nil
}
