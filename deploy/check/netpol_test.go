package check

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

func TestIngressAllowed(t *testing.T) {
	ns := func(name string) map[string]string {
		return map[string]string{"kubernetes.io/metadata.name": name, "team": name}
	}
	app := func(name string) map[string]string { return map[string]string{"app": name} }
	ctrl := Pod{Namespace: "cp", NamespaceLabels: ns("cp"), Labels: app("ctrl")}
	krane := Pod{Namespace: "krane", NamespaceLabels: ns("krane"), Labels: app("krane")}
	fake := Pod{Namespace: "other", NamespaceLabels: ns("other"), Labels: app("ctrl")}
	restate := Pod{Namespace: "cp", NamespaceLabels: ns("cp"), Labels: app("restate"),
		Ports: []corev1.ContainerPort{{Name: "ingress", ContainerPort: 8080}, {Name: "admin", ContainerPort: 9070}}}
	port := func(p intstr.IntOrString) *intstr.IntOrString { return &p }
	selector := func(l map[string]string) *metav1.LabelSelector { return &metav1.LabelSelector{MatchLabels: l} }
	policy := func(rules ...networkingv1.NetworkPolicyIngressRule) networkingv1.NetworkPolicy {
		return networkingv1.NetworkPolicy{
			ObjectMeta: metav1.ObjectMeta{Namespace: "cp", Name: "restate"},
			Spec:       networkingv1.NetworkPolicySpec{PodSelector: *selector(app("restate")), PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}, Ingress: rules},
		}
	}
	onlyCtrlOnIngress := policy(networkingv1.NetworkPolicyIngressRule{
		From:  []networkingv1.NetworkPolicyPeer{{PodSelector: selector(app("ctrl"))}},
		Ports: []networkingv1.NetworkPolicyPort{{Port: port(intstr.FromString("ingress"))}},
	})
	egressOnly := onlyCtrlOnIngress
	egressOnly.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
	otherNamespace := onlyCtrlOnIngress
	otherNamespace.Namespace = "elsewhere"
	fromKraneNamespace := policy(networkingv1.NetworkPolicyIngressRule{
		From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: selector(map[string]string{"team": "krane"}), PodSelector: selector(app("krane"))}},
	})
	anyNamespaceCtrl := policy(networkingv1.NetworkPolicyIngressRule{
		From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{}, PodSelector: selector(app("ctrl"))}},
	})
	openPorts := policy(networkingv1.NetworkPolicyIngressRule{Ports: []networkingv1.NetworkPolicyPort{{Port: port(intstr.FromInt32(9070))}}})
	endPort := int32(9100)
	portRange := policy(networkingv1.NetworkPolicyIngressRule{Ports: []networkingv1.NetworkPolicyPort{{Port: port(intstr.FromInt32(9000)), EndPort: &endPort}}})
	udp := corev1.ProtocolUDP
	udpOnly := policy(networkingv1.NetworkPolicyIngressRule{Ports: []networkingv1.NetworkPolicyPort{{Protocol: &udp, Port: port(intstr.FromInt32(8080))}}})
	ipBlock := policy(networkingv1.NetworkPolicyIngressRule{From: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "0.0.0.0/0"}}}})

	for _, tc := range []struct {
		name     string
		policies []networkingv1.NetworkPolicy
		from     Pod
		port     intstr.IntOrString
		want     bool
	}{
		{"no policy: everything", nil, krane, intstr.FromInt32(8080), true},
		{"selected pod, allowed source and named port", []networkingv1.NetworkPolicy{onlyCtrlOnIngress}, ctrl, intstr.FromInt32(8080), true},
		{"named port given by name", []networkingv1.NetworkPolicy{onlyCtrlOnIngress}, ctrl, intstr.FromString("ingress"), true},
		{"another port of the allowed source", []networkingv1.NetworkPolicy{onlyCtrlOnIngress}, ctrl, intstr.FromInt32(9070), false},
		{"another source", []networkingv1.NetworkPolicy{onlyCtrlOnIngress}, krane, intstr.FromInt32(8080), false},
		{"the source's labels in another namespace", []networkingv1.NetworkPolicy{onlyCtrlOnIngress}, fake, intstr.FromInt32(8080), false},
		{"an unknown port name", []networkingv1.NetworkPolicy{onlyCtrlOnIngress}, ctrl, intstr.FromString("metrics"), false},
		{"egress-only policy does not isolate ingress", []networkingv1.NetworkPolicy{egressOnly}, krane, intstr.FromInt32(8080), true},
		{"a policy of another namespace does not apply", []networkingv1.NetworkPolicy{otherNamespace}, krane, intstr.FromInt32(8080), true},
		{"namespace and pod selector together", []networkingv1.NetworkPolicy{fromKraneNamespace}, krane, intstr.FromInt32(8080), true},
		{"namespace and pod selector: pod not selected", []networkingv1.NetworkPolicy{fromKraneNamespace}, fake, intstr.FromInt32(8080), false},
		{"empty namespace selector: every namespace", []networkingv1.NetworkPolicy{anyNamespaceCtrl}, fake, intstr.FromInt32(8080), true},
		{"no peers: every source on the port", []networkingv1.NetworkPolicy{openPorts}, krane, intstr.FromInt32(9070), true},
		{"no peers: not on other ports", []networkingv1.NetworkPolicy{openPorts}, krane, intstr.FromInt32(8080), false},
		{"port range", []networkingv1.NetworkPolicy{portRange}, krane, intstr.FromInt32(9070), true},
		{"port range: beyond its end", []networkingv1.NetworkPolicy{portRange}, krane, intstr.FromInt32(9101), false},
		{"a UDP rule does not open TCP", []networkingv1.NetworkPolicy{udpOnly}, krane, intstr.FromInt32(8080), false},
		{"an ipBlock never matches a pod", []networkingv1.NetworkPolicy{ipBlock}, krane, intstr.FromInt32(8080), false},
		{"policies add up", []networkingv1.NetworkPolicy{onlyCtrlOnIngress, openPorts}, krane, intstr.FromInt32(9070), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := IngressAllowed(tc.policies, tc.from, restate, tc.port); got != tc.want {
				t.Errorf("IngressAllowed = %v, want %v", got, tc.want)
			}
		})
	}
}
