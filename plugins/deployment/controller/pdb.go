package controller

import (
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/tools/cache"

	clusterv1 "krane.dev/proto/krane/cluster/v1"
)

var pdbsGVR = policyv1.SchemeGroupVersion.WithResource("poddisruptionbudgets")

// buildPDB is the PodDisruptionBudget of a deployment with more than one
// replica, nil otherwise (a budget of one replica would either block every
// drain or allow everything). A voluntary disruption (a node drain) may
// take one of its pods at a time. Unhealthy pods may always be evicted, so
// a crash-looping pod never blocks a drain. It selects every pod of the
// deployment, whatever its template: during a roll, the new pods count.
func buildPDB(id string, d *clusterv1.Deployment) *policyv1.PodDisruptionBudget {
	if d.GetReplicas() <= 1 {
		return nil
	}
	return &policyv1.PodDisruptionBudget{
		TypeMeta:   metav1.TypeMeta{APIVersion: "policy/v1", Kind: "PodDisruptionBudget"},
		ObjectMeta: companionMeta(id, d),
		Spec: policyv1.PodDisruptionBudgetSpec{
			MaxUnavailable:             ptr(intstr.FromInt32(1)),
			Selector:                   &metav1.LabelSelector{MatchLabels: map[string]string{LabelDeployment: id}},
			UnhealthyPodEvictionPolicy: ptr(policyv1.AlwaysAllow),
		},
	}
}

// pdbs is the deployment's PodDisruptionBudget as a companion.
var pdbs = companion[*policyv1.PodDisruptionBudget]{
	what: "PodDisruptionBudget", gvr: pdbsGVR,
	index: func(k *kubeState) cache.Indexer { return k.pdbIndex },
	build: func(id string, d *clusterv1.Deployment) (*policyv1.PodDisruptionBudget, bool) {
		p := buildPDB(id, d)
		return p, p != nil
	},
}
