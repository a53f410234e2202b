package controller

import (
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/tools/cache"

	"krane.dev/sdk/kube"
)

// byDeploymentIndex indexes the informer caches by deployment id, so one
// deployment's objects are found without scanning the whole cache: a scan
// per Apply and per status report is quadratic in the number of
// deployments (a bootstrap of thousands spends its time there).
const byDeploymentIndex = "deployment"

// deploymentIndexers are added to every informer whose objects are looked
// up per deployment.
var deploymentIndexers = cache.Indexers{byDeploymentIndex: deploymentIndex}

// deploymentIndex files an object under its deployment id when it matches
// byDeployment(id): Krane's managed-by label, this component, and the id
// label. Anything else is not indexed (as byDeployment would not select it).
func deploymentIndex(obj any) ([]string, error) {
	m, err := meta.Accessor(obj)
	if err != nil {
		return nil, nil
	}
	l := m.GetLabels()
	id, ok := l[LabelDeployment]
	if !ok || l[kube.ManagedByLabel] != kube.ManagedBy || l[kube.ComponentLabel] != Component {
		return nil, nil
	}
	return []string{id}, nil
}

// ofDeployment returns the cached objects of deployment id, the same set
// as a List(byDeployment(id)) on the cache, in no particular order. Like a
// lister's, the objects are the cache's own: read them, never change them.
func ofDeployment[T any](idx cache.Indexer, id string) ([]T, error) {
	objs, err := idx.ByIndex(byDeploymentIndex, id)
	if err != nil {
		return nil, err
	}
	out := make([]T, 0, len(objs))
	for _, o := range objs {
		if t, ok := o.(T); ok {
			out = append(out, t)
		}
	}
	return out, nil
}
