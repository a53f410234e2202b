package testenv

import (
	"errors"
	"net"
	"testing"
)

// HostIP is the first global unicast IPv4 address of this machine: where
// a test runs servers that an EndpointSlice may point at, since the API
// server refuses loopback and link-local endpoint addresses. A machine
// without one cannot run such a test, which then fails saying so (it is
// not skipped: the suite would silently stop proving anything).
func HostIP(tb testing.TB) string {
	tb.Helper()
	ip, err := HostIPv4()
	if err != nil {
		tb.Fatal(err)
	}
	return ip
}

// HostIPv4 is HostIP for programs (the benchmarks).
func HostIPv4() (string, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return "", err
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && n.IP.IsGlobalUnicast() {
			return n.IP.String(), nil
		}
	}
	return "", errors.New("testenv: this machine has no global unicast IPv4 address; EndpointSlices cannot point at loopback, so a test of real traffic through them needs one (any private address on any interface will do)")
}
