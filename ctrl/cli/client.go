package cli

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
)

// apiFlags are how the operator commands reach ctrl's gRPC API. Every flag
// has a CTRL_* variable; the flag wins.
type apiFlags struct {
	addr, token                  string
	tlsCA, tlsCert, tlsKey, name string
	output                       string
}

func (f *apiFlags) add(cmd *cobra.Command) {
	addOutputFlag(cmd, &f.output, true)
	fs := cmd.PersistentFlags()
	fs.StringVar(&f.addr, "addr", envOr("CTRL_ADDR", "127.0.0.1:7443"),
		"ctrl's gRPC address: host:port (plaintext unless a --tls-* flag is set), http://host:port or https://host:port (env CTRL_ADDR)")
	fs.StringVar(&f.token, "token", "", "operator token (env CTRL_TOKEN; prefer the variable: flags show up in process lists)")
	fs.StringVar(&f.tlsCA, "tls-ca", os.Getenv("CTRL_TLS_CA"), "CA bundle (PEM) that signed ctrl's certificate; default the system roots (env CTRL_TLS_CA)")
	fs.StringVar(&f.tlsCert, "tls-cert", os.Getenv("CTRL_TLS_CERT"), "client certificate (PEM) when ctrl requires mTLS (env CTRL_TLS_CERT)")
	fs.StringVar(&f.tlsKey, "tls-key", os.Getenv("CTRL_TLS_KEY"), "client key (PEM) for --tls-cert (env CTRL_TLS_KEY)")
	fs.StringVar(&f.name, "tls-server-name", os.Getenv("CTRL_TLS_SERVER_NAME"), "name to verify ctrl's certificate against; default the host of --addr (env CTRL_TLS_SERVER_NAME)")
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// format is the command's -o.
func (f *apiFlags) format() (output, error) { return parseOutput(f.output) }

// dial connects to ctrl; every call carries the operator token.
func (f *apiFlags) dial() (*grpc.ClientConn, error) {
	token := f.token
	if token == "" {
		token = os.Getenv("CTRL_TOKEN")
	}
	if token == "" {
		return nil, errors.New("no operator token: set CTRL_TOKEN (or --token); create one with `ctrl admin token create-operator`")
	}
	addr, useTLS := f.addr, f.tlsCA != "" || f.tlsCert != ""
	switch {
	case strings.HasPrefix(addr, "https://"):
		addr, useTLS = strings.TrimPrefix(addr, "https://"), true
	case strings.HasPrefix(addr, "http://"):
		if useTLS {
			return nil, fmt.Errorf("--addr %s says plaintext but --tls-ca/--tls-cert ask for TLS", f.addr)
		}
		addr = strings.TrimPrefix(addr, "http://")
	}
	creds := insecure.NewCredentials()
	if useTLS {
		tc, err := f.tlsConfig(addr)
		if err != nil {
			return nil, err
		}
		creds = credentials.NewTLS(tc)
	}
	md := metadata.Pairs("authorization", "Bearer "+token)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds),
		grpc.WithUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			return invoker(metadata.NewOutgoingContext(ctx, md), method, req, reply, cc, opts...)
		}))
	if err != nil {
		return nil, fmt.Errorf("connect to ctrl at %s: %w", f.addr, err)
	}
	return conn, nil
}

func (f *apiFlags) tlsConfig(addr string) (*tls.Config, error) {
	name := f.name
	if name == "" {
		name = addr
		if i := strings.LastIndex(addr, ":"); i > 0 {
			name = addr[:i]
		}
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: strings.Trim(name, "[]")}
	if f.tlsCA != "" {
		pem, err := os.ReadFile(f.tlsCA)
		if err != nil {
			return nil, fmt.Errorf("--tls-ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--tls-ca %s holds no PEM certificate", f.tlsCA)
		}
		tc.RootCAs = pool
	}
	if (f.tlsCert == "") != (f.tlsKey == "") {
		return nil, errors.New("--tls-cert and --tls-key go together")
	}
	if f.tlsCert != "" {
		cert, err := tls.LoadX509KeyPair(f.tlsCert, f.tlsKey)
		if err != nil {
			return nil, fmt.Errorf("load the client certificate %s and key %s: %w", f.tlsCert, f.tlsKey, err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}
