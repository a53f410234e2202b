package controller

import (
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	clusterv1 "krane.dev/proto/krane/cluster/v1"
	"krane.dev/sdk/kube"
)

func TestInstanceOf(t *testing.T) {
	rs := buildReplicaSet("dep_1", 1, validSpec(), Defaults())
	base := func() *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "web-abc-xyz12"},
			Spec:       *rs.Spec.Template.Spec.DeepCopy(),
			Status:     corev1.PodStatus{Phase: corev1.PodPending},
		}
	}
	waiting := func(reason string) corev1.ContainerStatus {
		return corev1.ContainerStatus{Name: containerName, State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: reason + " message"}}}
	}
	cond := func(typ corev1.PodConditionType, status corev1.ConditionStatus, reason string) corev1.PodCondition {
		return corev1.PodCondition{Type: typ, Status: status, Reason: reason, Message: "0/9 nodes are available"}
	}
	const (
		pending = clusterv1.Instance_STATUS_PENDING
		running = clusterv1.Instance_STATUS_RUNNING
		failed  = clusterv1.Instance_STATUS_FAILED
	)
	cases := []struct {
		name       string
		edit       func(p *corev1.Pod)
		want       clusterv1.Instance_Status
		wantReason string
	}{
		{"just created", func(p *corev1.Pod) {}, pending, "Pending"},
		{"unschedulable", func(p *corev1.Pod) {
			p.Status.Conditions = []corev1.PodCondition{cond(corev1.PodScheduled, corev1.ConditionFalse, "Unschedulable")}
		}, pending, "Unschedulable"},
		{"image pull back-off", func(p *corev1.Pod) {
			p.Status.ContainerStatuses = []corev1.ContainerStatus{waiting("ImagePullBackOff")}
		}, failed, "ImagePullBackOff"},
		{"image pull error", func(p *corev1.Pod) {
			p.Status.ContainerStatuses = []corev1.ContainerStatus{waiting("ErrImagePull")}
		}, failed, "ErrImagePull"},
		{"crash loop", func(p *corev1.Pod) {
			p.Status.Phase = corev1.PodRunning
			cs := waiting("CrashLoopBackOff")
			cs.LastTerminationState.Terminated = &corev1.ContainerStateTerminated{ExitCode: 1, Message: "panic: boom"}
			p.Status.ContainerStatuses = []corev1.ContainerStatus{cs}
		}, failed, "CrashLoopBackOff"},
		{"creating", func(p *corev1.Pod) {
			p.Status.ContainerStatuses = []corev1.ContainerStatus{waiting("ContainerCreating")}
		}, pending, "ContainerCreating"},
		{"running, not ready", func(p *corev1.Pod) {
			p.Status.Phase = corev1.PodRunning
			p.Status.Conditions = []corev1.PodCondition{cond(corev1.PodReady, corev1.ConditionFalse, "ContainersNotReady")}
		}, pending, "NotReady"},
		{"running and ready", func(p *corev1.Pod) {
			p.Status.Phase = corev1.PodRunning
			p.Status.PodIP = "10.244.1.7"
			p.Status.Conditions = []corev1.PodCondition{cond(corev1.PodReady, corev1.ConditionTrue, "")}
		}, running, ""},
		{"terminating is not running", func(p *corev1.Pod) {
			p.Status.Phase = corev1.PodRunning
			p.Status.Conditions = []corev1.PodCondition{cond(corev1.PodReady, corev1.ConditionTrue, "")}
			p.DeletionTimestamp = &metav1.Time{}
		}, pending, "Terminating"},
		{"evicted", func(p *corev1.Pod) {
			p.Status.Phase = corev1.PodFailed
			p.Status.Reason = "Evicted"
		}, failed, "Evicted"},
		{"exited", func(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded }, failed, "Completed"},
	}
	for _, tc := range cases {
		p := base()
		tc.edit(p)
		in := instanceOf(p, "zone-b")
		if in.Status != tc.want || in.Reason != tc.wantReason {
			t.Errorf("%s: %s %q, want %s %q", tc.name, in.Status, in.Reason, tc.want, tc.wantReason)
		}
		if in.K8SName != "web-abc-xyz12" || in.Zone != "zone-b" || in.CpuMillicores != 250 || in.MemoryMib != 256 {
			t.Errorf("%s: identity and size %+v", tc.name, in)
		}
		if tc.want == failed && in.Message == "" {
			t.Errorf("%s: failed without a message", tc.name)
		}
	}
	p := base()
	p.Status.PodIP = "10.244.1.7"
	if a := instanceOf(p, "").Address; a != "10.244.1.7:8080" {
		t.Errorf("address %q, want podIP:port", a)
	}
	p.Status.PodIP = "fd00::7"
	if a := instanceOf(p, "").Address; a != "[fd00::7]:8080" {
		t.Errorf("IPv6 address %q", a)
	}
	p = base()
	cs := waiting("CrashLoopBackOff")
	cs.LastTerminationState.Terminated = &corev1.ContainerStateTerminated{ExitCode: 1, Message: "panic: boom"}
	p.Status.ContainerStatuses = []corev1.ContainerStatus{cs}
	if m := instanceOf(p, "").Message; m != "panic: boom" {
		t.Errorf("crash loop message %q: want the crash's own message", m)
	}
}

func TestCurrentReplicaSet(t *testing.T) {
	mk := func(name string, version string, deleting bool) *appsv1.ReplicaSet {
		rs := &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{kube.VersionAnnotation: version}}}
		if deleting {
			rs.DeletionTimestamp = &metav1.Time{}
		}
		return rs
	}
	if cur := currentReplicaSet([]*appsv1.ReplicaSet{mk("old", "9", true), mk("new", "5", false)}); cur.Name != "new" {
		t.Errorf("current = %s: a deleting ReplicaSet is never current while another lives", cur.Name)
	}
	if cur := currentReplicaSet([]*appsv1.ReplicaSet{mk("a", "3", false), mk("b", "4", false)}); cur.Name != "b" {
		t.Errorf("current = %s, want the newest version", cur.Name)
	}
	if currentReplicaSet(nil) != nil {
		t.Error("current of none")
	}
}
