// Package ctrlclient connects the krane host to ctrl's ClusterService: TLS
// (optionally mTLS, with the CA and client certificate read again when
// they change on disk) or, when the URL says http://, plaintext; every call
// carries the cluster's bearer token and identity (region, cluster id);
// keep-alive pings hold idle streams open through proxies.
package ctrlclient

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/url"
	"os"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"

	"krane.dev/host/config"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
	"krane.dev/shared/certreload"
)

// Metadata keys carrying the cluster identity.
const (
	RegionHeader  = "x-krane-region"
	ClusterHeader = "x-krane-cluster-id"
)

// MaxMessageSize bounds messages from ctrl (one change or page).
const MaxMessageSize = 64 << 20

// Dial connects to ctrl as described by cfg. The connection is lazy: a
// ctrl that is down now is retried by gRPC, and by the sync loops.
func Dial(cfg *config.Config, userAgent string) (*grpc.ClientConn, error) {
	return DialLogged(cfg, userAgent, nil)
}

// DialLogged is Dial with a logger for the reloads of the TLS files
// (control_plane.ca_file, client_cert_file/client_key_file): they are read
// again when they change on disk, on the next handshake, so a renewed
// client certificate or CA needs no restart; a new version that does not
// load is logged and the previous one stays in use.
func DialLogged(cfg *config.Config, userAgent string, log hclog.Logger) (*grpc.ClientConn, error) {
	u, err := url.Parse(cfg.ControlPlane.URL)
	if err != nil {
		return nil, fmt.Errorf("control_plane.url: %w", err)
	}
	creds := &perRPC{cp: cfg.ControlPlane, region: cfg.Region, cluster: cfg.ClusterID, secure: u.Scheme == "https"}
	opts := []grpc.DialOption{
		grpc.WithPerRPCCredentials(creds),
		grpc.WithUserAgent(userAgent),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(MaxMessageSize)),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 30 * time.Second, Timeout: 10 * time.Second, PermitWithoutStream: true}),
	}
	if u.Scheme == "https" {
		tc, err := transportCredentials(cfg.ControlPlane, u.Hostname(), log)
		if err != nil {
			return nil, err
		}
		opts = append(opts, grpc.WithTransportCredentials(tc))
	} else {
		opts = append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()))
	}
	return grpc.NewClient(u.Host, opts...)
}

// New returns the ClusterService client on conn.
func New(conn grpc.ClientConnInterface) clusterv1.ClusterServiceClient {
	return clusterv1.NewClusterServiceClient(conn)
}

func transportCredentials(cp config.ControlPlane, serverName string, log hclog.Logger) (credentials.TransportCredentials, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: serverName}
	var roots *certreload.CAPool
	var kp *certreload.KeyPair
	var err error
	if cp.CAFile != "" {
		if roots, err = certreload.LoadCAPool(cp.CAFile, certreload.Options{Log: log, Name: "control_plane.ca_file"}); err != nil {
			return nil, err
		}
	}
	if cp.ClientCertFile != "" {
		if kp, err = certreload.LoadKeyPair(cp.ClientCertFile, cp.ClientKeyFile, certreload.Options{Log: log, Name: "control_plane.client_cert_file"}); err != nil {
			return nil, err
		}
	}
	return certreload.ClientCredentials(tc, roots, kp), nil
}

// perRPC adds the token and identity to every call. A token file is
// re-read when its modification time changes, so rotating it needs no
// restart.
type perRPC struct {
	cp              config.ControlPlane
	region, cluster string
	secure          bool

	mu      sync.Mutex
	token   string
	modTime time.Time
}

func (p *perRPC) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	tok, err := p.currentToken()
	if err != nil {
		return nil, err
	}
	return map[string]string{"authorization": "Bearer " + tok, RegionHeader: p.region, ClusterHeader: p.cluster}, nil
}

func (p *perRPC) RequireTransportSecurity() bool { return p.secure }

func (p *perRPC) currentToken() (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cp.TokenFile != "" {
		st, err := os.Stat(p.cp.TokenFile)
		if err != nil {
			return "", fmt.Errorf("control_plane.token_file: %w", err)
		}
		if p.token != "" && st.ModTime().Equal(p.modTime) {
			return p.token, nil
		}
		p.modTime = st.ModTime()
	} else if p.token != "" {
		return p.token, nil
	}
	tok, err := p.cp.ReadToken()
	if err != nil {
		return "", err
	}
	p.token = tok
	return tok, nil
}
