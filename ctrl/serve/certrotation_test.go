package serve_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"

	"krane.dev/ctrl/internal/ctrltest"
	"krane.dev/ctrl/serve"
	"krane.dev/host/config"
	"krane.dev/host/ctrlclient"
	"krane.dev/internal/testenv"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
	"krane.dev/shared/kinds"
)

// testCA issues certificates with serials the test chooses, so a peer's
// certificate says which generation of the files it came from.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newTestCA(t *testing.T, name string) testCA {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), IsCA: true, KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue returns a PEM certificate and key for 127.0.0.1 valid from
// notBefore to notAfter.
func (ca testCA) issue(t *testing.T, serial int64, usage x509.ExtKeyUsage, notBefore, notAfter time.Time) (certPEM, keyPEM []byte) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: fmt.Sprintf("serial-%d", serial)},
		NotBefore: notBefore, NotAfter: notAfter, ExtKeyUsage: []x509.ExtKeyUsage{usage}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kd, _ := x509.MarshalECPrivateKey(key)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kd})
}

func (ca testCA) valid(t *testing.T, serial int64, usage x509.ExtKeyUsage) ([]byte, []byte) {
	return ca.issue(t, serial, usage, time.Now().Add(-time.Hour), time.Now().Add(time.Hour))
}

// writeInPlace rewrites a file the way an operator's copy does: same
// path, truncated and written (not renamed over).
func writeInPlace(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

func peerSerial(t *testing.T, p *peer.Peer) int64 {
	t.Helper()
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.PeerCertificates) == 0 {
		t.Fatalf("peer %v: no TLS certificate", p.AuthInfo)
	}
	return info.State.PeerCertificates[0].SerialNumber.Int64()
}

