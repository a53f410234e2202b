package controller

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	k8sconst "github.com/cilium/cilium/pkg/k8s/apis/cilium.io"
	ciliumv2 "github.com/cilium/cilium/pkg/k8s/apis/cilium.io/v2"
	slimv1 "github.com/cilium/cilium/pkg/k8s/slim/k8s/apis/meta/v1"
	"github.com/cilium/cilium/pkg/labels"
	"github.com/cilium/cilium/pkg/policy/api"

	"krane.dev/sdk"
)

// Krane's namespace rule: a policy governs pods of its own namespace only,
// and its allow rules open traffic only to and from its own namespace and
// the configured peer namespaces (allowed_peer_namespaces).
//
// The check runs on rules that cilium's Sanitize() has already rewritten,
// so label keys are in cilium's internal "<source>.<key>" form and every
// spelling cilium accepts ("k8s:io.kubernetes.pod.namespace",
// "io.kubernetes.pod.namespace", ...) is judged the way cilium reads it.
//
// What is checked, and why:
//   - endpointSelector (the pods the policy governs): cilium always confines
//     it to the policy's namespace, silently dropping a namespace match
//     that says otherwise. A selector naming another namespace therefore
//     means ctrl asked for something it will not get: refused.
//   - peers of allow rules (ingress.fromEndpoints, egress.toEndpoints):
//     cilium confines a peer selector to the policy's namespace unless it
//     names namespaces itself, selects by namespace labels, or uses
//     reserved labels. A peer naming namespaces is allowed when every
//     namespace it can match is the own one or an allowed peer; a peer
//     whose namespaces are open-ended (NotIn, Exists, namespace labels
//     without a namespace name) is refused.
//   - entities of allow rules: "all", "cluster", "init" and "unmanaged"
//     match pods of every namespace and are refused; world, host,
//     remote-node, health, ingress, kube-apiserver and none are not
//     namespaced pods and stay allowed. Reserved-label peer selectors
//     follow the same list.
//   - egress.toServices: the Service's namespace must be set (empty means
//     every namespace to cilium) and be the own one or an allowed peer.
//
// Deny rules (ingressDeny, egressDeny) and fromRequires/toRequires are not
// restricted: they can only take traffic away from the policy's own pods.
type scope struct {
	own   string
	peers []string
}

var (
	podNamespaceKeys = []string{
		labels.LabelSourceK8sKeyPrefix + k8sconst.PodNamespaceLabel,
		labels.LabelSourceAnyKeyPrefix + k8sconst.PodNamespaceLabel,
	}
	namespaceLabelPrefixes = []string{
		labels.LabelSourceK8sKeyPrefix + k8sconst.PodNamespaceMetaLabelsPrefix,
		labels.LabelSourceAnyKeyPrefix + k8sconst.PodNamespaceMetaLabelsPrefix,
	}
	// confinedEntities never match a pod of another namespace.
	confinedEntities = []string{
		labels.IDNameWorld, labels.IDNameWorldIPv4, labels.IDNameWorldIPv6, labels.IDNameHost,
		labels.IDNameRemoteNode, labels.IDNameHealth, labels.IDNameIngress, labels.IDNameKubeAPIServer, labels.IDNameNone,
	}
)

func (s scope) check(cnp *ciliumv2.CiliumNetworkPolicy) error {
	if cnp.Spec != nil {
		if err := s.checkRule("policy.spec", cnp.Spec); err != nil {
			return err
		}
	}
	for i, r := range cnp.Specs {
		if err := s.checkRule(fmt.Sprintf("policy.specs[%d]", i), r); err != nil {
			return err
		}
	}
	return nil
}

