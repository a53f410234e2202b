package controller

import (
	"slices"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	clusterv1 "krane.dev/proto/krane/cluster/v1"
	"krane.dev/sdk"
	"krane.dev/sentinel/routes"
)

// What a sentinel routes reaches its pods through a ConfigMap beside its
// Deployment, <k8s_name>-routes, key routes.json, which the sentinel
// process watches through the API (by name, in its namespace): a promote
// changes what the sentinel routes within a second, without a restart or a
// roll, and without any call from the data path to ctrl. The instances of
// the routed deployment are not in it: the sentinel reads them from the
// deployment's EndpointSlices, which Kubernetes keeps current.

// RoutesKey is the ConfigMap key holding the routes document.
const RoutesKey = routes.Key

// routesSuffix names the ConfigMap after the Deployment; the same length
// as the gossip Service's, which k8s_name's bound already leaves room for.
const routesSuffix = "-routes"

func routesName(k8sName string) string { return k8sName + routesSuffix }

// routesOf is the routes document of a sentinel (the contract of package
// krane.dev/sentinel/routes, which the sentinel reads).
func routesOf(s *clusterv1.Sentinel, version uint64) *routes.Routes {
	r := &routes.Routes{SentinelID: s.GetId(), EnvironmentID: s.GetEnvironmentId(), Version: version, Hosts: slices.Clone(s.GetRoutes().GetHosts())}
	if r.Hosts == nil {
		r.Hosts = []string{}
	}
	if b := s.GetRoutes().GetBackend(); b != nil {
		r.Backend = &routes.Backend{DeploymentID: b.GetDeploymentId(), Namespace: b.GetK8SNamespace(), Service: b.GetK8SName(), Port: b.GetPort()}
	}
	return r
}

// buildRoutes is the sentinel's routes ConfigMap, owned by its Deployment.
func buildRoutes(s *clusterv1.Sentinel, version uint64, p params, owner *metav1.OwnerReference) (*corev1.ConfigMap, error) {
	doc, err := routesOf(s, version).Encode()
	if err != nil {
		return nil, sdk.InvalidField("routes", "sentinel %s: %v", s.GetId(), err)
	}
	id := identityOf(s, version)
	return &corev1.ConfigMap{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: id.meta(routesName(s.GetK8SName()), p.Namespace, owner),
		Data:       map[string]string{RoutesKey: string(doc)},
	}, nil
}
