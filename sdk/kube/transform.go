package kube

import (
	"reflect"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/cache"
)

// Informer transforms that drop what a plugin never reads, so that its
// caches hold less. A transform runs once per object received, before the
// object is cached; a field it drops is gone for every reader of that
// cache, so check every read of the cached objects first. Drift compares
// the fields a plugin applies: never drop those (status is never applied).

// Chain runs transforms in order (e.g. StripManagedFields, then a Slim).
// informers.WithTransform keeps only the last transform given, so a factory
// that needs several takes their Chain.
func Chain(fns ...cache.TransformFunc) cache.TransformFunc {
	return func(obj any) (any, error) {
		var err error
		for _, fn := range fns {
			if obj, err = fn(obj); err != nil {
				return nil, err
			}
		}
		return obj, nil
	}
}

// Slim is a transform that calls fn on every object of type T (a pointer
// type such as *corev1.Pod) and passes objects of other types unchanged,
// so one transform serves a factory of several types. fn changes the
// object in place and must give the same result when run twice.
func Slim[T any](fn func(T)) cache.TransformFunc {
	return func(obj any) (any, error) {
		if t, ok := obj.(T); ok {
			fn(t)
		}
		return obj, nil
	}
}

// StripStatus is a transform that drops the status of every object: the
// Status field of a typed object, "status" of an unstructured one. For
// objects a plugin only compares with what it applies (Services,
// PodDisruptionBudgets, ...), whose status it never reads.
func StripStatus(obj any) (any, error) {
	switch o := obj.(type) {
	case *unstructured.Unstructured:
		delete(o.Object, "status")
	default:
		v := reflect.ValueOf(obj)
		if v.Kind() != reflect.Pointer || v.IsNil() || v.Elem().Kind() != reflect.Struct {
			return obj, nil
		}
		if f := v.Elem().FieldByName("Status"); f.IsValid() && f.CanSet() {
			f.SetZero()
		}
	}
	return obj, nil
}

// SlimPod keeps what a controller reads to report its pods (metadata but
// managedFields, node, each container's name, image, ports and resources,
// and the status: phase, reason, message, pod IP, the Ready and
// PodScheduled conditions, the containers' states) and drops the rest:
// environment, commands, probes, volumes, mounts, security contexts,
// affinity, tolerations, other conditions, image and container IDs.
// Pods are the most numerous objects a controller caches and the largest
// typed ones.
func SlimPod(p *corev1.Pod) {
	p.ManagedFields = nil
	p.Spec = corev1.PodSpec{
		NodeName:          p.Spec.NodeName,
		InitContainers:    slimContainers(p.Spec.InitContainers),
		Containers:        slimContainers(p.Spec.Containers),
		RuntimeClassName:  p.Spec.RuntimeClassName,
		PriorityClassName: p.Spec.PriorityClassName,
	}
	s := &p.Status
	var conds []corev1.PodCondition
	for _, c := range s.Conditions {
		if c.Type == corev1.PodReady || c.Type == corev1.PodScheduled {
			conds = append(conds, c)
		}
	}
	*s = corev1.PodStatus{
		Phase:                 s.Phase,
		Conditions:            conds,
		Message:               s.Message,
		Reason:                s.Reason,
		PodIP:                 s.PodIP,
		StartTime:             s.StartTime,
		InitContainerStatuses: slimStatuses(s.InitContainerStatuses),
		ContainerStatuses:     slimStatuses(s.ContainerStatuses),
	}
}

func slimContainers(cs []corev1.Container) []corev1.Container {
	if cs == nil {
		return nil
	}
	out := make([]corev1.Container, len(cs))
	for i, c := range cs {
		out[i] = corev1.Container{Name: c.Name, Image: c.Image, Ports: c.Ports, Resources: c.Resources}
	}
	return out
}

func slimStatuses(ss []corev1.ContainerStatus) []corev1.ContainerStatus {
	if ss == nil {
		return nil
	}
	out := make([]corev1.ContainerStatus, len(ss))
	for i, s := range ss {
		out[i] = corev1.ContainerStatus{Name: s.Name, Image: s.Image, Ready: s.Ready, RestartCount: s.RestartCount,
			Started: s.Started, State: s.State, LastTerminationState: s.LastTerminationState}
	}
	return out
}

// StripStatusOf is StripStatus for objects of type T only (e.g.
// *policyv1.PodDisruptionBudget), for a factory whose other types keep
// their status.
func StripStatusOf[T any]() cache.TransformFunc {
	return Slim(func(t T) { _, _ = StripStatus(t) })
}
