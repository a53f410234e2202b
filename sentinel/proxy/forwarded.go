package proxy

import (
	"net/http/httputil"
	"net/netip"
)

// forwarded sets the X-Forwarded-* headers of the outbound request. The
// ReverseProxy has already removed the inbound request's X-Forwarded-For,
// -Host and -Proto from Out (it does so before Rewrite). A peer inside
// trusted (the load balancer in front of the sentinel) has its chain kept
// and the peer appended; anyone else could forge them, so they get the
// sentinel's own view and their Forwarded header is dropped too.
func forwarded(pr *httputil.ProxyRequest, trusted []netip.Prefix) {
	if len(trusted) > 0 && peerTrusted(pr.In.RemoteAddr, trusted) {
		in := pr.In.Header
		if v := in["X-Forwarded-For"]; len(v) > 0 {
			pr.Out.Header["X-Forwarded-For"] = append([]string(nil), v...)
		}
		pr.SetXForwarded()
		if v := in["X-Forwarded-Host"]; len(v) > 0 {
			pr.Out.Header["X-Forwarded-Host"] = append([]string(nil), v...)
		}
		if v := in["X-Forwarded-Proto"]; len(v) > 0 {
			pr.Out.Header["X-Forwarded-Proto"] = append([]string(nil), v...)
		}
		return
	}
	pr.Out.Header.Del("Forwarded")
	pr.SetXForwarded()
}

func peerTrusted(remoteAddr string, trusted []netip.Prefix) bool {
	ap, err := netip.ParseAddrPort(remoteAddr)
	if err != nil {
		return false
	}
	a := ap.Addr().Unmap()
	for _, p := range trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}
