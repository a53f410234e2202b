package watch

import (
	"net"
	"slices"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// Instances lists the dialable addresses (host:port) of the ready
// endpoints in slices, sorted. An endpoint counts when its ready condition
// is unset or true and it is not terminating; its first address is used
// (the API says addresses of one endpoint are fungible). The port is the
// slice's port named "http", else its only port, else defaultPort; a slice
// with none of those contributes nothing.
func Instances(list []*discoveryv1.EndpointSlice, defaultPort int32) []string {
	var out []string
	for _, s := range list {
		switch s.AddressType {
		case discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6, discoveryv1.AddressTypeFQDN:
		default:
			continue
		}
		port := slicePort(s, defaultPort)
		if port <= 0 || port > 65535 {
			continue
		}
		ps := strconv.Itoa(int(port))
		for _, ep := range s.Endpoints {
			c := ep.Conditions
			if (c.Ready != nil && !*c.Ready) || (c.Terminating != nil && *c.Terminating) || len(ep.Addresses) == 0 {
				continue
			}
			out = append(out, net.JoinHostPort(ep.Addresses[0], ps))
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

func slicePort(s *discoveryv1.EndpointSlice, def int32) int32 {
	var tcp []discoveryv1.EndpointPort
	for _, p := range s.Ports {
		if p.Protocol == nil || *p.Protocol == corev1.ProtocolTCP {
			tcp = append(tcp, p)
		}
	}
	for _, p := range tcp {
		if p.Name != nil && *p.Name == "http" && p.Port != nil {
			return *p.Port
		}
	}
	if len(tcp) == 1 && tcp[0].Port != nil {
		return *tcp[0].Port
	}
	return def
}
