// Package ctrltest starts a real ctrl for tests: a fresh database on the
// test package's MySQL server (internal/testenv), the production server
// wiring from ctrl/serve on loopback listeners, and gRPC clients that carry a
// bearer token. Nothing is mocked.
package ctrltest

import (
	"bytes"
	"context"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"krane.dev/ctrl/auth"
	"krane.dev/ctrl/restateingress"
	"krane.dev/ctrl/serve"
	"krane.dev/ctrl/store"
	"krane.dev/internal/testenv"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
)

// Options adjust a test ctrl.
type Options struct {
	// DSN reuses a database (for a second ctrl on the same data); empty
	// creates a fresh one.
	DSN string
	// Configure changes the configuration before start.
	Configure func(*serve.Config)
	Deps      serve.Deps
	// Restate, when set, turns ctrl's Restate side on against this server:
	// the deploy workflows, the deploy API and the Notifier. Start waits
	// until the endpoint is registered.
	Restate *testenv.Restate
	// RestateListen is the endpoint's listen address (default a free
	// port). A ctrl started again on the same data must reuse it: Restate
	// retries an invocation at the URL it started on.
	RestateListen string
}

// SentinelImage is the sentinel.default_image of a test ctrl.
const SentinelImage = "registry.test/krane/sentinel:1.0.0"

// Env is a running test ctrl.
type Env struct {
	Server *serve.Server
	Store  *store.Store
	DSN    string
	Logs   *LogBuffer
	// Restate is the server ctrl runs its services on (nil without).
	Restate *testenv.Restate
}

// Config is the base configuration of a test ctrl (loopback listeners on
// free ports, fast polling).
func Config(dsn string) serve.Config {
	cfg, err := serve.LoadConfig(nil)
	if err != nil {
		panic(err)
	}
	cfg.DB.DSN = dsn
	cfg.GRPC.Addr = "127.0.0.1:0"
	cfg.HTTP.Addr = "127.0.0.1:0"
	cfg.Log.Level = "debug"
	cfg.Log.Format = "text"
	return cfg
}

// Start starts a ctrl; it stops when the test ends.
func Start(t testing.TB, o Options) *Env {
	t.Helper()
	dsn := o.DSN
	if dsn == "" {
		dsn = testenv.SharedMySQL(t).Database(t, t.Name())
	}
	cfg := Config(dsn)
	if o.Restate != nil {
		cfg.Restate.IngressURL = o.Restate.IngressURL()
		cfg.Restate.AdminURL = o.Restate.AdminURL()
		cfg.Restate.Endpoint.Listen = "127.0.0.1:0"
		if o.RestateListen != "" {
			cfg.Restate.Endpoint.Listen = o.RestateListen
		}
		cfg.Sentinel.DefaultImage = SentinelImage
		cfg.Restate.IdentityKeys = o.Restate.IdentityKey()
	}
	if o.Configure != nil {
		o.Configure(&cfg)
	}
	logs := &LogBuffer{}
	log := serve.NewLogger(cfg.Log, logs)
	// The server lives until Stop (cancelling Start's context stops it).
	srv, err := serve.Start(context.Background(), cfg, log, o.Deps)
	if err != nil {
		t.Fatalf("start ctrl: %v", err)
	}
	t.Cleanup(func() {
		_ = srv.Stop()
		if t.Failed() {
			t.Logf("ctrl logs:\n%s", logs.String())
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := srv.WaitRestateRegistered(ctx); err != nil {
		t.Fatalf("start ctrl: %v\nlogs:\n%s", err, logs.String())
	}
	return &Env{Server: srv, Store: srv.Store(), DSN: dsn, Logs: logs, Restate: o.Restate}
}

// Ingress is a client of Restate's ingress that calls ctrl's services the
// way ctrl does (signed with its key); waiting: without an overall timeout.
func (e *Env) Ingress(t testing.TB, waiting bool) *restateingress.Ingress {
	t.Helper()
	key, err := e.Store.CtrlKey(context.Background(), store.RestateIngressKey)
	if err != nil {
		t.Fatal(err)
	}
	if waiting {
		return restateingress.NewWaitingIngressClient(e.Restate.IngressURL(), key)
	}
	return restateingress.NewIngressClient(e.Restate.IngressURL(), key)
}

// ClusterToken registers a cluster and returns its token.
func (e *Env) ClusterToken(t testing.TB, region, cluster string) string {
	t.Helper()
	tok, err := auth.RegisterCluster(context.Background(), e.Store, region, cluster)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// OperatorToken creates an operator token.
func (e *Env) OperatorToken(t testing.TB, name string) string {
	t.Helper()
	tok, err := auth.CreateOperatorToken(context.Background(), e.Store, name)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// Dial connects to the server's gRPC address; every call carries token
// (when not empty) and the extra metadata pairs.
func (e *Env) Dial(t testing.TB, token string, kv ...string) *grpc.ClientConn {
	t.Helper()
	return Dial(t, e.Server.GRPCAddr(), token, kv...)
}

// Dial connects to addr with plaintext h2c.
func Dial(t testing.TB, addr, token string, kv ...string) *grpc.ClientConn {
	t.Helper()
	md := metadata.Pairs(kv...)
	if token != "" {
		md.Append("authorization", "Bearer "+token)
	}
	conn, err := grpc.NewClient(addr,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			return invoker(metadata.NewOutgoingContext(ctx, md), method, req, reply, cc, opts...)
		}),
		grpc.WithStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			return streamer(metadata.NewOutgoingContext(ctx, md), desc, cc, method, opts...)
		}),
	)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// Cluster is a ClusterService client for token.
func (e *Env) Cluster(t testing.TB, token string, kv ...string) clusterv1.ClusterServiceClient {
	return clusterv1.NewClusterServiceClient(e.Dial(t, token, kv...))
}

// LogBuffer collects a server's log output.
type LogBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *LogBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *LogBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
