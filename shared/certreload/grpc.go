package certreload

import (
	"context"
	"crypto/tls"
	"net"

	"google.golang.org/grpc/credentials"
)

// ClientCredentials are gRPC transport credentials for a TLS client whose
// trusted roots (roots; the system roots when nil) and client certificate
// (kp; none when nil) are looked up again on each handshake. tls.Config
// has no per-handshake hook for a client's roots, so each handshake builds
// its configuration from base and the current files.
func ClientCredentials(base *tls.Config, roots *CAPool, kp *KeyPair) credentials.TransportCredentials {
	base = base.Clone()
	if kp != nil {
		base.GetClientCertificate = kp.GetClientCertificate
	}
	return &clientCreds{base: base, roots: roots, info: credentials.NewTLS(base).Info()}
}

type clientCreds struct {
	base  *tls.Config
	roots *CAPool
	info  credentials.ProtocolInfo
}

func (c *clientCreds) current() credentials.TransportCredentials {
	conf := c.base.Clone()
	if c.roots != nil {
		conf.RootCAs = c.roots.Current()
	}
	return credentials.NewTLS(conf)
}

func (c *clientCreds) ClientHandshake(ctx context.Context, authority string, conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return c.current().ClientHandshake(ctx, authority, conn)
}

func (c *clientCreds) ServerHandshake(conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return c.current().ServerHandshake(conn)
}

func (c *clientCreds) Info() credentials.ProtocolInfo { return c.info }

func (c *clientCreds) Clone() credentials.TransportCredentials {
	return &clientCreds{base: c.base.Clone(), roots: c.roots, info: c.info}
}

// OverrideServerName is part of credentials.TransportCredentials
// (deprecated there); it sets the name the server's certificate is
// verified against.
func (c *clientCreds) OverrideServerName(name string) error {
	c.base.ServerName = name
	return nil
}
