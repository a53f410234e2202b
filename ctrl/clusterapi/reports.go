package clusterapi

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"krane.dev/ctrl/api"
	"krane.dev/ctrl/auth"
	"krane.dev/ctrl/bounds"
	"krane.dev/ctrl/store"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
	"krane.dev/shared/kinds"
)

// MaxReportsPerCall bounds ReportStatuses (the bound the request declares,
// checked before the handler runs).
const MaxReportsPerCall = 500

// observation orders a report; a report without a time counts as observed
// when it arrived.
func observation(version uint64, at *timestamppb.Timestamp) store.Observation {
	t := time.Now()
	if at != nil && at.IsValid() && (at.GetSeconds() != 0 || at.GetNanos() != 0) {
		t = at.AsTime()
	}
	return store.Observation{Version: version, At: t}
}

// ReportStatus records actual state of one object.
func (s *Server) ReportStatus(ctx context.Context, req *clusterv1.ReportStatusRequest) (*clusterv1.ReportStatusResponse, error) {
	who, err := caller(ctx)
	if err != nil {
		return nil, err
	}
	results, err := s.reportAll(ctx, who, []*clusterv1.ReportStatusRequest{req})
	if err != nil {
		return nil, err
	}
	if r := results[0]; r.GetCode() != 0 {
		return nil, status.Error(codes.Code(r.GetCode()), r.GetMessage())
	}
	return &clusterv1.ReportStatusResponse{Accepted: results[0].GetAccepted()}, nil
}

// ReportStatuses records many reports; the deployments among them in one
// database transaction.
func (s *Server) ReportStatuses(ctx context.Context, req *clusterv1.ReportStatusesRequest) (*clusterv1.ReportStatusesResponse, error) {
	who, err := caller(ctx)
	if err != nil {
		return nil, err
	}
	results, err := s.reportAll(ctx, who, req.GetReports())
	if err != nil {
		return nil, err
	}
	return &clusterv1.ReportStatusesResponse{Results: results}, nil
}

// decodedReport is a validated report, ready for the store.
type decodedReport struct {
	kind, id string
	obs      store.Observation
	msg      proto.Message // the status of a built-in kind
	raw      *anypb.Any    // the status as sent
	doc      []byte        // the status of a generic kind, as JSON
}

// reportAll judges every report and stores those that pass in one
// batch. A report refused on its own gets its code in its result; the
// error is the call's (the database is unavailable, the report queue is
// full, the caller went away), and nothing of the batch was stored.
func (s *Server) reportAll(ctx context.Context, who auth.Identity, reqs []*clusterv1.ReportStatusRequest) ([]*clusterv1.ReportStatusResult, error) {
	results := make([]*clusterv1.ReportStatusResult, len(reqs))
	var reps []store.Report
	var decoded []decodedReport
	var at []int // index in reqs of each of reps
	for i, req := range reqs {
		d, done, err := s.decodeReport(ctx, who, req)
		if err == nil && !done {
			var r store.Report
			if r, err = d.report(who); err == nil {
				reps, decoded, at = append(reps, r), append(decoded, d), append(at, i)
				continue
			}
		}
		if results[i], err = result(done, err); err != nil {
			return nil, err
		}
	}
	stored, err := s.storeReports(ctx, who, reps)
	if err != nil {
		return nil, err
	}
	for j, r := range stored {
		s.m.observeStarted(r.Started)
		accepted, err := s.outcome(ctx, who, decoded[j], r)
		if results[at[j]], err = result(accepted, err); err != nil {
			return nil, err
		}
	}
	return results, nil
}

// report is what the store keeps of a decoded report.
func (d decodedReport) report(who auth.Identity) (store.Report, error) {
	if d.msg == nil {
		return store.Report{Kind: d.kind, Region: who.Region, ClusterID: who.ClusterID, ID: d.id, Obs: d.obs, Status: d.doc}, nil
	}
	r, err := store.StatusReport(d.kind, who.Region, who.ClusterID, d.id, d.obs, d.msg)
	if err != nil {
		return r, api.Fieldf("status", "%v", err)
	}
	return r, nil
}

