package watch

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

func ptr[T any](v T) *T { return &v }

func TestInstancesKeepsReadyEndpointsOnTheRightPort(t *testing.T) {
	tcp, udp := corev1.ProtocolTCP, corev1.ProtocolUDP
	list := []*discoveryv1.EndpointSlice{
		{AddressType: discoveryv1.AddressTypeIPv4,
			Ports: []discoveryv1.EndpointPort{{Name: ptr("metrics"), Port: ptr(int32(9090))}, {Name: ptr("http"), Port: ptr(int32(8080)), Protocol: &tcp}},
			Endpoints: []discoveryv1.Endpoint{
				{Addresses: []string{"10.0.0.1"}}, // ready unset: counts
				{Addresses: []string{"10.0.0.2"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr(true)}},
				{Addresses: []string{"10.0.0.3"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr(false)}},
				{Addresses: []string{"10.0.0.4"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr(true), Terminating: ptr(true)}},
				{Addresses: nil},
			}},
		{AddressType: discoveryv1.AddressTypeIPv6, Ports: []discoveryv1.EndpointPort{{Port: ptr(int32(8081))}, {Port: ptr(int32(53)), Protocol: &udp}},
			Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"fd00::1", "fd00::2"}}}},
		{AddressType: discoveryv1.AddressTypeFQDN, Ports: []discoveryv1.EndpointPort{{Name: ptr("http"), Port: ptr(int32(40001))}},
			Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"localhost"}}}},
		// Two unnamed TCP ports: ambiguous, the routes' port is used.
		{AddressType: discoveryv1.AddressTypeIPv4, Ports: []discoveryv1.EndpointPort{{Port: ptr(int32(1))}, {Port: ptr(int32(2))}},
			Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"10.0.1.1"}}}},
		{AddressType: "Unknown", Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"x"}}}},
	}
	got := Instances(list, 7000)
	want := []string{"10.0.0.1:8080", "10.0.0.2:8080", "10.0.1.1:7000", "[fd00::1]:8081", "localhost:40001"}
	if !slices.Equal(got, want) {
		t.Fatalf("Instances = %v, want %v", got, want)
	}
	if got := Instances(list[3:4], 0); len(got) != 0 {
		t.Fatalf("ambiguous ports and no default: %v, want none", got)
	}
}
