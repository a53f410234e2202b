package check

import (
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Objects are an overlay's rendered objects, with typed views of the
// kinds the checks read.
type Objects struct {
	All             []*unstructured.Unstructured
	Namespaces      map[string]map[string]string // name -> labels
	Workloads       []Workload
	Services        []corev1.Service
	ConfigMaps      []corev1.ConfigMap
	NetworkPolicies []networkingv1.NetworkPolicy
	ServiceAccounts []corev1.ServiceAccount
	Roles           []rbacv1.Role
	ClusterRoles    []rbacv1.ClusterRole
	RoleBindings    []rbacv1.RoleBinding
	ClusterBindings []rbacv1.ClusterRoleBinding
}

// Workload is a Deployment or StatefulSet: what runs pods.
type Workload struct {
	Kind, Namespace, Name string
	Replicas              int32
	Template              corev1.PodTemplateSpec
	// ServiceName and Claims are a StatefulSet's.
	ServiceName string
	Claims      []corev1.PersistentVolumeClaim
}

func (w Workload) String() string { return w.Kind + " " + w.Namespace + "/" + w.Name }

// Container returns the workload's container called name.
func (w Workload) Container(name string) (corev1.Container, bool) {
	for _, c := range w.Template.Spec.Containers {
		if c.Name == name {
			return c, true
		}
	}
	return corev1.Container{}, false
}

// Parse types the rendered objects.
func Parse(all []*unstructured.Unstructured) (*Objects, error) {
	o := &Objects{All: all, Namespaces: map[string]map[string]string{}}
	for _, u := range all {
		var err error
		switch u.GetKind() {
		case "Namespace":
			l := map[string]string{"kubernetes.io/metadata.name": u.GetName()}
			for k, v := range u.GetLabels() {
				l[k] = v
			}
			o.Namespaces[u.GetName()] = l
		case "Deployment":
			var d appsv1.Deployment
			if err = convert(u, &d); err == nil {
				o.Workloads = append(o.Workloads, Workload{Kind: "Deployment", Namespace: d.Namespace, Name: d.Name, Replicas: replicas(d.Spec.Replicas), Template: d.Spec.Template})
			}
		case "StatefulSet":
			var s appsv1.StatefulSet
			if err = convert(u, &s); err == nil {
				o.Workloads = append(o.Workloads, Workload{Kind: "StatefulSet", Namespace: s.Namespace, Name: s.Name, Replicas: replicas(s.Spec.Replicas),
					Template: s.Spec.Template, ServiceName: s.Spec.ServiceName, Claims: s.Spec.VolumeClaimTemplates})
			}
		case "Service":
			err = appendAs(u, &o.Services)
		case "ConfigMap":
			err = appendAs(u, &o.ConfigMaps)
		case "NetworkPolicy":
			err = appendAs(u, &o.NetworkPolicies)
		case "ServiceAccount":
			err = appendAs(u, &o.ServiceAccounts)
		case "Role":
			err = appendAs(u, &o.Roles)
		case "ClusterRole":
			err = appendAs(u, &o.ClusterRoles)
		case "RoleBinding":
			err = appendAs(u, &o.RoleBindings)
		case "ClusterRoleBinding":
			err = appendAs(u, &o.ClusterBindings)
		}
		if err != nil {
			return nil, fmt.Errorf("%s %s/%s: %w", u.GetKind(), u.GetNamespace(), u.GetName(), err)
		}
	}
	return o, nil
}

func convert(u *unstructured.Unstructured, into any) error {
	return runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(u.Object, into, true)
}

func appendAs[T any](u *unstructured.Unstructured, list *[]T) error {
	var v T
	if err := convert(u, &v); err != nil {
		return err
	}
	*list = append(*list, v)
	return nil
}

func replicas(r *int32) int32 {
	if r == nil {
		return 1
	}
	return *r
}

// WorkloadWith returns the workload running a container called name.
func (o *Objects) WorkloadWith(container string) (Workload, bool) {
	for _, w := range o.Workloads {
		if _, ok := w.Container(container); ok {
			return w, true
		}
	}
	return Workload{}, false
}

// ConfigMap returns namespace/name.
func (o *Objects) ConfigMap(namespace, name string) (corev1.ConfigMap, bool) {
	for _, c := range o.ConfigMaps {
		if c.Namespace == namespace && c.Name == name {
			return c, true
		}
	}
	return corev1.ConfigMap{}, false
}

// Service returns namespace/name.
func (o *Objects) Service(namespace, name string) (corev1.Service, bool) {
	for _, s := range o.Services {
		if s.Namespace == namespace && s.Name == name {
			return s, true
		}
	}
	return corev1.Service{}, false
}

// Pod is a workload's pod as a NetworkPolicy source or destination.
func (o *Objects) Pod(w Workload) Pod {
	var ports []corev1.ContainerPort
	for _, c := range w.Template.Spec.Containers {
		ports = append(ports, c.Ports...)
	}
	return Pod{Namespace: w.Namespace, NamespaceLabels: o.Namespaces[w.Namespace], Labels: w.Template.Labels, Ports: ports}
}

// Endpoint is where a URL leads inside the rendered objects: a Service
// port and the workload and container port behind it.
type Endpoint struct {
	Service  corev1.Service
	Workload Workload
	Port     corev1.ContainerPort
}

// ResolveURL follows a URL a component is configured with (callerNS is
// the caller's namespace, for short names) to the Service it names and the
// container port that Service forwards to. In-cluster reports false for a
// host outside the cluster (neither a short Service name nor *.svc[.*]).
func (o *Objects) ResolveURL(raw, callerNS string) (ep Endpoint, inCluster bool, err error) {
	u, err := url.Parse(raw)
	if err != nil {
		return Endpoint{}, false, err
	}
	host, port := u.Hostname(), u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
	}
	ns := callerNS
	name, rest, dotted := strings.Cut(host, ".")
	if dotted {
		parts := strings.Split(rest, ".")
		if len(parts) < 2 || parts[1] != "svc" {
			return Endpoint{}, false, nil // an external name
		}
		ns = parts[0]
	}
	n, err := strconv.Atoi(port)
	if err != nil {
		return Endpoint{}, true, fmt.Errorf("%s: port %q is not a number", raw, port)
	}
	return o.resolveService(ns, name, int32(n))
}