// storeReports stores reports in the next shared batch (or, with
// UnbatchedReports or before Run, in a transaction of their own). A full
// queue is RESOURCE_EXHAUSTED with a RetryInfo saying when to try again;
// a failed database UNAVAILABLE.
func (s *Server) storeReports(ctx context.Context, who auth.Identity, reps []store.Report) ([]store.ReportResult, error) {
	if len(reps) == 0 {
		return nil, nil
	}
	var stored []store.ReportResult
	var err error
	if s.unbatched || !s.running.Load() {
		stored, err = s.store.Ingest(ctx, reps)
	} else {
		stored, err = s.reports.add(ctx, who.ClusterID, reps)
	}
	switch {
	case errors.Is(err, errQueueFull):
		s.m.refused.WithLabelValues("reports").Inc()
		return nil, s.exhausted("reports", s.reports)
	case errors.Is(err, errShareFull):
		s.m.refused.WithLabelValues("reports-share").Inc()
		return nil, s.shareExhausted("reports", s.reports.perKey)
	case errors.Is(err, errStopping):
		return nil, status.Error(codes.Unavailable, "ctrl is stopping; nothing of this call was stored: send it again (to another ctrl, or to this one once it is back)")
	case err != nil:
		s.m.reports.WithLabelValues("all", "error").Add(float64(len(reps)))
		s.log.Error("cannot store status reports", "region", who.Region, "cluster_id", who.ClusterID, "reports", len(reps), "error", err)
		return nil, fmt.Errorf("storing the reports failed: %w", err)
	}
	return stored, nil
}

// exhausted is the refusal of a call whose items do not fit in b's queue:
// RESOURCE_EXHAUSTED, with how long to wait in a RetryInfo (about the
// time the queue takes to drain, at least a second).
func (s *Server) exhausted(what string, b interface{ depth() int }) error {
	depth := b.depth()
	wait := max(time.Second, time.Duration(depth/s.maxBatch+1)*s.reportLinger)
	st := status.Newf(codes.ResourceExhausted, "ctrl's %s queue is full (%d waiting for the database); nothing of this call was stored: send it again after %s",
		what, depth, wait)
	if d, err := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(wait)}); err == nil {
		st = d
	}
	return st.Err()
}

// shareExhausted refuses a call of a cluster whose share of the queue
// (perKey items) is full: its own earlier calls wait for the database.
func (s *Server) shareExhausted(what string, perKey int) error {
	wait := max(time.Second, time.Duration(perKey/s.maxBatch+1)*s.reportLinger)
	st := status.Newf(codes.ResourceExhausted, "this cluster's share of ctrl's %s queue is full (its earlier calls, up to %d items, wait for the database); nothing of this call was stored: send it again after %s",
		what, perKey, wait)
	if d, err := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(wait)}); err == nil {
		st = d
	}
	return st.Err()
}

// result turns one report's outcome into its result. Only a refusal of
// that report alone (malformed, unknown object) stays in the result; any
// other error is returned, to fail the call.
func result(accepted bool, err error) (*clusterv1.ReportStatusResult, error) {
	switch c := status.Code(err); c {
	case codes.OK:
		return &clusterv1.ReportStatusResult{Accepted: accepted}, nil
	case codes.InvalidArgument, codes.NotFound:
		return &clusterv1.ReportStatusResult{Code: int32(c), Message: status.Convert(err).Message()}, nil
	default:
		return nil, err
	}
}

