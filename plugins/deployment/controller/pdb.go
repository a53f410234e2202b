package controller

import (
	"context"
	"fmt"

	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	clusterv1 "krane.dev/proto/krane/cluster/v1"
	"krane.dev/sdk"
	"krane.dev/sdk/kube"
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
	labels := kube.ManagedLabels(Component)
	labels[LabelDeployment] = id
	return &policyv1.PodDisruptionBudget{
		TypeMeta:   metav1.TypeMeta{APIVersion: "policy/v1", Kind: "PodDisruptionBudget"},
		ObjectMeta: metav1.ObjectMeta{Name: d.GetK8SName(), Namespace: d.GetK8SNamespace(), Labels: labels},
		Spec: policyv1.PodDisruptionBudgetSpec{
			MaxUnavailable:             ptr(intstr.FromInt32(1)),
			Selector:                   &metav1.LabelSelector{MatchLabels: map[string]string{LabelDeployment: id}},
			UnhealthyPodEvictionPolicy: ptr(policyv1.AlwaysAllow),
		},
	}
}

// syncPDB makes the deployment's PodDisruptionBudget match d: applied when
// the cache's copy differs, deleted (with any in a former namespace or
// under a former name) when d needs none. No API call when it matches.
func (c *Controller) syncPDB(ctx context.Context, k *kubeState, id string, d *clusterv1.Deployment) (bool, error) {
	current, err := ofDeployment[*policyv1.PodDisruptionBudget](k.pdbIndex, id)
	if err != nil {
		return false, err
	}
	want := buildPDB(id, d)
	if want == nil {
		if len(current) == 0 {
			return false, nil
		}
		if err := kube.DeleteAll(ctx, k.dynamic, pdbsGVR, current); err != nil {
			return false, fmt.Errorf("deployment %s: delete its PodDisruptionBudget: %w", id, err)
		}
		return true, nil
	}
	unlock := c.nsLocks.rlock(want.Namespace)
	defer unlock()
	res, err := kube.ApplyOne(ctx, k.dynamic, pdbsGVR, want, current)
	if err != nil {
		return false, classify(fmt.Errorf("PodDisruptionBudget %s/%s: %w", want.Namespace, want.Name, err), id)
	}
	return res == sdk.Applied, nil
}

// deletePDBs deletes every PodDisruptionBudget of the deployment, listed
// live so one written a moment ago is not missed.
func (c *Controller) deletePDBs(ctx context.Context, k *kubeState, id string) error {
	list, err := kube.Typed[policyv1.PodDisruptionBudget, policyv1.PodDisruptionBudgetList](k.clients, "poddisruptionbudgets", "").List(ctx, metav1.ListOptions{LabelSelector: byDeployment(id).String()})
	if err != nil {
		return fmt.Errorf("deployment %s: list its PodDisruptionBudgets: %w", id, err)
	}
	objs := make([]*policyv1.PodDisruptionBudget, len(list.Items))
	for i := range list.Items {
		objs[i] = &list.Items[i]
	}
	if err := kube.DeleteAll(ctx, k.dynamic, pdbsGVR, objs); err != nil {
		return fmt.Errorf("deployment %s: delete its PodDisruptionBudgets: %w", id, err)
	}
	return nil
}
