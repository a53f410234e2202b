package proxy

import (
	"fmt"
	"io"
	"net/http"
	"time"
)

// maxAttempts bounds how many instances one request tries to connect to.
const maxAttempts = 3

// dialError marks a failed connect: nothing of the request reached the
// instance, so another instance may be tried whatever the method.
type dialError struct {
	addr string
	err  error
}

func (e *dialError) Error() string { return fmt.Sprintf("connect to instance %s: %v", e.addr, e.err) }
func (e *dialError) Unwrap() error { return e.err }

// noInstanceError is a pool without a usable instance.
type noInstanceError struct{ reason string }

func (e *noInstanceError) Error() string { return e.reason }

// backendTransport sends a request to an instance of one backend: it picks
// the instance, counts it in flight until the response body is closed, and
// on a failed connect ejects the instance and tries another one.
//
// Only connect failures are retried here: then nothing was sent, so even a
// POST is safe to resend, and the body was not read (it is shielded from
// the transport's Close so a retry can still send it). Failures after
// bytes left are not retried: a request may have had effects.
type backendTransport struct {
	rt *Router
	b  *Backend
}

func (t *backendTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	var triedBuf [maxAttempts]*instance
	tried := triedBuf[:0]
	var body *shieldedBody
	if req.Body != nil && req.Body != http.NoBody {
		body = &shieldedBody{rc: req.Body}
		req.Body = body
	}
	var lastErr error
	for attempt := 0; attempt < maxAttempts; attempt++ {
		in := t.b.pool.pick(tried)
		if in == nil {
			break
		}
		out := req
		if attempt > 0 {
			// The transport may keep a reference to the request it was
			// given; the retry gets its own copy.
			r2 := *req
			u := *req.URL
			r2.URL = &u
			out = &r2
		}
		out.URL.Host = in.addr
		in.inflight.Add(1)
		resp, err := t.rt.transport.RoundTrip(out)
		if err == nil {
			in.succeeded()
			if rwc, ok := resp.Body.(io.ReadWriteCloser); ok && resp.StatusCode == http.StatusSwitchingProtocols {
				// The proxy needs the upgraded connection as a writer.
				resp.Body = &countedConn{countedBody{rc: rwc, in: in}, rwc}
			} else {
				resp.Body = &countedBody{rc: resp.Body, in: in}
			}
			return resp, nil
		}
		in.inflight.Add(-1)
		de, ok := err.(*dialError)
		if !ok || req.Context().Err() != nil {
			return nil, err
		}
		d := in.eject(time.Now())
		t.b.m.connect.Inc()
		t.b.m.ejections.Inc()
		t.rt.log.Warn("instance ejected after a failed connect", "deployment", t.b.spec.DeploymentID, "instance", de.addr, "for", d, "error", de.err)
		lastErr = err
		tried = append(tried, in)
		if body != nil && body.n > 0 {
			break
		}
	}
	if lastErr == nil {
		return nil, &noInstanceError{reason: t.b.reason}
	}
	return nil, lastErr
}

// shieldedBody passes reads through but ignores Close until the request is
// done with it: http.Transport closes the body when a connect fails, which
// would make a retry impossible. The server closes the real body itself.
type shieldedBody struct {
	rc io.ReadCloser
	n  int64
}

func (s *shieldedBody) Read(p []byte) (int, error) {
	n, err := s.rc.Read(p)
	s.n += int64(n)
	return n, err
}

func (s *shieldedBody) Close() error { return nil }

// countedBody ends an instance's in-flight count when the proxy is done
// with the response.
type countedBody struct {
	rc   io.ReadCloser
	in   *instance
	done bool
}

func (c *countedBody) Read(p []byte) (int, error) { return c.rc.Read(p) }

func (c *countedBody) Close() error {
	if !c.done {
		c.done = true
		c.in.inflight.Add(-1)
	}
	return c.rc.Close()
}

// countedConn is countedBody over an upgraded (101) connection.
type countedConn struct {
	countedBody
	w io.Writer
}

func (c *countedConn) Write(p []byte) (int, error) { return c.w.Write(p) }