func (o *Objects) resolveService(ns, name string, port int32) (Endpoint, bool, error) {
	svc, ok := o.Service(ns, name)
	if !ok {
		return Endpoint{}, true, fmt.Errorf("no Service %s/%s in the rendered objects", ns, name)
	}
	var sp *corev1.ServicePort
	for i := range svc.Spec.Ports {
		if svc.Spec.Ports[i].Port == port {
			sp = &svc.Spec.Ports[i]
		}
	}
	if sp == nil {
		return Endpoint{}, true, fmt.Errorf("Service %s/%s has no port %d", ns, name, port)
	}
	sel := labels.SelectorFromSet(svc.Spec.Selector)
	for _, w := range o.Workloads {
		if w.Namespace != ns || len(svc.Spec.Selector) == 0 || !sel.Matches(labels.Set(w.Template.Labels)) {
			continue
		}
		target := sp.TargetPort
		if target.Type == intstr.Int && target.IntVal == 0 {
			target = intstr.FromInt32(sp.Port)
		}
		for _, c := range w.Template.Spec.Containers {
			for _, cp := range c.Ports {
				if (target.Type == intstr.String && cp.Name == target.StrVal) || (target.Type == intstr.Int && cp.ContainerPort == target.IntVal) {
					return Endpoint{Service: svc, Workload: w, Port: cp}, true, nil
				}
			}
		}
		return Endpoint{}, true, fmt.Errorf("Service %s/%s port %d targets %s, which %s does not expose", ns, name, port, target.String(), w)
	}
	return Endpoint{}, true, fmt.Errorf("Service %s/%s selects no rendered workload's pods", ns, name)
}

// ListenPort is the port of a listen address such as ":9090" or
// "0.0.0.0:9090".
func ListenPort(addr string) (int32, error) {
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		return 0, fmt.Errorf("listen address %q: %w", addr, err)
	}
	n, err := strconv.Atoi(p)
	if err != nil {
		return 0, fmt.Errorf("listen address %q: port is not a number", addr)
	}
	return int32(n), nil
}
