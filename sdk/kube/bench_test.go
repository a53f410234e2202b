package kube

import (
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func benchReplicaSet() *appsv1.ReplicaSet {
	replicas := int32(3)
	labels := map[string]string{ManagedByLabel: ManagedBy, "unkey.com/deployment.id": "dep_1"}
	return &appsv1.ReplicaSet{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apps/v1", Kind: "ReplicaSet"},
		ObjectMeta: metav1.ObjectMeta{Name: "dep-1", Namespace: "ws-1", Labels: labels, Annotations: VersionAnnotations(42, "abc")},
		Spec: appsv1.ReplicaSetSpec{
			Replicas: &replicas, Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: corev1.PodSpec{
				Containers: []corev1.Container{{
					Name: "app", Image: "registry.example/app:1.2.3",
					Env: []corev1.EnvVar{{Name: "A", Value: "1"}, {Name: "B", Value: "2"}, {Name: "C", Value: "3"}},
					Resources: corev1.ResourceRequirements{
						Limits:   corev1.ResourceList{corev1.ResourceCPU: *resource.NewMilliQuantity(250, resource.DecimalSI), corev1.ResourceMemory: *resource.NewQuantity(256<<20, resource.BinarySI)},
						Requests: corev1.ResourceList{corev1.ResourceCPU: *resource.NewMilliQuantity(250, resource.DecimalSI), corev1.ResourceMemory: *resource.NewQuantity(256<<20, resource.BinarySI)},
					},
				}},
			}},
		},
	}
}

// BenchmarkSpecHash: hashing a desired spec (once per Apply).
func BenchmarkSpecHash(b *testing.B) {
	rs := benchReplicaSet()
	b.ReportAllocs()
	for b.Loop() {
		_ = SpecHash(rs.Spec)
	}
}

// BenchmarkUnchangedCheck: the whole UNCHANGED path of an Apply: build the
// desired object's map form and compare it with the informer's copy.
func BenchmarkUnchangedCheck(b *testing.B) {
	rs := benchReplicaSet()
	live := rs.DeepCopy()
	live.ResourceVersion, live.UID = "123", "u-1"
	b.ReportAllocs()
	for b.Loop() {
		desired, err := ToUnstructured(rs)
		if err != nil {
			b.Fatal(err)
		}
		if d, err := DriftObject(desired.Object, live); err != nil || d != "" {
			b.Fatalf("drift %q %v", d, err)
		}
	}
}
