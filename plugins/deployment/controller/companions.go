package controller

import (
	"context"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/cache"

	clusterv1 "krane.dev/proto/krane/cluster/v1"
	"krane.dev/sdk"
	"krane.dev/sdk/kube"
)

// A companion is an object a deployment has beside its ReplicaSet, one at
// most, named and placed like it: its PodDisruptionBudget and its Service.
// Each is cached by a label-selected informer indexed by deployment id, so
// an Apply that changes nothing reads the cache and makes no API call; it
// is written with server-side apply when it differs, deleted when the
// deployment needs none, and deleted with the deployment.
type companion[T kube.Cached] struct {
	what  string
	gvr   schema.GroupVersionResource
	index func(*kubeState) cache.Indexer
	// build is the object the deployment needs; false for none.
	build func(id string, d *clusterv1.Deployment) (T, bool)
}

// companions of a deployment, in the order they are written.
var companions = []interface {
	sync(ctx context.Context, c *Controller, k *kubeState, id string, d *clusterv1.Deployment) (bool, error)
	delete(ctx context.Context, k *kubeState, id string) error
}{pdbs, services}

// companionMeta is the metadata every companion shares: the ReplicaSet's
// name and namespace and Krane's labels naming the deployment.
func companionMeta(id string, d *clusterv1.Deployment) metav1.ObjectMeta {
	labels := kube.ManagedLabels(Component)
	labels[LabelDeployment] = id
	return metav1.ObjectMeta{Name: d.GetK8SName(), Namespace: d.GetK8SNamespace(), Labels: labels}
}

// sync makes the companion match d: applied when the cache's copy differs
// (any in a former namespace or under a former name deleted), deleted when
// d needs none. It reports whether it wrote anything.
func (p companion[T]) sync(ctx context.Context, c *Controller, k *kubeState, id string, d *clusterv1.Deployment) (bool, error) {
	current, err := ofDeployment[T](p.index(k), id)
	if err != nil {
		return false, err
	}
	want, needed := p.build(id, d)
	if !needed {
		if len(current) == 0 {
			return false, nil
		}
		if err := kube.DeleteAll(ctx, k.dynamic, p.gvr, current); err != nil {
			return false, classify(fmt.Errorf("deployment %s: delete its %s: %w", id, p.what, err), id)
		}
		return true, nil
	}
	unlock := c.nsLocks.rlock(want.GetNamespace())
	defer unlock()
	res, err := kube.ApplyOne(ctx, k.dynamic, p.gvr, want, current)
	if err != nil {
		return false, classify(fmt.Errorf("%s %s/%s: %w", p.what, want.GetNamespace(), want.GetName(), err), id)
	}
	return res == sdk.Applied, nil
}

// delete deletes every companion of this type of the deployment, listed
// live (metadata only) so one written a moment ago is not missed.
func (p companion[T]) delete(ctx context.Context, k *kubeState, id string) error {
	list, err := k.metadata.Resource(p.gvr).List(ctx, metav1.ListOptions{LabelSelector: byDeployment(id).String()})
	if err != nil {
		return fmt.Errorf("deployment %s: list its %ss: %w", id, p.what, err)
	}
	objs := make([]*metav1.PartialObjectMetadata, len(list.Items))
	for i := range list.Items {
		objs[i] = &list.Items[i]
	}
	if err := kube.DeleteAll(ctx, k.dynamic, p.gvr, objs); err != nil {
		return fmt.Errorf("deployment %s: delete its %ss: %w", id, p.what, err)
	}
	return nil
}

// syncCompanions syncs every companion of the deployment; it reports
// whether any was written.
func (c *Controller) syncCompanions(ctx context.Context, k *kubeState, id string, d *clusterv1.Deployment) (bool, error) {
	wrote := false
	for _, p := range companions {
		w, err := p.sync(ctx, c, k, id, d)
		if err != nil {
			return wrote, err
		}
		wrote = wrote || w
	}
	return wrote, nil
}

// deleteCompanions deletes every companion of the deployment.
func (c *Controller) deleteCompanions(ctx context.Context, k *kubeState, id string) error {
	for _, p := range companions {
		if err := p.delete(ctx, k, id); err != nil {
			return err
		}
	}
	return nil
}
