package serve

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"

	"krane.dev/ctrl/console"
	"krane.dev/ctrl/store"
	"krane.dev/shared/certreload"
)

// The console reaches the operator API through ctrl's own gRPC server, on
// an in-memory listener: every call it makes on a signed-in operator's
// behalf passes the same authentication interceptor, with the operator's
// token, as a CLI call over the network. The connection never leaves the
// process, so it needs no TLS; the transport credentials below let exactly
// these connections through without a handshake and hand every other one
// to the configured credentials (TLS, mTLS or h2c).

// inprocConn marks a connection accepted on the in-memory listener.
type inprocConn struct{ net.Conn }

type inprocListener struct{ *bufconn.Listener }

func (l inprocListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return inprocConn{c}, nil
}

// inprocCreds are the server's transport credentials, with in-process
// connections let through as they are.
type inprocCreds struct {
	credentials.TransportCredentials
}

func (c inprocCreds) ServerHandshake(conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	if _, ok := conn.(inprocConn); ok {
		return insecure.NewCredentials().ServerHandshake(conn)
	}
	return c.TransportCredentials.ServerHandshake(conn)
}

func (c inprocCreds) Clone() credentials.TransportCredentials {
	return inprocCreds{c.TransportCredentials.Clone()}
}

// consoleServer is the web console while it runs.
type consoleServer struct {
	lis    net.Listener
	inproc inprocListener
	conn   *grpc.ClientConn
	http   *http.Server
	cancel context.CancelFunc
	tls    bool
}

// inprocBuffer is the in-memory connection's buffer per direction.
const inprocBuffer = 1 << 20

// startConsole listens on console.addr and connects the console to gs in
// process. gs must be served on the returned server's inproc listener.
func startConsole(cfg Config, gs *grpc.Server, st *store.Store, log hclog.Logger, reg prometheus.Registerer) (*consoleServer, error) {
	k := cfg.Console
	cs := &consoleServer{inproc: inprocListener{bufconn.Listen(inprocBuffer)}, tls: k.TLSCert != ""}
	recv, send := cfg.GRPC.MaxRecvBytes, cfg.GRPC.MaxSendBytes
	if recv <= 0 {
		recv = 16 << 20
	}
	if send <= 0 {
		send = 16 << 20
	}
	conn, err := grpc.NewClient("passthrough:///ctrl-console",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return cs.inproc.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(send), grpc.MaxCallSendMsgSize(recv)))
	if err != nil {
		return nil, fmt.Errorf("console: connect to the operator API: %w", err)
	}
	cs.conn = conn
	con, err := console.New(console.Options{
		Conn: conn, Sessions: st, SessionTTL: k.SessionTTL, LivePerToken: k.LivePerToken, SecureCookie: k.SecureCookie || cs.tls, Log: log, Registerer: reg,
	})
	if err != nil {
		conn.Close()
		return nil, err
	}
	var tlsConf *tls.Config
	if cs.tls {
		// Read again when the files change, like grpc.tls_cert.
		kp, err := certreload.LoadKeyPair(k.TLSCert, k.TLSKey, certreload.Options{Log: log, Name: "console.tls_cert"})
		if err != nil {
			conn.Close()
			return nil, fmt.Errorf("console: %w", err)
		}
		tlsConf = certreload.ServerConfig(kp, nil)
	}
	lis, err := net.Listen("tcp", k.Addr)
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("listen for the console on %s (console.addr): %w", k.Addr, err)
	}
	if tlsConf != nil {
		lis = tls.NewListener(lis, tlsConf)
	}
	cs.lis = lis
	// Live pages hold their requests open; cancelling the base context
	// ends them, so a shutdown does not wait for them.
	base, cancel := context.WithCancel(context.Background())
	cs.cancel = cancel
	cs.http = &http.Server{
		Handler: con.Handler(), ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 30 * time.Second, IdleTimeout: 2 * time.Minute,
		BaseContext: func(net.Listener) context.Context { return base },
		ErrorLog:    log.Named("console").StandardLogger(&hclog.StandardLoggerOptions{InferLevels: true}),
	}
	return cs, nil
}

// serve runs the console's HTTP server until stop.
func (cs *consoleServer) serve() error {
	if err := cs.http.Serve(cs.lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// URL is where the console is reached.
func (cs *consoleServer) URL() string {
	scheme := "http"
	if cs.tls {
		scheme = "https"
	}
	return scheme + "://" + cs.lis.Addr().String()
}

// stop ends live pages, then the HTTP server, then the in-process
// connection (gs's graceful stop closes the in-memory listener).
func (cs *consoleServer) stop() {
	cs.cancel()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = cs.http.Shutdown(ctx)
	_ = cs.conn.Close()
}
