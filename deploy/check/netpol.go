package check

import (
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Pod is one end of a connection for NetworkPolicy evaluation: a pod's
// namespace (with that namespace's labels), its labels and, as a
// destination, its container ports (named ports resolve against them).
type Pod struct {
	Namespace       string
	NamespaceLabels map[string]string
	Labels          map[string]string
	Ports           []corev1.ContainerPort
}

// IngressAllowed reports whether NetworkPolicies let from open a TCP
// connection to port (a number or a port name of to's containers) on to,
// following the API's semantics for ingress: a pod no policy selects
// accepts everything; a selected pod accepts what any selecting policy's
// rule allows. Egress policies are not evaluated (the manifests have
// none), nor ipBlock peers (pods here are reached by selectors only; an
// ipBlock never matches a pod).
func IngressAllowed(policies []networkingv1.NetworkPolicy, from, to Pod, port intstr.IntOrString) bool {
	isolated := false
	for _, np := range policies {
		if np.Namespace != to.Namespace || !hasIngress(np) || !selects(np.Spec.PodSelector, to.Labels) {
			continue
		}
		isolated = true
		for _, rule := range np.Spec.Ingress {
			if portMatches(rule.Ports, port, to) && peerMatches(rule.From, np.Namespace, from) {
				return true
			}
		}
	}
	return !isolated
}

func hasIngress(np networkingv1.NetworkPolicy) bool {
	if len(np.Spec.PolicyTypes) == 0 {
		return true // defaulted to Ingress (plus Egress when egress rules exist)
	}
	for _, t := range np.Spec.PolicyTypes {
		if t == networkingv1.PolicyTypeIngress {
			return true
		}
	}
	return false
}

func selects(sel metav1.LabelSelector, l map[string]string) bool {
	s, err := metav1.LabelSelectorAsSelector(&sel)
	return err == nil && s.Matches(labels.Set(l))
}

// portMatches: no ports means every port; a named policy port matches the
// destination container port of that name, a number matches itself (or
// the range up to EndPort). Only TCP is considered.
func portMatches(ports []networkingv1.NetworkPolicyPort, want intstr.IntOrString, to Pod) bool {
	if len(ports) == 0 {
		return true
	}
	num := resolvePort(want, to)
	if num == 0 {
		return false
	}
	for _, p := range ports {
		if p.Protocol != nil && *p.Protocol != corev1.ProtocolTCP {
			continue
		}
		if p.Port == nil {
			return true
		}
		n := resolvePort(*p.Port, to)
		if n == num || (p.EndPort != nil && p.Port.Type == intstr.Int && num >= n && num <= *p.EndPort) {
			return true
		}
	}
	return false
}

func resolvePort(p intstr.IntOrString, to Pod) int32 {
	if p.Type == intstr.Int {
		return p.IntVal
	}
	for _, cp := range to.Ports {
		if cp.Name == p.StrVal && (cp.Protocol == "" || cp.Protocol == corev1.ProtocolTCP) {
			return cp.ContainerPort
		}
	}
	return 0
}

// peerMatches: no peers means every source; a podSelector alone selects
// pods of the policy's namespace, a namespaceSelector alone every pod of
// the namespaces it selects, both together the pods they select jointly.
func peerMatches(peers []networkingv1.NetworkPolicyPeer, policyNS string, from Pod) bool {
	if len(peers) == 0 {
		return true
	}
	for _, p := range peers {
		switch {
		case p.IPBlock != nil:
			continue
		case p.NamespaceSelector == nil:
			if from.Namespace == policyNS && p.PodSelector != nil && selects(*p.PodSelector, from.Labels) {
				return true
			}
		default:
			if !selects(*p.NamespaceSelector, from.NamespaceLabels) {
				continue
			}
			if p.PodSelector == nil || selects(*p.PodSelector, from.Labels) {
				return true
			}
		}
	}
	return false
}
