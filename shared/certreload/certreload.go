// Package certreload keeps the TLS certificates and CA bundles a process
// reads from files current without a restart. Every TLS handshake reads
// the files (a few kilobytes: cheap next to the handshake) and parses them
// again when one changed, so a certificate renewed on disk
// (cert-manager, a Secret volume's atomic swap, a cron job) is presented,
// or trusted, by the next handshake. Connections already open keep the
// certificate they were made with; TLS does not change it mid-connection.
//
// A new file that does not load is refused and the last good version stays
// in use: unparsable PEM, a key that does not match its certificate, a
// certificate expired or not yet valid, a CA bundle holding no certificate
// valid now. The refusal is reported once per version of the files
// (Options.OnError and the log), so a reload never leaves a process worse
// off than before it.
package certreload

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
)

// Options are the hooks of a reloader. All are optional.
type Options struct {
	// Log receives a line for each reload and each refused version.
	Log hclog.Logger
	// Name says which setting the files come from in logs and errors,
	// e.g. "grpc.tls_cert".
	Name string
	// OnReload is called after a changed version was adopted.
	OnReload func(name string)
	// OnError is called once for each version of the files that was
	// refused (or could not be read), with the reason.
	OnError func(name string, err error)
	// Now is the clock validity is checked against (time.Now when nil).
	Now func() time.Time
}

func (o Options) now() time.Time {
	if o.Now != nil {
		return o.Now()
	}
	return time.Now()
}

// stamp is what says a file changed: its content. Modification times
// alone miss a rewrite of the same size within the file system's timestamp
// granularity (a few milliseconds on Linux), and certificate files are a
// few kilobytes, so reading them on each handshake costs little next to
// the handshake itself.
type stamp []byte

func stamps(files []string) ([]stamp, error) {
	out := make([]stamp, len(files))
	for i, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		out[i] = b
	}
	return out, nil
}

func sameStamps(a, b []stamp) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !bytes.Equal(a[i], b[i]) {
			return false
		}
	}
	return true
}

// watched is one loaded value and the files it came from.
type watched[T any] struct {
	files []string
	load  func() (T, error)
	opts  Options

	mu      sync.Mutex
	cur     T
	seen    []stamp // the version last tried, adopted or refused
	lastErr string  // the last read error reported, so it is reported once
}

func newWatched[T any](files []string, load func() (T, error), o Options) (*watched[T], error) {
	w := &watched[T]{files: files, load: load, opts: o}
	st, err := stamps(files)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", o.Name, err)
	}
	v, err := load()
	if err != nil {
		return nil, err
	}
	w.cur, w.seen = v, st
	return w, nil
}

// get returns the current value, reading the files again first when they
// changed since the last look.
func (w *watched[T]) get() T {
	w.mu.Lock()
	defer w.mu.Unlock()
	st, err := stamps(w.files)
	if err != nil {
		// A file missing or unreadable for a moment (replaced by a tool
		// that deletes first) is not a new version: keep serving, say so
		// once.
		if msg := err.Error(); msg != w.lastErr {
			w.lastErr = msg
			w.refused(fmt.Errorf("%s: %w", w.opts.Name, err))
		}
		return w.cur
	}
	w.lastErr = ""
	if sameStamps(st, w.seen) {
		return w.cur
	}
	w.seen = st
	v, err := w.load()
	if err != nil {
		w.refused(err)
		return w.cur
	}
	w.cur = v
	if w.opts.Log != nil {
		w.opts.Log.Info("TLS files changed on disk: reloaded", "setting", w.opts.Name, "files", w.files)
	}
	if w.opts.OnReload != nil {
		w.opts.OnReload(w.opts.Name)
	}
	return w.cur
}

func (w *watched[T]) refused(err error) {
	if w.opts.Log != nil {
		w.opts.Log.Error("TLS files changed on disk but the new version is refused; the previous one stays in use until they are fixed",
			"setting", w.opts.Name, "files", w.files, "error", err)
	}
	if w.opts.OnError != nil {
		w.opts.OnError(w.opts.Name, err)
	}
}

// KeyPair is a certificate and its private key, read again when either
// file changes.
type KeyPair struct {
	w *watched[*tls.Certificate]
}

// LoadKeyPair reads a certificate (PEM, leaf first, then intermediates)
// and its key. The error names the files and what is wrong with them.
func LoadKeyPair(certFile, keyFile string, o Options) (*KeyPair, error) {
	load := func() (*tls.Certificate, error) {
		c, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("%s: load certificate %s and key %s: %w", o.Name, certFile, keyFile, err)
		}
		if err := checkValidity(c.Leaf, o.now()); err != nil {
			return nil, fmt.Errorf("%s: certificate %s: %w", o.Name, certFile, err)
		}
		return &c, nil
	}
	w, err := newWatched([]string{certFile, keyFile}, load, o)
	if err != nil {
		return nil, err
	}
	return &KeyPair{w: w}, nil
}