// TestCertificatesRotateOnDiskUnderLiveStreams: ctrl (serving certificate,
// key and client CA) and krane (client certificate, key and the CA it
// trusts for ctrl) are rotated on disk to a new CA while a Watch stream is
// open. The stream carries on undisturbed on its connection; the next
// handshake (a connection cut and remade) presents the new certificates
// on both sides. That handshake needs all four reloads: ctrl's new
// certificate is signed by the new CA only, which krane trusts only if it
// re-read its CA file; ctrl verifies the client against the new CA only,
// which passes only if ctrl re-read its client CA and krane its client
// certificate. Then an expired certificate, a key that does not match and
// a garbled file are written in place: each is refused, ctrl keeps
// presenting the last good certificate and counts the refusals.
func TestCertificatesRotateOnDiskUnderLiveStreams(t *testing.T) {
	dir := t.TempDir()
	path := func(n string) string { return filepath.Join(dir, n) }
	ca1, ca2 := newTestCA(t, "ca one"), newTestCA(t, "ca two")
	write := func(gen testCA, serverSerial, clientSerial int64) {
		sc, sk := gen.valid(t, serverSerial, x509.ExtKeyUsageServerAuth)
		cc, ck := gen.valid(t, clientSerial, x509.ExtKeyUsageClientAuth)
		// Key first, then certificate: a handshake in between sees a
		// mismatched pair, which is refused and then adopted once whole.
		writeInPlace(t, path("server.key"), sk)
		writeInPlace(t, path("server.crt"), sc)
		writeInPlace(t, path("client-ca.pem"), gen.pem)
		writeInPlace(t, path("ctrl-ca.pem"), gen.pem)
		writeInPlace(t, path("client.key"), ck)
		writeInPlace(t, path("client.crt"), cc)
	}
	write(ca1, 101, 201)

	env := ctrltest.Start(t, ctrltest.Options{Configure: func(c *serve.Config) {
		c.GRPC.TLSCert, c.GRPC.TLSKey, c.GRPC.ClientCA = path("server.crt"), path("server.key"), path("client-ca.pem")
		c.Watch.KeepAlive = 100 * time.Millisecond // the live stream has something to carry while idle
	}})
	token := env.ClusterToken(t, "eu", "eu-1")
	proxy, err := testenv.NewProxy(env.Server.GRPCAddr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Close)
	dial := func(addr string) *grpc.ClientConn {
		cfg := &config.Config{Region: "eu", ClusterID: "eu-1", ControlPlane: config.ControlPlane{
			URL: "https://" + addr, Token: token, CAFile: path("ctrl-ca.pem"),
			ClientCertFile: path("client.crt"), ClientKeyFile: path("client.key")}}
		conn, err := ctrlclient.DialLogged(cfg, "krane/rotation-test", hclog.New(&hclog.LoggerOptions{Output: testWriter{t}, Level: hclog.Info}))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return conn
	}
	// The live stream, straight to ctrl; and a connection through a proxy
	// the test cuts to make the same client handshake again.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := ctrlclient.New(dial(env.Server.GRPCAddr())).Watch(ctx, &clusterv1.WatchRequest{Kind: kinds.Deployment})
	if err != nil {
		t.Fatal(err)
	}
	if ev := recv(t, stream.Recv); ev.GetBootstrapComplete() == nil {
		t.Fatalf("first event %v, want BootstrapComplete", ev)
	}
	streamPeer, _ := peer.FromContext(stream.Context())
	if streamPeer == nil {
		t.Fatal("the Watch stream has no peer")
	}
	if s := peerSerial(t, streamPeer); s != 101 {
		t.Fatalf("the stream's ctrl certificate has serial %d, want 101", s)
	}
	cut := ctrlclient.New(dial(proxy.Addr()))
	// handshake cuts the proxied connection and calls until a call passes
	// on a new one, returning the serial ctrl presented there.
	handshake := func(why string) int64 {
		t.Helper()
		proxy.Cut()
		proxy.Restore()
		deadline := time.Now().Add(30 * time.Second)
		for {
			var p peer.Peer
			cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
			_, err := cut.Heartbeat(cctx, &clusterv1.HeartbeatRequest{AgentVersion: "rotation-test"}, grpc.Peer(&p), grpc.WaitForReady(true))
			ccancel()
			if err == nil {
				return peerSerial(t, &p)
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: no call passed on a new connection within 30s: %v\nctrl logs:\n%s", why, err, env.Logs.String())
			}
		}
	}
	if s := handshake("before rotation"); s != 101 {
		t.Fatalf("before rotation ctrl presented serial %d, want 101", s)
	}

	// Rotate everything to the second CA.
	write(ca2, 102, 202)
	if s := handshake("after rotation"); s != 102 {
		t.Fatalf("after rotating the files to a new CA, a new handshake saw ctrl's certificate serial %d, want 102 (the new one)", s)
	}
	// The stream opened before the rotation carries on, on its first
	// connection and certificate.
	for i := 0; i < 3; i++ {
		if ev := recv(t, stream.Recv); ev.GetKeepAlive() == nil {
			t.Fatalf("stream event after rotation %v, want KeepAlive", ev)
		}
	}
	if s := peerSerial(t, streamPeer); s != 101 {
		t.Fatalf("the open stream's certificate serial %d, want 101 (its connection predates the rotation)", s)
	}

	// Bad new versions are refused; the last good certificate stays.
	refusals := func() float64 {
		return counterValue(t, env.Server, "krane_ctrl_tls_reload_errors_total", "setting", "grpc.tls_cert")
	}
	expiredCert, expiredKey := ca2.issue(t, 103, x509.ExtKeyUsageServerAuth, time.Now().Add(-2*time.Hour), time.Now().Add(-time.Hour))
	otherCert, _ := ca2.valid(t, 104, x509.ExtKeyUsageServerAuth)
	for _, bad := range []struct {
		name      string
		cert, key []byte
	}{
		{"an expired certificate", expiredCert, expiredKey},
		{"a certificate whose key is not the one beside it", otherCert, nil},
		{"a garbled certificate file", []byte("-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n"), nil},
	} {
		before := refusals()
		if bad.key != nil {
			writeInPlace(t, path("server.key"), bad.key)
		}
		writeInPlace(t, path("server.crt"), bad.cert)
		if s := handshake(bad.name); s != 102 {
			t.Fatalf("after writing %s in place ctrl presented serial %d, want 102 (the last good one)", bad.name, s)
		}
		if after := refusals(); after <= before {
			t.Fatalf("after writing %s, krane_ctrl_tls_reload_errors_total{setting=grpc.tls_cert} = %v, was %v: want it counted", bad.name, after, before)
		}
	}
	if ev := recv(t, stream.Recv); ev.GetKeepAlive() == nil {
		t.Fatalf("stream event after the refused versions %v, want KeepAlive", ev)
	}
}

// recv reads the next stream event, failing the test after 20s.
func recv[T any](t testing.TB, next func() (T, error)) T {
	t.Helper()
	type res struct {
		v   T
		err error
	}
	ch := make(chan res, 1)
	go func() { v, err := next(); ch <- res{v, err} }()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatalf("stream: %v", r.err)
		}
		return r.v
	case <-time.After(20 * time.Second):
		t.Fatal("no stream event within 20s")
	}
	panic("unreachable")
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}

// counterValue reads one labelled counter from the server's registry (0
// while the series does not exist yet).
func counterValue(t *testing.T, srv *serve.Server, name, label, value string) float64 {
	t.Helper()
	mfs, err := srv.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}
