package controller_test

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"krane.dev/plugins/deployment/controller"
	"krane.dev/sdk"
)

// TestServiceOfADeployment: a running deployment has a headless Service
// named like it, selecting its pods by deployment id, whose EndpointSlices
// (kept by Kubernetes) list its ready pods: what a sentinel routes to. A
// hand-deleted Service comes back at the next Apply, an unchanged one costs
// no write, and it goes with the deployment (and with a stop).
func TestServiceOfADeployment(t *testing.T) {
	cluster, _, _ := pluginIdentity(t)
	cleanupNamespace(t, cluster, "svc")
	ctx := context.Background()
	p := startPlugin(t, `{}`)
	svcs := cluster.Client.CoreV1().Services("svc")
	get := func() (*corev1.Service, bool) {
		t.Helper()
		s, err := svcs.Get(ctx, "web", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil, false
		}
		if err != nil {
			t.Fatal(err)
		}
		return s, true
	}
	const id = "dep_svc"
	d := spec("svc", "web", image, 2)
	apply(t, p, change(t, id, 1, d), sdk.Applied)
	s, ok := get()
	if !ok {
		t.Fatal("no Service for a running deployment")
	}
	if s.Spec.ClusterIP != corev1.ClusterIPNone {
		t.Errorf("clusterIP %q, want None (headless: the sentinel balances itself)", s.Spec.ClusterIP)
	}
	if sel := s.Spec.Selector; len(sel) != 1 || sel[controller.LabelDeployment] != id {
		t.Errorf("selector %v, want the deployment id only (every template's pods)", sel)
	}
	if len(s.Spec.Ports) != 1 || s.Spec.Ports[0].Name != "http" || s.Spec.Ports[0].Port != 8080 || s.Spec.Ports[0].TargetPort.String() != "http" {
		t.Errorf("ports %+v, want http 8080 -> the container's named port", s.Spec.Ports)
	}
	applyUntil(t, p, change(t, id, 1, d), sdk.Unchanged)

	// Kubernetes lists the deployment's ready pods in the Service's
	// EndpointSlices.
	waitUntil(t, time.Minute, "EndpointSlices listing both ready pods", func() bool {
		list, err := cluster.Client.DiscoveryV1().EndpointSlices("svc").List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=web"})
		if err != nil {
			t.Fatal(err)
		}
		ready := 0
		for _, sl := range list.Items {
			for _, e := range sl.Endpoints {
				if e.Conditions.Ready == nil || *e.Conditions.Ready {
					ready++
				}
			}
		}
		return ready == 2
	})

	if err := svcs.Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	applyUntil(t, p, change(t, id, 1, d), sdk.Applied)
	if _, ok := get(); !ok {
		t.Fatal("a hand-deleted Service was not restored")
	}

	d.Replicas = 0
	apply(t, p, change(t, id, 2, d), sdk.Deleted)
	if _, ok := get(); ok {
		t.Fatal("Service left behind by a stop")
	}
	// The stop removed the namespace it emptied; start again once it is gone.
	waitUntil(t, time.Minute, "namespace svc gone after the stop", func() bool { return namespaceGone(t, cluster, "svc") })
	d.Replicas = 1
	apply(t, p, change(t, id, 3, d), sdk.Applied)
	if _, ok := get(); !ok {
		t.Fatal("no Service after starting again")
	}
	apply(t, p, deleted(id, 4), sdk.Deleted)
	if _, ok := get(); ok {
		t.Fatal("Service left behind by the delete")
	}
}