func checkValidity(c *x509.Certificate, now time.Time) error {
	if c == nil {
		return errors.New("no certificate")
	}
	if now.After(c.NotAfter) {
		return fmt.Errorf("expired at %s (serial %s, subject %q)", c.NotAfter.UTC().Format(time.RFC3339), c.SerialNumber, c.Subject)
	}
	if now.Before(c.NotBefore) {
		return fmt.Errorf("not valid before %s (serial %s, subject %q)", c.NotBefore.UTC().Format(time.RFC3339), c.SerialNumber, c.Subject)
	}
	return nil
}

// Current is the certificate to present now.
func (k *KeyPair) Current() *tls.Certificate { return k.w.get() }

// GetCertificate is for tls.Config.GetCertificate (servers).
func (k *KeyPair) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return k.Current(), nil
}

// GetClientCertificate is for tls.Config.GetClientCertificate (clients).
func (k *KeyPair) GetClientCertificate(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	return k.Current(), nil
}

// CAPool is a CA bundle, read again when its file changes.
type CAPool struct {
	w *watched[*x509.CertPool]
}

// LoadCAPool reads a CA bundle (PEM). A bundle must hold at least one
// certificate valid now, and every CERTIFICATE block in it must parse: a
// truncated file is refused rather than trusted in part.
func LoadCAPool(file string, o Options) (*CAPool, error) {
	load := func() (*x509.CertPool, error) {
		data, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("%s: read CA bundle: %w", o.Name, err)
		}
		pool, valid, n := x509.NewCertPool(), 0, 0
		for rest := data; ; {
			var b *pem.Block
			if b, rest = pem.Decode(rest); b == nil {
				break
			}
			if b.Type != "CERTIFICATE" {
				continue
			}
			n++
			c, err := x509.ParseCertificate(b.Bytes)
			if err != nil {
				return nil, fmt.Errorf("%s: CA bundle %s, certificate %d: %w", o.Name, file, n, err)
			}
			pool.AddCert(c)
			if checkValidity(c, o.now()) == nil {
				valid++
			}
		}
		if n == 0 {
			return nil, fmt.Errorf("%s: CA bundle %s holds no PEM certificate", o.Name, file)
		}
		if valid == 0 {
			return nil, fmt.Errorf("%s: CA bundle %s holds no certificate valid now (all %d expired or not yet valid)", o.Name, file, n)
		}
		return pool, nil
	}
	w, err := newWatched([]string{file}, load, o)
	if err != nil {
		return nil, err
	}
	return &CAPool{w: w}, nil
}

// Current is the pool to verify against now.
func (p *CAPool) Current() *x509.CertPool { return p.w.get() }

// ServerConfig is a server's TLS configuration presenting kp and, when
// clientCAs is set, requiring a client certificate it signed. Both are
// looked up on each handshake. nextProtos is the ALPN list (gRPC: "h2"):
// the per-handshake configuration replaces the one a library built, so
// it must carry them itself.
//
// Session tickets are off: a resumed session would skip the client
// certificate check against the CA bundle in force now. Connections here
// are long-lived, so full handshakes cost nothing that matters.
func ServerConfig(kp *KeyPair, clientCAs *CAPool, nextProtos ...string) *tls.Config {
	base := &tls.Config{
		MinVersion:             tls.VersionTLS12,
		GetCertificate:         kp.GetCertificate,
		NextProtos:             nextProtos,
		SessionTicketsDisabled: true,
	}
	if clientCAs == nil {
		return base
	}
	conf := base.Clone()
	conf.ClientAuth = tls.RequireAndVerifyClientCert
	conf.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		c := base.Clone()
		c.ClientAuth = tls.RequireAndVerifyClientCert
		c.ClientCAs = clientCAs.Current()
		return c, nil
	}
	return conf
}

// ClientConfig is a TLS client configuration for libraries that take one
// tls.Config for every connection they open (database drivers): the
// server's certificate is verified against roots as they are at each
// handshake (the system roots when roots is nil), for serverName (empty:
// the name the connection was made to, as net/http sets it), and kp
// (when set) is the client certificate. tls.Config has no per-handshake
// hook for a client's roots, so verification is done in VerifyConnection
// with the standard x509 chain and host name checks, and the built-in one
// is turned off only in favour of it.
func ClientConfig(serverName string, roots *CAPool, kp *KeyPair) *tls.Config {
	conf := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: serverName}
	if kp != nil {
		conf.GetClientCertificate = kp.GetClientCertificate
	}
	if roots == nil {
		return conf
	}
	conf.InsecureSkipVerify = true // replaced by VerifyConnection below, never skipped
	conf.VerifyConnection = func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return errors.New("the server presented no certificate")
		}
		inter := x509.NewCertPool()
		for _, c := range cs.PeerCertificates[1:] {
			inter.AddCert(c)
		}
		name := serverName
		if name == "" {
			name = cs.ServerName // the dialled host, which net/http puts in ServerName
		}
		if name == "" {
			return errors.New("no server name to verify the server's certificate for")
		}
		_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: roots.Current(), Intermediates: inter, DNSName: name})
		if err != nil {
			return fmt.Errorf("verify the server's certificate against %s: %w", roots.w.opts.Name, err)
		}
		return nil
	}
	return conf
}
