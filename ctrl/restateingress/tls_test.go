package restateingress

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/restatedev/sdk-go/ingress"

	"krane.dev/internal/testenv"
	"krane.dev/shared/certreload"
)

// TestIngressOverTLSWithAPrivateCA: restate-server serves no TLS, so a
// TLS-terminating proxy with a private CA's certificate fronts its
// ingress. A client given that CA (WithTLS) reaches Restate through it (the
// answer is Restate's own: no ctrl is registered, so the service is
// unknown); one given another CA refuses the proxy's certificate.
func TestIngressOverTLSWithAPrivateCA(t *testing.T) {
	issueCA := func(name string) (*x509.Certificate, *ecdsa.PrivateKey, string) {
		key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name}, NotBefore: time.Now().Add(-time.Hour),
			NotAfter: time.Now().Add(time.Hour), IsCA: true, KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
		if err != nil {
			t.Fatal(err)
		}
		c, _ := x509.ParseCertificate(der)
		file := t.TempDir() + "/ca.pem"
		if err := os.WriteFile(file, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return c, key, file
	}
	ca, caKey, caFile := issueCA("restate ca")
	_, _, otherFile := issueCA("another ca")
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "restate"}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	kd, _ := x509.MarshalECPrivateKey(key)
	proxy := testenv.StartTLSProxy(t, testenv.SharedRestate(t).IngressURL(),
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kd}))

	call := func(caFile string) error {
		roots, err := certreload.LoadCAPool(caFile, certreload.Options{Name: "restate.ca_file"})
		if err != nil {
			t.Fatal(err)
		}
		c := NewIngressClient(proxy.URL(), nil, WithTLS(certreload.ClientConfig("127.0.0.1", roots, nil)))
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_, err = c.start(ctx, "NoSuchService", "", "Call", map[string]string{}, "")
		return err
	}
	err = call(caFile)
	var ie ingress.Error
	if !errors.As(err, &ie) || proxy.Requests() == 0 {
		t.Fatalf("call through the TLS proxy with its CA: %v (proxied requests %d); want Restate's own answer", err, proxy.Requests())
	}
	t.Logf("Restate answered through TLS: %v", err)
	if err := call(otherFile); err == nil || !strings.Contains(err.Error(), "unknown authority") {
		t.Fatalf("call with another CA: %v; want the proxy's certificate refused (unknown authority)", err)
	}
}
