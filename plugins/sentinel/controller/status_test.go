package controller

import (
	"fmt"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	clusterv1 "krane.dev/proto/krane/cluster/v1"
)

var now = time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)

// fixture is a sentinel mid-way through life: a Deployment at some
// generation and revision, its ReplicaSets and pods.
type fixture struct {
	dep  *appsv1.Deployment
	rss  []*appsv1.ReplicaSet
	pods []*corev1.Pod
}

func newFixture(t *testing.T, replicas int32, image string) *fixture {
	s := validSentinel()
	s.Replicas, s.Image = replicas, image
	d := buildDeployment(s, 1, defaultParams(t))
	d.UID = "dep-uid"
	d.Generation = 1
	d.Annotations[revisionAnnotation] = "1"
	f := &fixture{dep: d}
	f.addRS("1", image)
	return f
}

func (f *fixture) addRS(rev, image string) *appsv1.ReplicaSet {
	rs := &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{
		Name: "rs-" + rev, UID: types.UID("rs-uid-" + rev), Annotations: map[string]string{revisionAnnotation: rev},
		OwnerReferences: []metav1.OwnerReference{{Kind: "Deployment", UID: f.dep.UID, Controller: ptr(true)}},
	}}
	// The deployment controller copies the template and adds the hash label.
	rs.Spec.Template = *f.dep.Spec.Template.DeepCopy()
	rs.Spec.Template.Labels[appsv1.DefaultDeploymentUniqueLabelKey] = "hash-" + rev
	rs.Spec.Template.Spec.Containers[0].Image = image
	f.rss = append(f.rss, rs)
	return rs
}

// pod adds a pod of ReplicaSet rev, Ready since readyFor ago (negative: not ready).
func (f *fixture) pod(rev, image string, readyFor time.Duration) *corev1.Pod {
	ready := corev1.ConditionTrue
	if readyFor < 0 {
		ready = corev1.ConditionFalse
	}
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("pod-%s-%d", rev, len(f.pods)),
			OwnerReferences: []metav1.OwnerReference{{Kind: "ReplicaSet", UID: types.UID("rs-uid-" + rev), Controller: ptr(true)}}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: ContainerName, Image: image}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{
			Type: corev1.PodReady, Status: ready, LastTransitionTime: metav1.NewTime(now.Add(-readyFor)),
		}}},
	}
	f.pods = append(f.pods, p)
	return p
}

// roll starts a new revision with image, as the API server and the
// deployment controller would record it.
func (f *fixture) roll(rev, image string) {
	f.dep.Generation++
	f.dep.Spec.Template.Spec.Containers[0].Image = image
	f.dep.Annotations[revisionAnnotation] = rev
	f.addRS(rev, image)
}

func (f *fixture) status(updated, available, total int32) {
	f.dep.Status = appsv1.DeploymentStatus{
		ObservedGeneration: f.dep.Generation, Replicas: total, UpdatedReplicas: updated,
		AvailableReplicas: available, ReadyReplicas: available, UnavailableReplicas: max(0, *f.dep.Spec.Replicas-available),
	}
}

func (f *fixture) eval(policyProblem string) *clusterv1.SentinelStatus {
	return sentinelStatus(observation{Deployment: f.dep, ReplicaSets: f.rss, Pods: f.pods, PolicyProblem: policyProblem, Now: now})
}

const v1, v2 = "registry.example/sentinel:v1", "registry.example/sentinel:v2"

func TestStatusHealthyWhenComplete(t *testing.T) {
	f := newFixture(t, 3, v1)
	for range 3 {
		f.pod("1", v1, time.Minute)
	}
	f.status(3, 3, 3)
	st := f.eval("")
	if st.Health != clusterv1.Health_HEALTH_HEALTHY || st.RunningImage != v1 || st.Reason != "" {
		t.Fatalf("complete rollout: %v", st)
	}
	if st.DesiredReplicas != 3 || st.AvailableReplicas != 3 || st.UpdatedReplicas != 3 || st.ObservedGeneration != 1 || st.SentinelId != "snt_1" {
		t.Errorf("fields: %v", st)
	}
}

