package sdk

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/timestamppb"

	pluginv1 "krane.dev/proto/krane/plugin/v1"
)

// defaultShutdownTimeout bounds Shutdown when the host sends no deadline.
const defaultShutdownTimeout = 10 * time.Second

// server is the plugin-side shim: it serves krane.plugin.v1 by calling the
// author's Controller.
type server struct {
	pluginv1.UnimplementedControllerServer
	impl Controller
	host *hostDialer
}

func (s *server) Describe(ctx context.Context, _ *pluginv1.DescribeRequest) (*pluginv1.DescribeResponse, error) {
	info, err := s.impl.Describe(ctx)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "describe: %v", err)
	}
	return infoToProto(info), nil
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
	if err := s.impl.Configure(ctx, creq); err != nil {
		var cfgErr *ConfigError
		if errors.As(err, &cfgErr) {
			return nil, status.Error(codes.InvalidArgument, cfgErr.Error())
		}
		return nil, status.Errorf(codes.FailedPrecondition, "configure: %v", err)
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
	result, err := s.impl.Apply(ctx, changeFromProto(req))
	if err != nil {
		return &pluginv1.ApplyResponse{Error: applyErrorToProto(err)}, nil
	}
	return &pluginv1.ApplyResponse{Result: resultToProto(result)}, nil
}

func (s *server) Inventory(req *pluginv1.InventoryRequest, stream pluginv1.Controller_InventoryServer) error {
	items, err := s.impl.Inventory(stream.Context(), req.GetKind())
	if err != nil {
		return status.Errorf(codes.Unavailable, "inventory of %s: %v", req.GetKind(), err)
	}
	for _, it := range items {
		if err := stream.Send(&pluginv1.InventoryItem{Kind: it.Kind, Id: it.ID, Version: it.Version, SpecHash: it.SpecHash}); err != nil {
			return err
		}
	}
	return nil
}

func (s *server) WatchStatus(_ *pluginv1.WatchStatusRequest, stream pluginv1.Controller_WatchStatusServer) error {
	err := s.impl.WatchStatus(stream.Context(), func(r StatusReport) error {
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
	deadline := time.Now().Add(defaultShutdownTimeout)
	if req.GetDeadline() != nil {
		deadline = req.GetDeadline().AsTime()
	}
	ctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), deadline)
	defer cancel()
	if err := s.impl.Shutdown(ctx); err != nil {
		return nil, status.Errorf(codes.Internal, "shutdown: %v", err)
	}
	return &pluginv1.ShutdownResponse{}, nil
}

func infoToProto(info Info) *pluginv1.DescribeResponse {
	resp := &pluginv1.DescribeResponse{
		Name:             info.Name,
		PluginVersion:    info.Version,
		ProtocolVersions: []uint32{ProtocolVersion},
		ConfigSchema:     info.ConfigSchema,
	}
	for _, k := range info.Kinds {
		resp.Kinds = append(resp.Kinds, &pluginv1.KindInfo{Kind: k.Kind, Description: k.Description, SpecType: k.SpecType})
	}
	return resp
}

func configureFromProto(req *pluginv1.ConfigureRequest) ConfigureRequest {
	kc := req.GetKubeconfig()
	cfg := req.GetConfigJson()
	if len(cfg) == 0 {
		cfg = []byte("{}")
	}
	return ConfigureRequest{
		Region:    req.GetRegion(),
		ClusterID: req.GetClusterId(),
		Kube: KubeSource{
			InCluster: kc.GetInCluster(),
			Path:      kc.GetPath(),
			Context:   kc.GetContext(),
			QPS:       kc.GetQps(),
			Burst:     int(kc.GetBurst()),
		},
		Config: cfg,
	}
}

func changeFromProto(req *pluginv1.ApplyRequest) Change {
	c := Change{Kind: req.GetKind(), ID: req.GetId(), Version: req.GetVersion(), Deleted: req.GetDeleted()}
	if a := req.GetSpec(); a != nil {
		c.Spec = Spec{TypeURL: a.GetTypeUrl(), Value: a.GetValue()}
	}
	return c
}

func applyErrorToProto(err error) *pluginv1.ApplyError {
	var p *PermanentError
	if errors.As(err, &p) {
		return &pluginv1.ApplyError{Message: err.Error(), Permanent: true, Field: p.Field}
	}
	return &pluginv1.ApplyError{Message: err.Error()}
}

func resultToProto(r Result) pluginv1.ApplyResult {
	switch r {
	case Applied:
		return pluginv1.ApplyResult_APPLY_RESULT_APPLIED
	case Unchanged:
		return pluginv1.ApplyResult_APPLY_RESULT_UNCHANGED
	case Deleted:
		return pluginv1.ApplyResult_APPLY_RESULT_DELETED
	}
	return pluginv1.ApplyResult_APPLY_RESULT_UNSPECIFIED
}

func statusToProto(r StatusReport) (*pluginv1.StatusReport, error) {
	msg := &pluginv1.StatusReport{Kind: r.Kind, Id: r.ID, ObservedVersion: r.ObservedVersion}
	if !r.ObservedAt.IsZero() {
		msg.ObservedAt = timestamppb.New(r.ObservedAt)
	} else {
		msg.ObservedAt = timestamppb.Now()
	}
	if packed, ok := r.Status.(*anypb.Any); ok {
		msg.Status = packed
	} else if r.Status != nil {
		a, err := anypb.New(r.Status)
		if err != nil {
			return nil, fmt.Errorf("pack status of %s %s: %w", r.Kind, r.ID, err)
		}
		msg.Status = a
	}
	return msg, nil
}
