package sdk

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pluginv1 "krane.dev/sdk/internal/pluginv1"
)

// defaultShutdownTimeout bounds Shutdown when the host sends no deadline.
const defaultShutdownTimeout = 10 * time.Second

// server is the plugin-side shim: it serves krane.plugin.v1 by calling the
// author's Controller (and its optional capabilities, when it has them).
type server struct {
	pluginv1.UnimplementedControllerServer
	impl Controller
	host *hostDialer
}

func (s *server) Describe(ctx context.Context, _ *pluginv1.DescribeRequest) (*pluginv1.DescribeResponse, error) {
	resp, err := s.impl.Describe(ctx, &DescribeRequest{})
	if err != nil {
		return nil, status.Errorf(codes.Internal, "describe: %v", err)
	}
	if resp == nil {
		return nil, status.Error(codes.Internal, "describe: the plugin returned no description")
	}
	return infoToProto(resp.Info), nil
}

func (s *server) Configure(ctx context.Context, req *pluginv1.ConfigureRequest) (*pluginv1.ConfigureResponse, error) {
	if req.GetProtocolVersion() != 0 && req.GetProtocolVersion() != ProtocolVersion {
		return nil, status.Errorf(codes.FailedPrecondition, "host speaks plugin protocol %d, plugin speaks %d", req.GetProtocolVersion(), ProtocolVersion)
	}
	creq := configureFromProto(req)
	creq.Host = noHost{}
	if s.host != nil {
		h, err := s.host.hostFor(req.GetHostServiceId())
		if err != nil {
			return nil, status.Errorf(codes.Unavailable, "configure: %v", err)
		}
		creq.Host = h
	}
	if _, err := s.impl.Configure(ctx, &creq); err != nil {
		var cfgErr *ConfigError
		if errors.As(err, &cfgErr) {
			return nil, status.Error(codes.InvalidArgument, cfgErr.Error())
		}
		return nil, status.Error(codes.FailedPrecondition, err.Error()) // the host names the call
	}
	return &pluginv1.ConfigureResponse{}, nil
}

func (s *server) Apply(ctx context.Context, req *pluginv1.ApplyRequest) (resp *pluginv1.ApplyResponse, _ error) {
	defer func() {
		// A panic in one object's reconcile must not take the plugin down
		// with every other object; report it as a retryable failure.
		if r := recover(); r != nil {
			resp = &pluginv1.ApplyResponse{Error: &pluginv1.ApplyError{
				Message: fmt.Sprintf("plugin panicked applying %s %s: %v\n%s", req.GetKind(), req.GetId(), r, debug.Stack()),
			}}
		}
	}()
	ar := applyFromProto(req)
	ctx, span := startApplySpan(ctx, ar)
	out, err := s.impl.Apply(ctx, ar)
	endApplySpan(span, out, err)
	return applyResultToProto(out, err), nil
}

func (s *server) Inventory(req *pluginv1.InventoryRequest, stream pluginv1.Controller_InventoryServer) error {
	resp, err := s.impl.Inventory(stream.Context(), &InventoryRequest{Kind: req.GetKind()})
	if err != nil {
		return status.Errorf(codes.Unavailable, "inventory of %s: %v", req.GetKind(), err)
	}
	if resp == nil {
		return nil
	}
	for _, it := range resp.Items {
		if err := stream.Send(inventoryItemToProto(it)); err != nil {
			return err
		}
	}
	return nil
}

// WatchStatus of a plugin without the StatusWatcher capability keeps the
// stream open, silent, until the host ends it.
func (s *server) WatchStatus(_ *pluginv1.WatchStatusRequest, stream pluginv1.Controller_WatchStatusServer) error {
	w, ok := s.impl.(StatusWatcher)
	if !ok {
		<-stream.Context().Done()
		return nil
	}
	err := w.WatchStatus(stream.Context(), func(r StatusReport) error {
		msg, err := statusToProto(r)
		if err != nil {
			return err
		}
		return stream.Send(msg)
	})
	if err != nil && stream.Context().Err() == nil {
		return status.Errorf(codes.Unavailable, "watch status: %v", err)
	}
	return nil
}

func (s *server) Shutdown(ctx context.Context, req *pluginv1.ShutdownRequest) (*pluginv1.ShutdownResponse, error) {
	sd, ok := s.impl.(Shutdowner)
	if !ok {
		return &pluginv1.ShutdownResponse{}, nil
	}
	ctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), shutdownDeadlineFromProto(req))
	defer cancel()
	if err := sd.Shutdown(ctx); err != nil {
		return nil, status.Errorf(codes.Internal, "shutdown: %v", err)
	}
	return &pluginv1.ShutdownResponse{}, nil
}
