package kube

import (
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
)

func fullPod() *corev1.Pod {
	now := metav1.Now()
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", UID: "u", Labels: map[string]string{"a": "b"}, Annotations: map[string]string{"c": "d"},
			OwnerReferences: []metav1.OwnerReference{{Name: "rs", UID: "rs-uid"}}, DeletionTimestamp: &now,
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "m"}}},
		Spec: corev1.PodSpec{
			NodeName: "n1",
			Containers: []corev1.Container{{Name: "app", Image: "img:1", Ports: []corev1.ContainerPort{{ContainerPort: 8080}},
				Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m")}},
				Env:       []corev1.EnvVar{{Name: "SECRET", Value: "x"}}, Command: []string{"run"},
				ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Port: intstr.FromInt(1)}}}}},
			Volumes:     []corev1.Volume{{Name: "v"}},
			Tolerations: []corev1.Toleration{{Key: "k"}},
		},
		Status: corev1.PodStatus{
			Phase: corev1.PodRunning, Reason: "r", Message: "m", PodIP: "10.0.0.1", HostIP: "192.168.0.1",
			PodIPs: []corev1.PodIP{{IP: "10.0.0.1"}},
			Conditions: []corev1.PodCondition{
				{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
				{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable, Message: "no node"},
				{Type: corev1.ContainersReady, Status: corev1.ConditionTrue},
				{Type: corev1.PodInitialized, Status: corev1.ConditionTrue},
			},
			ContainerStatuses: []corev1.ContainerStatus{{Name: "app", Image: "img:1", ImageID: "sha256:x", ContainerID: "cri://y", RestartCount: 3,
				State:                corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff", Message: "back-off"}},
				LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Message: "panic"}}}},
			InitContainerStatuses: []corev1.ContainerStatus{{Name: "init", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ErrImagePull"}}}},
		},
	}
}

func TestSlimPodKeepsWhatStatusIsComputedFrom(t *testing.T) {
	p := fullPod()
	orig := p.DeepCopy()
	out, err := Slim(SlimPod)(p)
	if err != nil || out != any(p) {
		t.Fatalf("Slim(SlimPod) = %v, %v; want the same pod", out, err)
	}
	// Kept: metadata but managedFields, and every field a status reads.
	orig.ManagedFields = nil
	if !reflect.DeepEqual(p.ObjectMeta, orig.ObjectMeta) {
		t.Errorf("metadata changed: %+v", p.ObjectMeta)
	}
	c := p.Spec.Containers[0]
	if p.Spec.NodeName != "n1" || c.Name != "app" || c.Image != "img:1" || c.Ports[0].ContainerPort != 8080 || c.Resources.Limits.Cpu().MilliValue() != 100 {
		t.Errorf("spec lost what is read: %+v", p.Spec)
	}
	s := p.Status
	if s.Phase != corev1.PodRunning || s.Reason != "r" || s.Message != "m" || s.PodIP != "10.0.0.1" {
		t.Errorf("status lost what is read: %+v", s)
	}
	if len(s.Conditions) != 2 || !reflect.DeepEqual(s.Conditions, orig.Status.Conditions[:2]) {
		t.Errorf("conditions %+v, want Ready and PodScheduled as they were", s.Conditions)
	}
	cs := s.ContainerStatuses[0]
	if cs.Name != "app" || cs.Image != "img:1" || cs.RestartCount != 3 || cs.State.Waiting.Reason != "CrashLoopBackOff" || cs.LastTerminationState.Terminated.Message != "panic" {
		t.Errorf("container status lost what is read: %+v", cs)
	}
	if s.InitContainerStatuses[0].State.Waiting.Reason != "ErrImagePull" {
		t.Errorf("init container status lost its state: %+v", s.InitContainerStatuses)
	}
	// Dropped: what no status reads.
	if c.Env != nil || c.Command != nil || c.ReadinessProbe != nil || p.Spec.Volumes != nil || p.Spec.Tolerations != nil ||
		s.HostIP != "" || s.PodIPs != nil || cs.ImageID != "" || cs.ContainerID != "" {
		t.Errorf("SlimPod kept fields it should drop: spec %+v, status %+v", p.Spec, s)
	}
	// Idempotent: a transform may see an object twice.
	again := p.DeepCopy()
	SlimPod(again)
	if !reflect.DeepEqual(again, p) {
		t.Error("SlimPod twice differs from once")
	}
}

func TestStripStatusTypedAndUnstructured(t *testing.T) {
	pdb := &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Name: "x"}, Status: policyv1.PodDisruptionBudgetStatus{CurrentHealthy: 2, DisruptedPods: map[string]metav1.Time{"p": metav1.Now()}}}
	if _, err := StripStatus(pdb); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(pdb.Status, policyv1.PodDisruptionBudgetStatus{}) || pdb.Name != "x" {
		t.Errorf("typed: %+v", pdb)
	}
	u := &unstructured.Unstructured{Object: map[string]any{"metadata": map[string]any{"name": "y"}, "spec": map[string]any{}, "status": map[string]any{"a": "b"}}}
	if _, err := StripStatus(u); err != nil {
		t.Fatal(err)
	}
	if _, ok := u.Object["status"]; ok || u.GetName() != "y" || u.Object["spec"] == nil {
		t.Errorf("unstructured: %v", u.Object)
	}
	// Anything else passes unchanged.
	for _, o := range []any{"text", nil, &metav1.Status{Status: "Failure"}} {
		if got, err := StripStatus(o); err != nil || !reflect.DeepEqual(got, o) {
			t.Errorf("StripStatus(%v) = %v, %v", o, got, err)
		}
	}
}

func TestChainRunsEachAndSlimLeavesOtherTypes(t *testing.T) {
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "m"}}},
		Status: corev1.ServiceStatus{Conditions: []metav1.Condition{{Type: "x"}}}}
	tr := Chain(StripManagedFields, Slim(SlimPod), StripStatus)
	if _, err := tr(svc); err != nil {
		t.Fatal(err)
	}
	if svc.ManagedFields != nil || svc.Status.Conditions != nil {
		t.Errorf("Chain did not run every transform: %+v", svc)
	}
	p := fullPod()
	if _, err := Slim(func(*corev1.Service) { t.Error("called on a pod") })(p); err != nil {
		t.Fatal(err)
	}
	if _, err := StripStatusOf[*corev1.Service]()(p); err != nil || p.Status.PodIP == "" {
		t.Errorf("StripStatusOf[*corev1.Service] changed a pod's status: %+v, %v", p.Status, err)
	}
}