// Every intermediate state of a rollout from v1 to v2, including the ones
// where the Deployment and pod caches disagree, must not claim v2.
func TestStatusNeverHealthyOnNewImageEarly(t *testing.T) {
	type step struct {
		name  string
		build func(f *fixture)
	}
	steps := []step{
		{"generation not observed while the old one looks complete", func(f *fixture) {
			f.status(3, 3, 3)
			f.dep.Status.ObservedGeneration = 1
			f.dep.Annotations[revisionAnnotation] = "1"
			f.rss = f.rss[:1]
		}},
		{"new ReplicaSet not in cache", func(f *fixture) {
			f.rss = f.rss[:1]
			f.status(0, 3, 3)
		}},
		{"surge pod not ready", func(f *fixture) {
			f.pod("2", v2, -1)
			f.status(1, 3, 4)
		}},
		{"surge pod ready but not for minReadySeconds", func(f *fixture) {
			f.pod("2", v2, 2*time.Second)
			f.status(1, 3, 4)
		}},
		{"two of three updated", func(f *fixture) {
			f.pods = f.pods[:1]
			f.pod("2", v2, time.Minute)
			f.pod("2", v2, time.Minute)
			f.status(2, 3, 4)
		}},
		{"deployment status complete but pod cache still holds an old pod", func(f *fixture) {
			f.pods = f.pods[:1]
			f.pods[0].DeletionTimestamp = &metav1.Time{Time: now}
			f.pod("2", v2, time.Minute)
			f.pod("2", v2, time.Minute)
			f.pod("2", v2, time.Minute)
			f.status(3, 3, 3)
		}},
		{"deployment status complete but pod cache lacks a new pod", func(f *fixture) {
			f.pods = nil
			f.pod("2", v2, time.Minute)
			f.pod("2", v2, time.Minute)
			f.status(3, 3, 3)
		}},
		{"pod cache complete but deployment status lags", func(f *fixture) {
			f.pods = nil
			for range 3 {
				f.pod("2", v2, time.Minute)
			}
			f.status(2, 3, 3)
		}},
		{"surplus available pod", func(f *fixture) {
			f.pods = nil
			for range 3 {
				f.pod("2", v2, time.Minute)
			}
			f.status(3, 4, 4)
		}},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			f := newFixture(t, 3, v1)
			for range 3 {
				f.pod("1", v1, time.Hour)
			}
			f.roll("2", v2)
			f.status(0, 3, 3)
			f.dep.Status.ObservedGeneration = f.dep.Generation
			s.build(f)
			st := f.eval("")
			if st.RunningImage != "" || st.Health == clusterv1.Health_HEALTH_HEALTHY {
				t.Errorf("reported %s on %q mid-rollout: %v", st.Health, st.RunningImage, st)
			}
			if st.Health != clusterv1.Health_HEALTH_UNHEALTHY || st.Reason == "" {
				t.Errorf("want UNHEALTHY with a reason: %v", st)
			}
		})
	}
	// And once everything agrees, v2 is reported.
	f := newFixture(t, 3, v1)
	f.roll("2", v2)
	for range 3 {
		f.pod("2", v2, time.Minute)
	}
	f.status(3, 3, 3)
	if st := f.eval(""); st.Health != clusterv1.Health_HEALTH_HEALTHY || st.RunningImage != v2 {
		t.Errorf("complete rollout to v2: %v", st)
	}
}

func TestStatusProgressReason(t *testing.T) {
	f := newFixture(t, 3, v1)
	for range 3 {
		f.pod("1", v1, time.Hour)
	}
	f.roll("2", v2)
	f.pods = f.pods[:2]
	f.pod("2", v2, time.Minute)
	f.status(1, 3, 3)
	st := f.eval("")
	if !strings.Contains(st.Reason, "progressing: 1/3 updated, 3/3 available") || !strings.Contains(st.Reason, "2 old pod(s) still running") {
		t.Errorf("reason %q", st.Reason)
	}
}

func TestStatusCrashLoopAndPullFailures(t *testing.T) {
	f := newFixture(t, 2, v1)
	f.pod("1", v1, time.Hour)
	crash := f.pod("1", v1, -1)
	crash.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: ContainerName, RestartCount: 5,
		State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}}}}
	f.status(2, 1, 2)
	st := f.eval("")
	if st.Health != clusterv1.Health_HEALTH_UNHEALTHY || !strings.Contains(st.Reason, "crash-looping") || !strings.Contains(st.Reason, "5 restarts") || st.RunningImage != "" {
		t.Errorf("crash loop: %v", st)
	}
	crash.Status.ContainerStatuses[0].State.Waiting.Reason = "ImagePullBackOff"
	crash.Status.ContainerStatuses[0].Image = v1
	if st := f.eval(""); !strings.Contains(st.Reason, "cannot pull image "+v1) {
		t.Errorf("pull failure: %v", st)
	}
}

func TestStatusPolicyMissingIsUnhealthy(t *testing.T) {
	f := newFixture(t, 1, v1)
	f.pod("1", v1, time.Minute)
	f.status(1, 1, 1)
	st := f.eval("the CRD is not installed")
	if st.Health != clusterv1.Health_HEALTH_UNHEALTHY || st.Reason != "the CRD is not installed" {
		t.Errorf("policy missing: %v", st)
	}
	// The rollout itself is complete, and says so.
	if st.RunningImage != v1 {
		t.Errorf("running image %q, want %q", st.RunningImage, v1)
	}
}

func TestStatusPausedAtZero(t *testing.T) {
	f := newFixture(t, 0, v1)
	f.status(0, 0, 0)
	st := f.eval("")
	if st.Health != clusterv1.Health_HEALTH_PAUSED || st.RunningImage != "" || st.DesiredReplicas != 0 {
		t.Errorf("paused: %v", st)
	}
}

// The API server bumps a Deployment's generation on an annotation change. A
// new krane.dev/version with the same spec must not make a healthy
// sentinel look mid-rollout while the deployment controller catches up.
func TestStatusVersionBumpDoesNotFlap(t *testing.T) {
	f := newFixture(t, 2, v1)
	f.pod("1", v1, time.Minute)
	f.pod("1", v1, time.Minute)
	f.status(2, 2, 2)
	f.dep.Generation++
	f.dep.Annotations["krane.dev/version"] = "2"
	if st := f.eval(""); st.Health != clusterv1.Health_HEALTH_HEALTHY || st.RunningImage != v1 {
		t.Errorf("after a metadata-only change: %v", st)
	}
	// A template change the controller has not observed is another matter.
	f.dep.Spec.Template.Spec.Containers[0].Resources = corev1.ResourceRequirements{}
	if st := f.eval(""); st.Health == clusterv1.Health_HEALTH_HEALTHY || !strings.Contains(st.Reason, "not yet observed") {
		t.Errorf("after an unobserved template change: %v", st)
	}
}
