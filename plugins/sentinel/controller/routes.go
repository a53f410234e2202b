package controller

import (
	"encoding/json"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	clusterv1 "krane.dev/proto/krane/cluster/v1"
)

// What a sentinel routes reaches its pods through a ConfigMap beside its
// Deployment, <k8s_name>-routes, key routes.json, which the sentinel
// process watches through the API (by name, in its namespace): a promote
// changes what the sentinel routes within a second, without a restart or a
// roll, and without any call from the data path to ctrl. The instances of
// the routed deployment are not in it: the sentinel reads them from the
// deployment's EndpointSlices, which Kubernetes keeps current.

// RoutesKey is the ConfigMap key holding the routes document.
const RoutesKey = "routes.json"

// routesSuffix names the ConfigMap after the Deployment; the same length
// as the gossip Service's, which k8s_name's bound already leaves room for.
const routesSuffix = "-routes"

func routesName(k8sName string) string { return k8sName + routesSuffix }

// Routes is the routes document (the sentinel's input contract, see
// docs/sentinel.md).
type Routes struct {
	SentinelID    string `json:"sentinel_id"`
	EnvironmentID string `json:"environment_id"`
	// Version is the sentinel's desired-state version these routes came
	// with: a sentinel reports it, so one can tell which routes it serves.
	Version uint64        `json:"version"`
	Hosts   []string      `json:"hosts"`
	Backend *RouteBackend `json:"backend,omitempty"`
}

// RouteBackend is the live deployment: its headless Service (named like it,
// in its namespace) and the port its instances listen on.
type RouteBackend struct {
	DeploymentID string `json:"deployment_id"`
	Namespace    string `json:"namespace"`
	Service      string `json:"service"`
	Port         int32  `json:"port"`
}

func routesOf(s *clusterv1.Sentinel, version uint64) Routes {
	r := Routes{SentinelID: s.GetId(), EnvironmentID: s.GetEnvironmentId(), Version: version, Hosts: s.GetRoutes().GetHosts()}
	if r.Hosts == nil {
		r.Hosts = []string{}
	}
	if b := s.GetRoutes().GetBackend(); b != nil {
		r.Backend = &RouteBackend{DeploymentID: b.GetDeploymentId(), Namespace: b.GetK8SNamespace(), Service: b.GetK8SName(), Port: b.GetPort()}
	}
	return r
}

// buildRoutes is the sentinel's routes ConfigMap, owned by its Deployment.
func buildRoutes(s *clusterv1.Sentinel, version uint64, p params, owner *metav1.OwnerReference) (*corev1.ConfigMap, error) {
	doc, err := json.Marshal(routesOf(s, version))
	if err != nil {
		return nil, fmt.Errorf("sentinel %s: encode its routes: %w", s.GetId(), err)
	}
	id := identityOf(s, version)
	return &corev1.ConfigMap{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: id.meta(routesName(s.GetK8SName()), p.Namespace, owner),
		Data:       map[string]string{RoutesKey: string(doc)},
	}, nil
}