// decodeReport checks every field of a report and records its apply
// error, if any; nothing is stored for a report refused by a check. done
// is true when the report was only an apply error (now recorded).
func (s *Server) decodeReport(ctx context.Context, who auth.Identity, req *clusterv1.ReportStatusRequest) (decodedReport, bool, error) {
	d := decodedReport{kind: req.GetKind(), id: req.GetId(), obs: observation(req.GetObservedVersion(), req.GetObservedAt()), raw: req.GetStatus()}
	// Each report of a batch is checked on its own (the batch's reports
	// are not checked with the call), so one bad report does not refuse
	// the others.
	if err := bounds.Check("", req); err != nil {
		label := "other"
		if checkKind(d.kind) == nil {
			label = s.kindLabel(d.kind)
		}
		s.m.reports.WithLabelValues(label, "invalid").Inc()
		return d, false, err
	}
	if err := checkKind(d.kind); err != nil {
		return d, false, err
	}
	if d.id == "" {
		return d, false, api.Fieldf("id", "an object id is required")
	}
	invalid := func(err error) (decodedReport, bool, error) {
		s.m.reports.WithLabelValues(s.kindLabel(d.kind), "invalid").Inc()
		return d, false, err
	}
	ae := req.GetApplyError()
	if ae == nil || req.GetStatus() != nil {
		if err := s.decodeStatus(&d); err != nil {
			return invalid(err)
		}
	}
	if ae != nil {
		err := s.store.ReportApplyError(ctx, d.kind, who.Region, who.ClusterID, d.id, ae, d.obs.Version)
		var ahead *store.VersionAheadError
		switch {
		case errors.As(err, &ahead):
			field, v := "observed_version", d.obs.Version
			if ae.GetVersion() > ahead.Current {
				field, v = "apply_error.version", ae.GetVersion()
			}
			return invalid(api.Fieldf(field, "%d is above version %d of %s %q: ctrl never issued it", v, ahead.Current, d.kind, d.id))
		case errors.Is(err, store.ErrNotFound):
			s.m.reports.WithLabelValues(s.kindLabel(d.kind), "not_found").Inc()
			return d, false, errorf(codes.NotFound, "no %s %q in region %q: a cluster reports apply errors only on its region's objects", d.kind, d.id, who.Region)
		case errors.Is(err, store.ErrClusterNotRegistered):
			s.m.reports.WithLabelValues(s.kindLabel(d.kind), "not_found").Inc()
			return d, false, errorf(codes.NotFound, "cluster %q is not registered in region %q (it was removed): its apply errors are not kept", who.ClusterID, who.Region)
		case err != nil:
			return d, false, fmt.Errorf("recording the apply error failed: %w", err)
		}
		if ae.GetMessage() != "" {
			s.log.Warn("cluster cannot apply a change", "kind", d.kind, "id", d.id, "region", who.Region, "cluster", who.ClusterID,
				"version", ae.GetVersion(), "permanent", ae.GetPermanent(), "field", ae.GetField(), "error", ae.GetMessage())
		}
		if req.GetStatus() == nil {
			s.m.reports.WithLabelValues(d.kind, "apply_error").Inc()
			// A permanent apply error can decide a deploy: wake its waiter.
			s.notify(ctx, who, d.kind, d.id)
			return d, true, nil
		}
	}
	return d, false, nil
}

// decodeStatus unpacks and checks a report's status: a built-in kind's
// message into d.msg, a generic kind's into its JSON document (d.doc).
func (s *Server) decodeStatus(d *decodedReport) error {
	switch d.kind {
	case kinds.Deployment:
		d.msg = &clusterv1.DeploymentStatus{}
	case kinds.Sentinel:
		d.msg = &clusterv1.SentinelStatus{}
	case kinds.CiliumNetworkPolicy:
		d.msg = &clusterv1.CiliumNetworkPolicyStatus{}
	default:
		doc, err := statusJSON(d.raw)
		if err != nil {
			return api.Fieldf("status", "the status of %s %q: %v", d.kind, d.id, err)
		}
		if len(doc) > MaxGenericStatusBytes {
			return api.Fieldf("status", "%d bytes as JSON; at most %d", len(doc), MaxGenericStatusBytes)
		}
		d.doc = doc
		return nil
	}
	if d.raw == nil || d.raw.UnmarshalTo(d.msg) != nil {
		return api.Fieldf("status", "the status of a %s must be a %s", d.kind, d.msg.ProtoReflect().Descriptor().FullName())
	}
	if err := checkStatusNames(d); err != nil {
		return err
	}
	return bounds.Check("status", d.msg)
}

// checkStatusNames fills a built-in status's object id from the report
// and refuses one that names another object.
func checkStatusNames(d *decodedReport) error {
	var named *string
	var field string
	switch st := d.msg.(type) {
	case *clusterv1.DeploymentStatus:
		named, field = &st.DeploymentId, "status.deployment_id"
	case *clusterv1.SentinelStatus:
		named, field = &st.SentinelId, "status.sentinel_id"
	case *clusterv1.CiliumNetworkPolicyStatus:
		named, field = &st.Id, "status.id"
	default:
		return nil
	}
	if *named == "" {
		*named = d.id
	}
	if *named != d.id {
		return api.Fieldf(field, "the report is for %s %q but its status names %q", d.kind, d.id, *named)
	}
	return nil
}

// ReportDeploymentStatus is the typed ReportStatus of a deployment.
func (s *Server) ReportDeploymentStatus(ctx context.Context, req *clusterv1.ReportDeploymentStatusRequest) (*clusterv1.ReportDeploymentStatusResponse, error) {
	st := req.GetStatus()
	if st.GetDeploymentId() == "" {
		return nil, status.Error(codes.InvalidArgument, "status.deployment_id is required")
	}
	accepted, err := s.reportTyped(ctx, kinds.Deployment, st.GetDeploymentId(), req.GetObservedVersion(), req.GetObservedAt(), st)
	if err != nil {
		return nil, err
	}
	return &clusterv1.ReportDeploymentStatusResponse{Accepted: accepted}, nil
}

