package sdk

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/timestamppb"

	pluginv1 "krane.dev/proto/krane/plugin/v1"
)

// ErrPluginExited is returned by calls on a plugin whose process has exited.
var ErrPluginExited = errors.New("plugin process exited")

// grpcController is the host-side shim: it implements Controller by calling a
// plugin over krane.plugin.v1.
type grpcController struct {
	client  pluginv1.ControllerClient
	doneCtx context.Context // cancelled by go-plugin when the process exits
	host    *hostBroker     // nil without a broker: no Host is served
}

// NewGRPCController returns a Controller that talks to a plugin over conn.
// doneCtx should end when the plugin process exits (go-plugin provides it);
// calls then fail with ErrPluginExited instead of a transport error.
func NewGRPCController(doneCtx context.Context, conn grpc.ClientConnInterface) Controller {
	if doneCtx == nil {
		doneCtx = context.Background()
	}
	return &grpcController{client: pluginv1.NewControllerClient(conn), doneCtx: doneCtx}
}

func (c *grpcController) Describe(ctx context.Context) (Info, error) {
	resp, err := c.client.Describe(ctx, &pluginv1.DescribeRequest{HostProtocolVersions: []uint32{ProtocolVersion}})
	if err != nil {
		return Info{}, c.wrap("describe", err)
	}
	info := Info{Name: resp.GetName(), Version: resp.GetPluginVersion(), ConfigSchema: resp.GetConfigSchema()}
	for _, k := range resp.GetKinds() {
		info.Kinds = append(info.Kinds, KindInfo{Kind: k.GetKind(), Description: k.GetDescription(), SpecType: k.GetSpecType()})
	}
	if !speaks(resp.GetProtocolVersions(), ProtocolVersion) {
		return info, fmt.Errorf("plugin %q speaks plugin protocol versions %v, this host speaks %d: upgrade the plugin or the host", info.Name, resp.GetProtocolVersions(), ProtocolVersion)
	}
	return info, nil
}

func (c *grpcController) Configure(ctx context.Context, req ConfigureRequest) error {
	kc := &pluginv1.Kubeconfig{Context: req.Kube.Context, Qps: req.Kube.QPS, Burst: int32(req.Kube.Burst)}
	if req.Kube.InCluster {
		kc.Source = &pluginv1.Kubeconfig_InCluster{InCluster: true}
	} else {
		kc.Source = &pluginv1.Kubeconfig_Path{Path: req.Kube.Path}
	}
	var hostID uint32
	if req.Host != nil && c.host != nil {
		hostID = c.host.serve(req.Host)
	}
	_, err := c.client.Configure(ctx, &pluginv1.ConfigureRequest{
		ProtocolVersion: ProtocolVersion,
		Region:          req.Region,
		ClusterId:       req.ClusterID,
		Kubeconfig:      kc,
		ConfigJson:      req.Config,
		HostServiceId:   hostID,
	})
	if st, ok := status.FromError(err); ok && st.Code() == codes.InvalidArgument {
		return &ConfigError{Reason: st.Message()}
	}
	return c.wrap("configure", err)
}

func (c *grpcController) Apply(ctx context.Context, ch Change) (Result, error) {
	req := &pluginv1.ApplyRequest{Kind: ch.Kind, Id: ch.ID, Version: ch.Version, Deleted: ch.Deleted}
	if !ch.Spec.IsZero() {
		req.Spec = &anypb.Any{TypeUrl: ch.Spec.TypeURL, Value: ch.Spec.Value}
	}
	resp, err := c.client.Apply(ctx, req)
	if err != nil {
		return 0, c.wrap("apply", err)
	}
	if e := resp.GetError(); e != nil {
		if e.GetPermanent() {
			// The message already starts with "field: " (PermanentError.Error).
			msg := strings.TrimPrefix(e.GetMessage(), e.GetField()+": ")
			return 0, &PermanentError{Field: e.GetField(), Err: errors.New(msg)}
		}
		return 0, errors.New(e.GetMessage())
	}
	switch resp.GetResult() {
	case pluginv1.ApplyResult_APPLY_RESULT_APPLIED:
		return Applied, nil
	case pluginv1.ApplyResult_APPLY_RESULT_UNCHANGED:
		return Unchanged, nil
	case pluginv1.ApplyResult_APPLY_RESULT_DELETED:
		return Deleted, nil
	}
	return 0, fmt.Errorf("plugin returned no result for %s %s", ch.Kind, ch.ID)
}

func (c *grpcController) Inventory(ctx context.Context, kind string) ([]InventoryItem, error) {
	stream, err := c.client.Inventory(ctx, &pluginv1.InventoryRequest{Kind: kind})
	if err != nil {
		return nil, c.wrap("inventory", err)
	}
	var items []InventoryItem
	for {
		it, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return items, nil
		}
		if err != nil {
			return nil, c.wrap("inventory", err)
		}
		items = append(items, InventoryItem{Kind: it.GetKind(), ID: it.GetId(), Version: it.GetVersion(), SpecHash: it.GetSpecHash()})
	}
}

// WatchStatus delivers reports whose Status is the packed *anypb.Any, so the
// host can forward a kind's status without knowing its type.
func (c *grpcController) WatchStatus(ctx context.Context, send func(StatusReport) error) error {
	stream, err := c.client.WatchStatus(ctx, &pluginv1.WatchStatusRequest{})
	if err != nil {
		return c.wrap("watch status", err)
	}
	for {
		msg, err := stream.Recv()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if errors.Is(err, io.EOF) {
				return errors.New("plugin ended its status stream")
			}
			return c.wrap("watch status", err)
		}
		r := StatusReport{Kind: msg.GetKind(), ID: msg.GetId(), ObservedVersion: msg.GetObservedVersion(), ObservedAt: msg.GetObservedAt().AsTime()}
		if msg.GetStatus() != nil {
			r.Status = msg.GetStatus()
		}
		if err := send(r); err != nil {
			return err
		}
	}
}

func (c *grpcController) Shutdown(ctx context.Context) error {
	req := &pluginv1.ShutdownRequest{}
	if d, ok := ctx.Deadline(); ok {
		req.Deadline = timestamppb.New(d)
	} else {
		req.Deadline = timestamppb.New(time.Now().Add(defaultShutdownTimeout))
	}
	_, err := c.client.Shutdown(ctx, req)
	return c.wrap("shutdown", err)
}

// wrap turns transport errors caused by the plugin's death into
// ErrPluginExited, and gives every error the operation's name.
func (c *grpcController) wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	if c.doneCtx.Err() != nil {
		return fmt.Errorf("%s: %w", op, ErrPluginExited)
	}
	if st, ok := status.FromError(err); ok {
		return fmt.Errorf("%s: %s (%s)", op, st.Message(), st.Code())
	}
	return fmt.Errorf("%s: %w", op, err)
}

func speaks(versions []uint32, v uint32) bool {
	for _, x := range versions {
		if x == v {
			return true
		}
	}
	return false
}