func (s scope) checkRule(path string, r *api.Rule) error {
	if err := s.checkSubject(path+".endpointSelector", r.EndpointSelector); err != nil {
		return err
	}
	for i, in := range r.Ingress {
		p := fmt.Sprintf("%s.ingress[%d]", path, i)
		for j, es := range in.FromEndpoints {
			if err := s.checkPeer(fmt.Sprintf("%s.fromEndpoints[%d]", p, j), es); err != nil {
				return err
			}
		}
		if err := checkEntities(p+".fromEntities", in.FromEntities); err != nil {
			return err
		}
	}
	for i, eg := range r.Egress {
		p := fmt.Sprintf("%s.egress[%d]", path, i)
		for j, es := range eg.ToEndpoints {
			if err := s.checkPeer(fmt.Sprintf("%s.toEndpoints[%d]", p, j), es); err != nil {
				return err
			}
		}
		if err := checkEntities(p+".toEntities", eg.ToEntities); err != nil {
			return err
		}
		for j, svc := range eg.ToServices {
			sp := fmt.Sprintf("%s.toServices[%d]", p, j)
			if svc.K8sService != nil {
				if err := s.checkServiceNamespace(sp+".k8sService.namespace", svc.K8sService.Namespace); err != nil {
					return err
				}
			}
			if svc.K8sServiceSelector != nil {
				if err := s.checkServiceNamespace(sp+".k8sServiceSelector.namespace", svc.K8sServiceSelector.Namespace); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// checkSubject refuses an endpointSelector that names any namespace but
// the policy's own.
func (s scope) checkSubject(path string, es api.EndpointSelector) error {
	if es.LabelSelector == nil {
		return nil
	}
	for _, k := range sortedKeys(es.MatchLabels) {
		if slices.Contains(podNamespaceKeys, k) && es.MatchLabels[k] != s.own {
			return sdk.InvalidField(path, "selects pods in namespace %q, but a policy only governs pods of its own namespace %q: remove the namespace match", es.MatchLabels[k], s.own)
		}
	}
	for _, e := range es.MatchExpressions {
		if !slices.Contains(podNamespaceKeys, e.Key) {
			continue
		}
		if e.Operator != slimv1.LabelSelectorOpIn || slices.ContainsFunc(e.Values, func(v string) bool { return v != s.own }) {
			return sdk.InvalidField(path, "matches namespaces with %s %s %v, but a policy only governs pods of its own namespace %q: remove the namespace match", cutSource(e.Key), e.Operator, e.Values, s.own)
		}
	}
	return nil
}

// checkPeer refuses a peer selector that can match pods outside the own
// and the allowed peer namespaces.
func (s scope) checkPeer(path string, es api.EndpointSelector) error {
	if es.LabelSelector == nil {
		return nil
	}
	var (
		bounded    bool     // some requirement names the namespaces
		namespaces []string // the namespaces all such requirements allow
		openEnded  string   // a requirement that leaves the namespace open
		reserved   []string // reserved identities selected by matchLabels
		reservedEx string   // a match expression on a reserved label
	)
	narrow := func(names []string) {
		if !bounded {
			bounded, namespaces = true, slices.Clone(names)
			return
		}
		namespaces = slices.DeleteFunc(namespaces, func(n string) bool { return !slices.Contains(names, n) })
	}
	for _, k := range sortedKeys(es.MatchLabels) {
		switch {
		case slices.Contains(podNamespaceKeys, k):
			narrow([]string{es.MatchLabels[k]})
		case hasAnyPrefix(k, namespaceLabelPrefixes):
			openEnded = fmt.Sprintf("the namespace label %s", cutSource(k))
		case strings.HasPrefix(k, labels.LabelSourceReservedKeyPrefix):
			reserved = append(reserved, strings.TrimPrefix(k, labels.LabelSourceReservedKeyPrefix))
		}
	}
	for _, e := range es.MatchExpressions {
		switch {
		case slices.Contains(podNamespaceKeys, e.Key) && e.Operator == slimv1.LabelSelectorOpIn:
			narrow(e.Values)
		case slices.Contains(podNamespaceKeys, e.Key):
			openEnded = fmt.Sprintf("%s %s %v", cutSource(e.Key), e.Operator, e.Values)
		case hasAnyPrefix(e.Key, namespaceLabelPrefixes):
			openEnded = fmt.Sprintf("the namespace label %s", cutSource(e.Key))
		case strings.HasPrefix(e.Key, labels.LabelSourceReservedKeyPrefix):
			reservedEx = fmt.Sprintf("%s %s", cutSource(e.Key), e.Operator)
		}
	}
	allowed := append([]string{s.own}, s.peers...)
	switch {
	case bounded:
		// Every pod it matches carries one of these namespaces.
		for _, ns := range namespaces {
			if !slices.Contains(allowed, ns) {
				return sdk.InvalidField(path, "allows traffic with namespace %q, which is neither the policy's own namespace %q nor an allowed peer namespace [%s]; the cluster admin can add it to allowed_peer_namespaces", ns, s.own, quoteAll(s.peers))
			}
		}
		return nil
	case openEnded != "":
		return sdk.InvalidField(path, "selects peers by %s, which can match pods of any namespace; name the namespace with matchLabels k8s:%s (allowed: %s)", openEnded, k8sconst.PodNamespaceLabel, quoteAll(allowed))
	case reservedEx != "":
		// cilium does not scope a selector with reserved labels to the
		// namespace, and e.g. DoesNotExist on one matches every pod.
		return sdk.InvalidField(path, "matches %s, which cilium does not confine to a namespace; select a reserved identity with matchLabels or use toEntities/fromEntities", reservedEx)
	}
	for _, id := range reserved {
		if !slices.Contains(confinedEntities, id) {
			return sdk.InvalidField(path, "selects the reserved identity %q, which includes pods of every namespace; allowed identities: %s", id, quoteAll(confinedEntities))
		}
	}
	// No namespace in it: cilium confines it to the policy's namespace.
	return nil
}

func checkEntities(path string, entities []api.Entity) error {
	for i, e := range entities {
		if !slices.Contains(confinedEntities, string(e)) {
			return sdk.InvalidField(fmt.Sprintf("%s[%d]", path, i), "entity %q includes pods of every namespace; select peers with fromEndpoints/toEndpoints naming their namespace instead (allowed entities: %s)", e, quoteAll(confinedEntities))
		}
	}
	return nil
}

func (s scope) checkServiceNamespace(path, ns string) error {
	if ns == "" {
		return sdk.InvalidField(path, "empty, which cilium reads as Services of every namespace: set it to %q or an allowed peer namespace", s.own)
	}
	if ns != s.own && !slices.Contains(s.peers, ns) {
		return sdk.InvalidField(path, "namespace %q is neither the policy's own namespace %q nor an allowed peer namespace [%s]", ns, s.own, quoteAll(s.peers))
	}
	return nil
}

func hasAnyPrefix(s string, prefixes []string) bool {
	return slices.ContainsFunc(prefixes, func(p string) bool { return strings.HasPrefix(s, p) })
}

// cutSource turns cilium's internal "k8s.io.kubernetes.pod.namespace" back
// into the "k8s:io.kubernetes.pod.namespace" a policy author writes.
func cutSource(key string) string { return labels.GetCiliumKeyFrom(key) }

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
