package sdk

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"

	pluginv1 "krane.dev/sdk/internal/pluginv1"
)

// Host is what the krane host does for a plugin that only the host may do,
// because it needs the host's ctrl credentials: plugins never hold the
// cluster token. A plugin receives it in ConfigureRequest.Host.
//
// Wire: the host serves krane.plugin.v1.Host on a go-plugin GRPCBroker
// connection (protected by the same AutoMTLS as the plugin connection) and
// announces the broker id in Configure; the plugin dials it back.
type Host interface {
	// DecryptEnv opens a deployment's sealed secret environment (the
	// Deployment's encrypted_env) through ctrl. ctrl allows it only for a
	// deployment scheduled in this cluster's region, only for the blob it
	// stored for that deployment, and audits every call. With a sentinel id
	// (sen_...) it opens that sentinel's encrypted_credentials under the
	// same rules (the sentinel runs in this region). The host lets only the
	// plugin that reconciles the kind (deployment, or sentinel) ask. The
	// values are secrets: never log them, never put them in errors or
	// statuses.
	DecryptEnv(ctx context.Context, deploymentID string, sealed []byte) (map[string]string, error)
}

// DesiredStates is the part of the host that answers what ctrl wants for
// one object now. The Host a plugin receives implements it (an older krane
// host answers with an Unimplemented error); a plugin author's fake Host
// may leave it out, so assert it:
//
//	if ds, ok := host.(sdk.DesiredStates); ok { ... }
//
// kube.Repairer uses it to repair a hand-edited object at once instead of
// at the next resync.
type DesiredStates interface {
	// GetDesiredState returns the object's current desired state as a
	// Change (Deleted when ctrl wants it gone). The host answers only for
	// kinds the calling plugin reconciles. The version may be newer than
	// the last one the plugin applied: the host has not delivered it yet.
	GetDesiredState(ctx context.Context, kind, id string) (Change, error)
}

// ErrNoHostService is returned by the Host of a plugin whose host serves
// none (an older krane host).
var ErrNoHostService = errors.New("this krane host serves no host services to plugins (it sent no host_service_id): upgrade the krane host")

// noHost is the plugin's Host when the host serves none.
type noHost struct{}

func (noHost) DecryptEnv(context.Context, string, []byte) (map[string]string, error) {
	return nil, ErrNoHostService
}

func (noHost) GetDesiredState(context.Context, string, string) (Change, error) {
	return Change{}, ErrNoHostService
}

// hostServer serves krane.plugin.v1.Host in the host process by calling
// the Host of the latest Configure.
type hostServer struct {
	pluginv1.UnimplementedHostServer
	impl *atomic.Pointer[Host]
}

func (s *hostServer) DecryptEnv(ctx context.Context, req *pluginv1.DecryptEnvRequest) (*pluginv1.DecryptEnvResponse, error) {
	h := s.impl.Load()
	if h == nil {
		return nil, status.Error(codes.Unavailable, "the krane host has not configured its host services yet")
	}
	env, err := (*h).DecryptEnv(ctx, req.GetDeploymentId(), req.GetEncryptedEnv())
	if err != nil {
		if _, ok := status.FromError(err); ok {
			return nil, err // ctrl's code and reason, as the host got them
		}
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	return &pluginv1.DecryptEnvResponse{Env: env}, nil
}

func (s *hostServer) GetDesiredState(ctx context.Context, req *pluginv1.GetDesiredStateRequest) (*pluginv1.GetDesiredStateResponse, error) {
	h := s.impl.Load()
	if h == nil {
		return nil, status.Error(codes.Unavailable, "the krane host has not configured its host services yet")
	}
	ds, ok := (*h).(DesiredStates)
	if !ok {
		return nil, status.Error(codes.Unimplemented, "this krane host does not look up desired state for plugins")
	}
	ch, err := ds.GetDesiredState(ctx, req.GetKind(), req.GetId())
	if err != nil {
		if _, ok := status.FromError(err); ok {
			return nil, err
		}
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	resp := &pluginv1.GetDesiredStateResponse{Version: ch.Version, Deleted: ch.Deleted}
	if ch.Spec.TypeURL != "" {
		resp.Spec = &anypb.Any{TypeUrl: ch.Spec.TypeURL, Value: ch.Spec.Value}
	}
	return resp, nil
}

// hostBroker is the host side: it serves one plugin's Host once per plugin
// connection; a later Configure only swaps the implementation.
type hostBroker struct {
	broker *plugin.GRPCBroker
	impl   atomic.Pointer[Host]
	once   sync.Once
	id     uint32
}

// serve makes h answer the plugin's Host calls and returns the broker id to
// announce. The broker keeps serving until the plugin connection closes.
func (b *hostBroker) serve(h Host) uint32 {
	b.impl.Store(&h)
	b.once.Do(func() {
		b.id = b.broker.NextId()
		srv := &hostServer{impl: &b.impl}
		go b.broker.AcceptAndServe(b.id, func(opts []grpc.ServerOption) *grpc.Server {
			s := grpc.NewServer(append(opts, serverOptions()...)...)
			pluginv1.RegisterHostServer(s, srv)
			return s
		})
	})
	return b.id
}

// hostClient is the plugin side: the Host a plugin author calls.
type hostClient struct {
	client pluginv1.HostClient
	conn   *grpc.ClientConn
}

func (h *hostClient) DecryptEnv(ctx context.Context, deploymentID string, sealed []byte) (map[string]string, error) {
	resp, err := h.client.DecryptEnv(ctx, &pluginv1.DecryptEnvRequest{DeploymentId: deploymentID, EncryptedEnv: sealed})
	if err != nil {
		if st, ok := status.FromError(err); ok {
			return nil, fmt.Errorf("open the secret environment of deployment %s through the krane host: %s (%s)", deploymentID, st.Message(), st.Code())
		}
		return nil, fmt.Errorf("open the secret environment of deployment %s through the krane host: %w", deploymentID, err)
	}
	return resp.GetEnv(), nil
}

func (h *hostClient) GetDesiredState(ctx context.Context, kind, id string) (Change, error) {
	resp, err := h.client.GetDesiredState(ctx, &pluginv1.GetDesiredStateRequest{Kind: kind, Id: id})
	if err != nil {
		return Change{}, fmt.Errorf("get the desired state of %s %s through the krane host: %w", kind, id, err)
	}
	ch := Change{Kind: kind, ID: id, Version: resp.GetVersion(), Deleted: resp.GetDeleted()}
	if a := resp.GetSpec(); a != nil {
		ch.Spec = Spec{TypeURL: a.GetTypeUrl(), Value: a.GetValue()}
	}
	return ch, nil
}

// hostDialer is the plugin side of the broker: it dials the host's
// services once per announced id (the broker hands the connection info
// over only briefly, so it is dialled at Configure, not at first use).
type hostDialer struct {
	broker *plugin.GRPCBroker

	mu   sync.Mutex
	id   uint32
	host *hostClient
}

func (d *hostDialer) hostFor(id uint32) (Host, error) {
	if id == 0 || d.broker == nil {
		return noHost{}, nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.host != nil && d.id == id {
		return d.host, nil
	}
	conn, err := d.broker.DialWithOptions(id, dialOptions()...)
	if err != nil {
		return nil, fmt.Errorf("connect to the krane host's services (broker id %d): %w", id, err)
	}
	if d.host != nil {
		d.host.conn.Close()
	}
	d.id, d.host = id, &hostClient{client: pluginv1.NewHostClient(conn), conn: conn}
	return d.host, nil
}
