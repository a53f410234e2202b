package certreload

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// pair writes a self-signed certificate with the serial and validity given
// and its key, returning their PEM.
func pair(t *testing.T, serial int64, notBefore, notAfter time.Time) (certPEM, keyPEM []byte) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "c"}, NotBefore: notBefore, NotAfter: notAfter,
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kd, _ := x509.MarshalECPrivateKey(key)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kd})
}

func write(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestKeyPairAdoptsGoodVersionsOnlyAndReportsEachRefusalOnce: a new valid
// pair is adopted; an expired one, a mismatched key, garbage and a missing
// file are each refused once (reported once, however many handshakes
// look), and the last good pair stays.
func TestKeyPairAdoptsGoodVersionsOnlyAndReportsEachRefusalOnce(t *testing.T) {
	dir := t.TempDir()
	cf, kf := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	now := time.Now()
	c1, k1 := pair(t, 1, now.Add(-time.Hour), now.Add(time.Hour))
	write(t, cf, c1)
	write(t, kf, k1)
	var errs []string
	reloads := 0
	kp, err := LoadKeyPair(cf, kf, Options{Name: "grpc.tls_cert", OnError: func(_ string, err error) { errs = append(errs, err.Error()) },
		OnReload: func(string) { reloads++ }})
	if err != nil {
		t.Fatal(err)
	}
	serial := func() int64 { return kp.Current().Leaf.SerialNumber.Int64() }

	c2, k2 := pair(t, 2, now.Add(-time.Hour), now.Add(time.Hour))
	write(t, kf, k2)
	write(t, cf, c2)
	if s := serial(); s != 2 || reloads != 1 {
		t.Fatalf("after a valid new pair: serial %d, reloads %d; want 2, 1", s, reloads)
	}
	c3, _ := pair(t, 3, now.Add(-time.Hour), now.Add(time.Hour))
	ce, ke := pair(t, 4, now.Add(-2*time.Hour), now.Add(-time.Hour))
	for _, bad := range []struct {
		name, want string
		cert, key  []byte
	}{
		{"expired", "expired at", ce, ke},
		{"mismatched key", "private key does not match", c3, nil},
		{"garbage", "failed to find any PEM data", []byte("garbage"), nil},
	} {
		before := len(errs)
		if bad.key != nil {
			write(t, kf, bad.key)
		}
		write(t, cf, bad.cert)
		for i := 0; i < 3; i++ {
			if s := serial(); s != 2 {
				t.Fatalf("%s: serial %d adopted; want 2 kept", bad.name, s)
			}
		}
		if got := errs[before:]; len(got) != 1 || !strings.Contains(got[0], bad.want) {
			t.Fatalf("%s: refusals reported %q; want one naming %q", bad.name, got, bad.want)
		}
	}
	if err := os.Remove(cf); err != nil {
		t.Fatal(err)
	}
	before := len(errs)
	if s := serial(); s != 2 || len(errs) != before+1 {
		t.Fatalf("missing file: serial %d, new reports %d; want 2 kept, one report", serial(), len(errs)-before)
	}
	_ = serial()
	if len(errs) != before+1 {
		t.Fatalf("missing file reported %d times on two looks; want once", len(errs)-before)
	}
}

// TestCAPoolRefusesBundlesWithoutAValidCertificate: an empty bundle and one
// whose only certificate has expired are refused; the previous pool stays.
func TestCAPoolRefusesBundlesWithoutAValidCertificate(t *testing.T) {
	file := filepath.Join(t.TempDir(), "ca.pem")
	now := time.Now()
	good, _ := pair(t, 1, now.Add(-time.Hour), now.Add(time.Hour))
	write(t, file, good)
	var errs []string
	p, err := LoadCAPool(file, Options{Name: "grpc.client_ca", OnError: func(_ string, err error) { errs = append(errs, err.Error()) }})
	if err != nil {
		t.Fatal(err)
	}
	first := p.Current()
	expired, _ := pair(t, 2, now.Add(-2*time.Hour), now.Add(-time.Hour))
	for _, bad := range []struct {
		name, want string
		data       []byte
	}{
		{"empty", "holds no PEM certificate", []byte("nothing here\n")},
		{"expired", "no certificate valid now", expired},
	} {
		write(t, file, bad.data)
		if p.Current() != first {
			t.Fatalf("%s bundle adopted", bad.name)
		}
		if !strings.Contains(errs[len(errs)-1], bad.want) {
			t.Fatalf("%s bundle: reported %q; want %q", bad.name, errs[len(errs)-1], bad.want)
		}
	}
}