// ReportSentinelStatus is the typed ReportStatus of a sentinel.
func (s *Server) ReportSentinelStatus(ctx context.Context, req *clusterv1.ReportSentinelStatusRequest) (*clusterv1.ReportSentinelStatusResponse, error) {
	st := req.GetStatus()
	if st.GetSentinelId() == "" {
		return nil, status.Error(codes.InvalidArgument, "status.sentinel_id is required")
	}
	accepted, err := s.reportTyped(ctx, kinds.Sentinel, st.GetSentinelId(), req.GetObservedVersion(), req.GetObservedAt(), st)
	if err != nil {
		return nil, err
	}
	return &clusterv1.ReportSentinelStatusResponse{Accepted: accepted}, nil
}

func (s *Server) reportTyped(ctx context.Context, kind, id string, version uint64, at *timestamppb.Timestamp, st proto.Message) (bool, error) {
	who, err := caller(ctx)
	if err != nil {
		return false, err
	}
	d := decodedReport{kind: kind, id: id, obs: observation(version, at), msg: st}
	// The request's bounds (the status's too) were checked with the call.
	if err := checkStatusNames(&d); err != nil {
		s.m.reports.WithLabelValues(kind, "invalid").Inc()
		return false, err
	}
	return s.report(ctx, who, d)
}

// report stores one decoded report.
func (s *Server) report(ctx context.Context, who auth.Identity, d decodedReport) (bool, error) {
	r, err := d.report(who)
	if err != nil {
		return false, err
	}
	stored, err := s.storeReports(ctx, who, []store.Report{r})
	if err != nil {
		return false, err
	}
	s.m.observeStarted(stored[0].Started)
	return s.outcome(ctx, who, d, stored[0])
}

// outcome counts and logs what the store made of a report and wakes the
// report's listeners when it changed what was stored.
func (s *Server) outcome(ctx context.Context, who auth.Identity, d decodedReport, r store.ReportResult) (bool, error) {
	label := s.kindLabel(d.kind)
	var ahead *store.VersionAheadError
	switch err := r.Err; {
	case errors.As(err, &ahead):
		s.m.reports.WithLabelValues(label, "invalid").Inc()
		return false, api.Fieldf("observed_version", "%d is above version %d of %s %q: ctrl never issued it", d.obs.Version, ahead.Current, d.kind, d.id)
	case errors.Is(err, store.ErrNotFound):
		s.m.reports.WithLabelValues(label, "not_found").Inc()
		return false, errorf(codes.NotFound, "no %s %q in region %q", d.kind, d.id, who.Region)
	case errors.Is(err, store.ErrClusterNotRegistered):
		s.m.reports.WithLabelValues(label, "not_found").Inc()
		return false, errorf(codes.NotFound, "cluster %q is not registered in region %q (it was removed): its reports are not kept", who.ClusterID, who.Region)
	case err != nil:
		s.m.reports.WithLabelValues(label, "error").Inc()
		s.log.Error("cannot store a status report", "kind", d.kind, "region", who.Region, "id", d.id, "cluster_id", who.ClusterID, "error", err)
		return false, fmt.Errorf("storing the report failed: %w", err)
	case !r.Accepted:
		s.m.reports.WithLabelValues(label, "stale").Inc()
		s.log.Debug("ignored a stale report", "kind", d.kind, "region", who.Region, "id", d.id, "observed_version", d.obs.Version)
		return false, nil
	case !r.Changed:
		s.m.reports.WithLabelValues(label, "unchanged").Inc()
		return true, nil
	}
	s.m.reports.WithLabelValues(label, "accepted").Inc()
	s.notify(ctx, who, d.kind, d.id)
	return true, nil
}

func (s *Server) notify(ctx context.Context, who auth.Identity, kind, id string) {
	if s.listener == nil {
		return
	}
	switch kind {
	case kinds.Deployment:
		s.listener.DeploymentReported(ctx, id, who.Region)
	case kinds.Sentinel:
		s.listener.SentinelReported(ctx, id)
	}
}

// statusJSON turns a generic kind's status into the JSON stored for it: a
// google.protobuf.Struct as its JSON object, any other registered message
// as its protojson form (with "@type").
func statusJSON(a *anypb.Any) ([]byte, error) {
	if a == nil {
		return nil, errors.New("a status is required")
	}
	var st structpb.Struct
	if a.MessageIs(&st) {
		if err := a.UnmarshalTo(&st); err != nil {
			return nil, err
		}
		return protojson.Marshal(&st)
	}
	b, err := protojson.Marshal(a)
	if err != nil {
		return nil, errors.New("it must be a google.protobuf.Struct (or a message type ctrl knows)")
	}
	return b, nil
}
