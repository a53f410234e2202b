package proxy

import (
	"strings"

	"krane.dev/sentinel/routes"
)

// NormalizeHost turns a request's Host (or :authority) into the form routes
// list: the port removed, one trailing dot removed, lower case. ok is false
// for anything that is not a DNS name (IP literals included: the sentinel
// routes names only), so such a request is refused rather than matched.
// It does not allocate when the host is already lower case.
func NormalizeHost(host string) (string, bool) {
	if host == "" || len(host) > 253+1+6 {
		return "", false
	}
	if host[0] == '[' {
		// IPv6 literal, with or without a port.
		return "", false
	}
	if i := strings.LastIndexByte(host, ':'); i >= 0 {
		if !validPort(host[i+1:]) {
			return "", false
		}
		host = host[:i]
	}
	if n := len(host); n > 0 && host[n-1] == '.' {
		host = host[:n-1]
	}
	for i := 0; i < len(host); i++ {
		if c := host[i]; c >= 'A' && c <= 'Z' {
			host = strings.ToLower(host)
			break
		}
	}
	if !routes.ValidHost(host) {
		return "", false
	}
	return host, true
}

// validPort accepts "" (as in "host:") and 1-5 digits.
func validPort(p string) bool {
	if len(p) > 5 {
		return false
	}
	for i := 0; i < len(p); i++ {
		if p[i] < '0' || p[i] > '9' {
			return false
		}
	}
	return true
}
