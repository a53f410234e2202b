package sdk

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/timestamppb"

	pluginv1 "krane.dev/sdk/internal/pluginv1"
)

// This file is the one place where the SDK's types meet krane.plugin.v1:
// the plugin side (server.go) and the host side (client.go) convert only
// through these pairs, so the two ends can never disagree on a field.

func infoToProto(info Info) *pluginv1.DescribeResponse {
	resp := &pluginv1.DescribeResponse{
		Name:             info.Name,
		PluginVersion:    info.Version,
		ProtocolVersions: []uint32{ProtocolVersion},
		ConfigSchema:     info.ConfigSchema,
	}
	for _, k := range info.Kinds {
		resp.Kinds = append(resp.Kinds, &pluginv1.KindInfo{Kind: k.Kind, Description: k.Description, SpecType: k.SpecType, SpecSchema: k.SpecSchema})
	}
	for _, p := range info.Permissions {
		resp.Permissions = append(resp.Permissions, &pluginv1.Permission{Group: p.Group, Resource: p.Resource, Verbs: p.Verbs, Namespace: p.Namespace, Name: p.Name})
	}
	return resp
}

func infoFromProto(resp *pluginv1.DescribeResponse) Info {
	info := Info{Name: resp.GetName(), Version: resp.GetPluginVersion(), ConfigSchema: resp.GetConfigSchema()}
	for _, k := range resp.GetKinds() {
		info.Kinds = append(info.Kinds, KindInfo{Kind: k.GetKind(), Description: k.GetDescription(), SpecType: k.GetSpecType(), SpecSchema: k.GetSpecSchema()})
	}
	for _, p := range resp.GetPermissions() {
		info.Permissions = append(info.Permissions, Permission{Group: p.GetGroup(), Resource: p.GetResource(), Verbs: p.GetVerbs(), Namespace: p.GetNamespace(), Name: p.GetName()})
	}
	return info
}

func configureToProto(req ConfigureRequest, hostID uint32) *pluginv1.ConfigureRequest {
	kc := &pluginv1.Kubeconfig{Context: req.Kube.Context, Qps: req.Kube.QPS, Burst: int32(req.Kube.Burst)}
	if req.Kube.InCluster {
		kc.Source = &pluginv1.Kubeconfig_InCluster{InCluster: true}
	} else {
		kc.Source = &pluginv1.Kubeconfig_Path{Path: req.Kube.Path}
	}
	return &pluginv1.ConfigureRequest{
		ProtocolVersion: ProtocolVersion,
		Region:          req.Region,
		ClusterId:       req.ClusterID,
		Kubeconfig:      kc,
		ConfigJson:      req.Config,
		HostServiceId:   hostID,
	}
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

func applyToProto(req *ApplyRequest) *pluginv1.ApplyRequest {
	out := &pluginv1.ApplyRequest{Kind: req.Kind, Id: req.ID, Version: req.Version, Deleted: req.Deleted, Traceparent: req.TraceParent}
	if !req.Spec.IsZero() {
		out.Spec = &anypb.Any{TypeUrl: req.Spec.TypeURL, Value: req.Spec.Value}
	}
	return out
}

func applyFromProto(req *pluginv1.ApplyRequest) *ApplyRequest {
	c := Change{Kind: req.GetKind(), ID: req.GetId(), Version: req.GetVersion(), Deleted: req.GetDeleted(), TraceParent: req.GetTraceparent()}
	if a := req.GetSpec(); a != nil {
		c.Spec = Spec{TypeURL: a.GetTypeUrl(), Value: a.GetValue()}
	}
	return &ApplyRequest{Change: c}
}

// applyResultToProto answers an Apply: the error (permanent or not) or the
// result. A plugin that returns neither a result nor an error answers
// UNSPECIFIED, which the host treats as a failure.
func applyResultToProto(resp *ApplyResponse, err error) *pluginv1.ApplyResponse {
	if err != nil {
		var p *PermanentError
		if errors.As(err, &p) {
			return &pluginv1.ApplyResponse{Error: &pluginv1.ApplyError{Message: err.Error(), Permanent: true, Field: p.Field}}
		}
		return &pluginv1.ApplyResponse{Error: &pluginv1.ApplyError{Message: err.Error()}}
	}
	out := &pluginv1.ApplyResponse{}
	switch resp.GetResult() {
	case Applied:
		out.Result = pluginv1.ApplyResult_APPLY_RESULT_APPLIED
	case Unchanged:
		out.Result = pluginv1.ApplyResult_APPLY_RESULT_UNCHANGED
	case Deleted:
		out.Result = pluginv1.ApplyResult_APPLY_RESULT_DELETED
	}
	return out
}

func applyResultFromProto(req *ApplyRequest, resp *pluginv1.ApplyResponse) (*ApplyResponse, error) {
	if e := resp.GetError(); e != nil {
		if e.GetPermanent() {
			// The message already starts with "field: " (PermanentError.Error).
			msg := strings.TrimPrefix(e.GetMessage(), e.GetField()+": ")
			return nil, &PermanentError{Field: e.GetField(), Err: errors.New(msg)}
		}
		return nil, errors.New(e.GetMessage())
	}
	switch resp.GetResult() {
	case pluginv1.ApplyResult_APPLY_RESULT_APPLIED:
		return &ApplyResponse{Result: Applied}, nil
	case pluginv1.ApplyResult_APPLY_RESULT_UNCHANGED:
		return &ApplyResponse{Result: Unchanged}, nil
	case pluginv1.ApplyResult_APPLY_RESULT_DELETED:
		return &ApplyResponse{Result: Deleted}, nil
	}
	return nil, fmt.Errorf("the plugin answered the apply of %s %s with no result and no error (a plugin bug: Apply must return a response or an error)", req.Kind, req.ID)
}

// GetResult is the response's result; 0 for a nil response.
func (r *ApplyResponse) GetResult() Result {
	if r == nil {
		return 0
	}
	return r.Result
}

func inventoryItemToProto(it InventoryItem) *pluginv1.InventoryItem {
	return &pluginv1.InventoryItem{Kind: it.Kind, Id: it.ID, Version: it.Version, SpecHash: it.SpecHash}
}

func inventoryItemFromProto(it *pluginv1.InventoryItem) InventoryItem {
	return InventoryItem{Kind: it.GetKind(), ID: it.GetId(), Version: it.GetVersion(), SpecHash: it.GetSpecHash()}
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

// statusFromProto keeps the status packed (an *anypb.Any), so the host can
// forward a kind's status without knowing its type.
func statusFromProto(msg *pluginv1.StatusReport) StatusReport {
	r := StatusReport{Kind: msg.GetKind(), ID: msg.GetId(), ObservedVersion: msg.GetObservedVersion(), ObservedAt: msg.GetObservedAt().AsTime()}
	if msg.GetStatus() != nil {
		r.Status = msg.GetStatus()
	}
	return r
}

func shutdownToProto(deadline time.Time, ok bool) *pluginv1.ShutdownRequest {
	if !ok {
		deadline = time.Now().Add(defaultShutdownTimeout)
	}
	return &pluginv1.ShutdownRequest{Deadline: timestamppb.New(deadline)}
}

func shutdownDeadlineFromProto(req *pluginv1.ShutdownRequest) time.Time {
	if req.GetDeadline() != nil {
		return req.GetDeadline().AsTime()
	}
	return time.Now().Add(defaultShutdownTimeout)
}
