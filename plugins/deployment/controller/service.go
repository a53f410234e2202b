package controller

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/tools/cache"

	clusterv1 "krane.dev/proto/krane/cluster/v1"
)

var servicesGVR = corev1.SchemeGroupVersion.WithResource("services")

// buildService is the deployment's headless Service, named like its
// ReplicaSet and selecting every pod of the deployment. It gives the
// deployment's pods a stable name, and Kubernetes' EndpointSlice controller
// then keeps one EndpointSlice set of the ready pods, labelled
// kubernetes.io/service-name=<name>: what the sentinel routes to (it reads
// instances from there rather than pods, so it needs no access to pods and
// follows readiness exactly as the rest of Kubernetes does). Headless: the
// sentinel balances over the pods itself, so no cluster IP is allocated and
// kube-proxy programs nothing for it.
func buildService(id string, d *clusterv1.Deployment) *corev1.Service {
	return &corev1.Service{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: companionMeta(id, d),
		Spec: corev1.ServiceSpec{
			ClusterIP: corev1.ClusterIPNone,
			Selector:  map[string]string{LabelDeployment: id},
			Ports: []corev1.ServicePort{{
				Name: portName, Protocol: corev1.ProtocolTCP,
				Port: containerPort(workloadOf(d)), TargetPort: intstr.FromString(portName),
			}},
			// Only ready pods take requests: a starting or failing pod is
			// left out of the EndpointSlices' ready set.
			PublishNotReadyAddresses: false,
		},
	}
}

// services is the deployment's Service as a companion: every running
// deployment has one.
var services = companion[*corev1.Service]{
	what: "Service", gvr: servicesGVR,
	index: func(k *kubeState) cache.Indexer { return k.serviceIndex },
	build: func(id string, d *clusterv1.Deployment) (*corev1.Service, bool) { return buildService(id, d), true },
}
