package kube

import (
	"net/http"
	"sync/atomic"

	"k8s.io/client-go/rest"
)

// CallCounter counts the API calls made through a rest.Config, split into
// reads (GET, and LIST/WATCH which are GETs) and writes (everything else).
// Plugins expose it as a metric; tests use it to prove a resync of
// unchanged objects writes nothing.
type CallCounter struct {
	reads, writes atomic.Int64
}

// Wrap makes cfg's transport count through c.
func (c *CallCounter) Wrap(cfg *rest.Config) {
	prev := cfg.WrapTransport
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		if prev != nil {
			rt = prev(rt)
		}
		return roundTripFunc(func(req *http.Request) (*http.Response, error) {
			if req.Method == http.MethodGet || req.Method == http.MethodHead {
				c.reads.Add(1)
			} else {
				c.writes.Add(1)
			}
			return rt.RoundTrip(req)
		})
	}
}

// Reads is the number of read calls so far.
func (c *CallCounter) Reads() int64 { return c.reads.Load() }

// Writes is the number of write calls so far.
func (c *CallCounter) Writes() int64 { return c.writes.Load() }

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
