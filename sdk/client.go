package sdk

import (
	"context"
	"errors"
	"fmt"
	"io"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pluginv1 "krane.dev/sdk/internal/pluginv1"
)

// ErrPluginExited is returned by calls on a plugin whose process has exited.
var ErrPluginExited = errors.New("plugin process exited")

// grpcController is the host-side shim: it implements Plugin by calling a
// plugin over krane.plugin.v1.
type grpcController struct {
	client  pluginv1.ControllerClient
	doneCtx context.Context // cancelled by go-plugin when the process exits
	host    *hostBroker     // nil without a broker: no Host is served
}

// NewGRPCController returns a Plugin that talks to a plugin over conn.
// doneCtx should end when the plugin process exits (go-plugin provides it);
// calls then fail with ErrPluginExited instead of a transport error.
func NewGRPCController(doneCtx context.Context, conn grpc.ClientConnInterface) Plugin {
	if doneCtx == nil {
		doneCtx = context.Background()
	}
	return &grpcController{client: pluginv1.NewControllerClient(conn), doneCtx: doneCtx}
}

func (c *grpcController) Describe(ctx context.Context, _ *DescribeRequest) (*DescribeResponse, error) {
	resp, err := c.client.Describe(ctx, &pluginv1.DescribeRequest{HostProtocolVersions: []uint32{ProtocolVersion}})
	if err != nil {
		return nil, c.wrap("describe", err)
	}
	info := infoFromProto(resp)
	if !speaks(resp.GetProtocolVersions(), ProtocolVersion) {
		return &DescribeResponse{Info: info}, fmt.Errorf("plugin %q speaks plugin protocol versions %v, this host speaks %d: upgrade the plugin or the host", info.Name, resp.GetProtocolVersions(), ProtocolVersion)
	}
	return &DescribeResponse{Info: info}, nil
}

func (c *grpcController) Configure(ctx context.Context, req *ConfigureRequest) (*ConfigureResponse, error) {
	var hostID uint32
	if req.Host != nil && c.host != nil {
		hostID = c.host.serve(req.Host)
	}
	_, err := c.client.Configure(ctx, configureToProto(*req, hostID))
	if st, ok := status.FromError(err); ok && st.Code() == codes.InvalidArgument {
		return nil, &ConfigError{Reason: st.Message()}
	}
	if err != nil {
		return nil, c.wrap("configure", err)
	}
	return &ConfigureResponse{}, nil
}

func (c *grpcController) Apply(ctx context.Context, req *ApplyRequest) (*ApplyResponse, error) {
	out := applyToProto(req)
	if tp := traceParentOf(ctx); tp != "" {
		out.Traceparent = tp // the caller's span: the plugin's is its child
	}
	resp, err := c.client.Apply(ctx, out)
	if err != nil {
		return nil, c.wrap("apply", err)
	}
	return applyResultFromProto(req, resp)
}

func (c *grpcController) Inventory(ctx context.Context, req *InventoryRequest) (*InventoryResponse, error) {
	stream, err := c.client.Inventory(ctx, &pluginv1.InventoryRequest{Kind: req.Kind})
	if err != nil {
		return nil, c.wrap("inventory", err)
	}
	resp := &InventoryResponse{}
	for {
		it, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return resp, nil
		}
		if err != nil {
			return nil, c.wrap("inventory", err)
		}
		resp.Items = append(resp.Items, inventoryItemFromProto(it))
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
		if err := send(statusFromProto(msg)); err != nil {
			return err
		}
	}
}

func (c *grpcController) Shutdown(ctx context.Context) error {
	_, err := c.client.Shutdown(ctx, shutdownToProto(ctx.Deadline()))
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
