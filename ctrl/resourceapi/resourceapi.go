// Package resourceapi serves krane.ctrl.v1.ResourceService: the operators'
// API for the desired state of the kinds plugin authors add, and of
// ciliumnetworkpolicy. A kind is registered with the JSON Schema of its
// spec; every put is checked against it before anything is written, so a
// spec the schema refuses never reaches a cluster. Writes go through
// store.WriteTx: one transaction, stamped with versions like every other
// desired-state change, streamed to each region's clusters by the
// ClusterService. Reads return, per region, what the clusters reported:
// the version applied, the latest status, and apply errors.
package resourceapi

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"krane.dev/ctrl/actual"
	"krane.dev/ctrl/api"
	"krane.dev/ctrl/auth"
	"krane.dev/ctrl/deployspec"
	"krane.dev/ctrl/fleetapi"
	"krane.dev/ctrl/store"
	ctrlv1 "krane.dev/proto/krane/ctrl/v1"
	"krane.dev/sdk"
	"krane.dev/shared/kinds"
)

// MaxBatch bounds one PutResources (declared on the request, checked by
// ctrl/bounds): the transaction holds the version lock while it stamps,
// and a batch this size stamps in well under a second.
const MaxBatch = 1000

// MaxSpecBytes bounds one object's spec, as JSON: a google.protobuf.Struct
// has no size its proto could declare, and the spec is stored and
// streamed to every cluster of its regions.
const MaxSpecBytes = 256 << 10

// CiliumPolicySchema is the spec of a ciliumnetworkpolicy in the resource
// API: the namespace and name of the CiliumNetworkPolicy, and the policy
// (a CiliumNetworkPolicy object or its spec) that the cilium plugin
// validates and confines to its namespace.
const CiliumPolicySchema = `{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "type": "object",
  "additionalProperties": false,
  "required": ["namespace", "name", "policy"],
  "properties": {
    "namespace": {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "maxLength": 63},
    "name": {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", "maxLength": 253},
    "policy": {"type": "object"}
  }
}`

// idPattern: ids become label values in the cluster (the SDK's IDLabel,
// which garbage collection selects by), so they are refused here, not
// parked in every cluster.
var idPattern = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?$`)

// Server serves the ResourceService.
type Server struct {
	ctrlv1.UnimplementedResourceServiceServer
	store *store.Store
	log   hclog.Logger
}

// New returns the service.
func New(st *store.Store, log hclog.Logger) *Server {
	if log == nil {
		log = hclog.NewNullLogger()
	}
	return &Server{store: st, log: log.Named("resourceapi")}
}

// Register adds the service to gs.
func (s *Server) Register(gs *grpc.Server) { ctrlv1.RegisterResourceServiceServer(gs, s) }

func (s *Server) RegisterKind(ctx context.Context, req *ctrlv1.RegisterKindRequest) (*ctrlv1.KindInfo, error) {
	kind := req.GetKind()
	if err := checkKindName("kind", kind); err != nil {
		return nil, err
	}
	if store.IsBuiltIn(kind) {
		return nil, status.Errorf(codes.InvalidArgument, "kind: %s is built in; it needs no registration", kind)
	}
	if _, err := sdk.CompileSchema(req.GetSpecSchema()); err != nil {
		return nil, &api.FieldError{Field: "spec_schema", Reason: fmt.Sprintf("not a usable JSON Schema: %v", err)}
	}
	created, err := s.store.RegisterKind(ctx, store.KindRegistration{Kind: kind, SpecSchema: req.GetSpecSchema(), Description: req.GetDescription()})
	if err != nil {
		return nil, fmt.Errorf("registering the kind failed: %w", err)
	}
	s.log.Info("kind registered", "kind", kind, "new", created, "by", caller(ctx))
	return s.GetKind(ctx, &ctrlv1.GetKindRequest{Kind: kind})
}

func (s *Server) GetKind(ctx context.Context, req *ctrlv1.GetKindRequest) (*ctrlv1.KindInfo, error) {
	if err := checkKindName("kind", req.GetKind()); err != nil {
		return nil, err
	}
	schema, k, err := s.schemaOf(ctx, "kind", req.GetKind())
	if err != nil {
		return nil, err
	}
	if k == nil {
		return &ctrlv1.KindInfo{Kind: req.GetKind(), SpecSchema: schema, BuiltIn: true, Description: builtInDescription}, nil
	}
	return kindInfo(*k), nil
}

const builtInDescription = "a CiliumNetworkPolicy (cilium.io/v2), confined to its namespace by the cilium plugin"

func (s *Server) ListKinds(ctx context.Context, _ *ctrlv1.ListKindsRequest) (*ctrlv1.ListKindsResponse, error) {
	ks, err := s.store.ListKinds(ctx)
	if err != nil {
		return nil, fmt.Errorf("listing kinds failed: %w", err)
	}
	resp := &ctrlv1.ListKindsResponse{Kinds: []*ctrlv1.KindInfo{{Kind: kinds.CiliumNetworkPolicy, SpecSchema: CiliumPolicySchema, BuiltIn: true, Description: builtInDescription}}}
	for _, k := range ks {
		resp.Kinds = append(resp.Kinds, kindInfo(k))
	}
	return resp, nil
}

func kindInfo(k store.KindRegistration) *ctrlv1.KindInfo {
	return &ctrlv1.KindInfo{Kind: k.Kind, SpecSchema: k.SpecSchema, Description: k.Description,
		CreatedAt: timestamppb.New(k.CreatedAt), UpdatedAt: timestamppb.New(k.UpdatedAt)}
}

// schemaOf is the spec schema a kind's objects must pass; reg is nil for a
// built-in kind. Deployments and sentinels, and kinds nobody registered,
// are refused with what to do instead.
func (s *Server) schemaOf(ctx context.Context, field, kind string) (schema string, reg *store.KindRegistration, err error) {
	switch kind {
	case kinds.CiliumNetworkPolicy:
		return CiliumPolicySchema, nil, nil
	case kinds.Deployment:
		return "", nil, status.Errorf(codes.InvalidArgument, "%s: deployments have their own API: `ctrl deploy` (the DeploymentService)", field)
	case kinds.Sentinel:
		return "", nil, status.Errorf(codes.InvalidArgument, "%s: sentinels have their own API: `ctrl sentinel` and `ctrl rollout`", field)
	}
	k, err := s.store.GetKind(ctx, kind)
	if errors.Is(err, store.ErrNotFound) {
		return "", nil, status.Errorf(codes.FailedPrecondition,
			"%s: kind %q is not registered: register it with its spec schema first, `ctrl kind register %s --schema SCHEMA.json` (a plugin prints the schema of its kinds with `krane-plugin-NAME --describe`; `ctrl kind register --describe FILE` takes that output)",
			field, kind, kind)
	}
	if err != nil {
		return "", nil, fmt.Errorf("reading the kind failed: %w", err)
	}
	return k.SpecSchema, &k, nil
}

// checked is one object of a put, validated.
type checked struct {
	kind, id string
	regions  []string
	spec     []byte
}

func (s *Server) check(ctx context.Context, i int, r *ctrlv1.Resource, schemas map[string]string) (checked, error) {
	at := fmt.Sprintf("resources[%d]", i)
	c := checked{kind: r.GetKind(), id: r.GetId(), regions: r.GetRegions()}
	if err := checkKindName(at+".kind", c.kind); err != nil {
		return c, err
	}
	if !idPattern.MatchString(c.id) {
		return c, &api.FieldError{Field: at + ".id", Reason: fmt.Sprintf("%q: an id is 1-63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit (it becomes a label value in the cluster)", c.id)}
	}
	if len(c.regions) == 0 {
		return c, &api.FieldError{Field: at + ".regions", Reason: "at least one region is required"}
	}
	if err := deployspec.ValidRegions(at+".regions", c.regions); err != nil {
		return c, status.Error(codes.InvalidArgument, err.Error())
	}
	spec := r.GetSpec()
	if spec == nil {
		spec = &structpb.Struct{}
	}
	doc, err := protojson.Marshal(spec)
	if err != nil {
		return c, &api.FieldError{Field: at + ".spec", Reason: err.Error()}
	}
	if len(doc) > MaxSpecBytes {
		return c, &api.FieldError{Field: at + ".spec", Reason: fmt.Sprintf("%d bytes as JSON; at most %d", len(doc), MaxSpecBytes)}
	}
	schema, ok := schemas[c.kind]
	if !ok {
		var err error
		if schema, _, err = s.schemaOf(ctx, at+".kind", c.kind); err != nil {
			return c, err
		}
		schemas[c.kind] = schema
	}
	if err := sdk.ValidateJSON(schema, doc); err != nil {
		var se *sdk.SchemaError
		if errors.As(err, &se) {
			return c, &api.FieldError{Field: at + ".spec" + se.Pointer, Reason: fmt.Sprintf("%s %s: spec field %q: %s (the kind's schema refuses it)", c.kind, c.id, cmpOr(se.Pointer, "/"), se.Reason)}
		}
		return c, status.Errorf(codes.Internal, "%s: the schema of kind %s does not compile any more: %v (register it again)", at, c.kind, err)
	}
	c.spec = doc
	return c, nil
}

func (s *Server) PutResources(ctx context.Context, req *ctrlv1.PutResourcesRequest) (*ctrlv1.PutResourcesResponse, error) {
	n := len(req.GetResources())
	switch {
	case n == 0:
		return nil, &api.FieldError{Field: "resources", Reason: "no resources to put"}
	}
	schemas := map[string]string{}
	objs := make([]checked, 0, n)
	seen := map[[2]string]int{}
	for i, r := range req.GetResources() {
		c, err := s.check(ctx, i, r, schemas)
		if err != nil {
			return nil, err
		}
		if j, dup := seen[[2]string{c.kind, c.id}]; dup {
			return nil, &api.FieldError{Field: fmt.Sprintf("resources[%d]", i), Reason: fmt.Sprintf("%s %s is also resources[%d]: one object may appear once per call", c.kind, c.id, j)}
		}
		seen[[2]string{c.kind, c.id}] = i
		objs = append(objs, c)
	}
	plans := make([][]store.RegionChange, len(objs))
	versions := map[store.Ref]uint64{}
	if req.GetDryRun() {
		for i, o := range objs {
			plan, err := s.store.PlanPut(ctx, o.kind, o.id, o.spec, o.regions)
			if err != nil {
				return nil, fmt.Errorf("planning the put failed: %w", err)
			}
			plans[i] = plan
		}
	} else {
		stamped, err := s.store.WriteTx(ctx, func(ctx context.Context, tx *store.Tx) error {
			for i, o := range objs {
				plan, err := tx.PutObject(ctx, o.kind, o.id, o.spec, o.regions)
				if err != nil {
					return err
				}
				plans[i] = plan
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("writing the resources failed: %w", err)
		}
		for _, st := range stamped {
			versions[st.Ref] = st.Version
		}
	}
	resp := &ctrlv1.PutResourcesResponse{}
	changed := 0
	for i, o := range objs {
		res := &ctrlv1.PutResult{Kind: o.kind, Id: o.id, Outcome: outcome(plans[i])}
		for _, c := range plans[i] {
			res.Regions = append(res.Regions, &ctrlv1.RegionChange{Region: c.Region, Change: c.What, Version: versions[store.Ref{Kind: o.kind, Region: c.Region, ID: o.id}]})
		}
		if res.Outcome != "unchanged" {
			changed++
		}
		resp.Results = append(resp.Results, res)
	}
	if !req.GetDryRun() && changed > 0 {
		s.log.Info("resources put", "objects", len(objs), "changed", changed, "by", caller(ctx))
	}
	return resp, nil
}

// outcome sums up a plan: created (no region had a row), unchanged, or
// updated.
func outcome(plan []store.RegionChange) string {
	created, unchanged := true, true
	for _, c := range plan {
		created = created && c.What == "create"
		unchanged = unchanged && c.What == "unchanged"
	}
	switch {
	case unchanged:
		return "unchanged"
	case created:
		return "created"
	}
	return "updated"
}

func (s *Server) DeleteResource(ctx context.Context, req *ctrlv1.DeleteResourceRequest) (*ctrlv1.DeleteResourceResponse, error) {
	if err := s.checkRef(ctx, req.GetKind(), req.GetId()); err != nil {
		return nil, err
	}
	if err := deployspec.ValidRegions("regions", req.GetRegions()); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	var plan []store.RegionChange
	stamped, err := s.store.WriteTx(ctx, func(ctx context.Context, tx *store.Tx) error {
		var err error
		plan, err = tx.DeleteObject(ctx, req.GetKind(), req.GetId(), req.GetRegions())
		return err
	})
	if errors.Is(err, store.ErrNotFound) {
		return nil, status.Errorf(codes.NotFound, "no %s %q (see `ctrl resource list %s`)", req.GetKind(), req.GetId(), req.GetKind())
	}
	if err != nil {
		return nil, fmt.Errorf("deleting the resource failed: %w", err)
	}
	versions := map[string]uint64{}
	for _, st := range stamped {
		versions[st.Region] = st.Version
	}
	resp := &ctrlv1.DeleteResourceResponse{}
	for _, c := range plan {
		resp.Regions = append(resp.Regions, &ctrlv1.RegionChange{Region: c.Region, Change: c.What, Version: versions[c.Region]})
	}
	s.log.Info("resource deleted", "kind", req.GetKind(), "id", req.GetId(), "regions", len(stamped), "by", caller(ctx))
	return resp, nil
}

func (s *Server) GetResource(ctx context.Context, req *ctrlv1.GetResourceRequest) (*ctrlv1.ResourceInfo, error) {
	if err := s.checkRef(ctx, req.GetKind(), req.GetId()); err != nil {
		return nil, err
	}
	o, err := s.store.GetObject(ctx, req.GetKind(), req.GetId())
	if errors.Is(err, store.ErrNotFound) {
		return nil, status.Errorf(codes.NotFound, "no %s %q (see `ctrl resource list %s`)", req.GetKind(), req.GetId(), req.GetKind())
	}
	if err != nil {
		return nil, fmt.Errorf("reading the resource failed: %w", err)
	}
	info := resourceInfo(o)
	if err := s.explainUnserved(ctx, info); err != nil {
		return nil, err
	}
	fitResource(info)
	return info, nil
}

// explainUnserved sets not_served on each region where no cluster counts:
// its version cannot be applied until a live cluster there runs a
// controller for the kind, so a client waiting for it is told why at once,
// in the words fleetapi.CheckServed gives a refused deploy. Regions where a
// cluster counts cost nothing.
func (s *Server) explainUnserved(ctx context.Context, info *ctrlv1.ResourceInfo) error {
	var regions []string
	for _, rr := range info.GetRegions() {
		if rr.GetClustersCounted() == 0 {
			regions = append(regions, rr.GetRegion())
		}
	}
	if len(regions) == 0 {
		return nil
	}
	kind := info.GetResource().GetKind()
	err := fleetapi.CheckServed(ctx, s.store, regions, kind, actual.LiveWindow, time.Now())
	var nse *fleetapi.NotServedError
	switch {
	case err == nil:
		// A cluster came alive since the object was read: it counts on the
		// next read.
		return nil
	case !errors.As(err, &nse):
		return fmt.Errorf("reading the heartbeats of the clusters of %s %s failed: %w", kind, info.GetResource().GetId(), err)
	}
	why := map[string]string{}
	for i, region := range nse.Regions {
		why[region] = nse.Why[i]
	}
	for _, rr := range info.GetRegions() {
		rr.NotServed = why[rr.GetRegion()]
	}
	return nil
}

func (s *Server) ListResources(ctx context.Context, req *ctrlv1.ListResourcesRequest) (*ctrlv1.ListResourcesResponse, error) {
	if err := checkKindName("kind", req.GetKind()); err != nil {
		return nil, err
	}
	if _, _, err := s.schemaOf(ctx, "kind", req.GetKind()); err != nil {
		return nil, err
	}
	if r := req.GetRegion(); r != "" {
		if err := deployspec.ValidRegions("region", []string{r}); err != nil {
			return nil, status.Error(codes.InvalidArgument, err.Error())
		}
	}
	size, after, err := api.Parse(req.GetPageSize(), req.GetPageToken(), "ListResources", 100, 500)
	if err != nil {
		return nil, err
	}
	objs, err := s.store.ListObjects(ctx, store.ObjectFilter{Kind: req.GetKind(), Region: req.GetRegion(), IncludeDeleted: req.GetIncludeDeleted()}, after, size+1)
	if err != nil {
		return nil, fmt.Errorf("listing resources failed: %w", err)
	}
	resp := &ctrlv1.ListResourcesResponse{}
	infos := make(map[string]*ctrlv1.ResourceInfo, len(objs))
	sizes := make(map[string]int, len(objs))
	for _, o := range objs {
		infos[o.ID] = resourceInfo(o)
		sizes[o.ID] = fitResource(infos[o.ID])
	}
	objs, resp.NextPageToken = api.NextWithin(objs, size, PageBytes, func(o store.Object) string { return o.ID },
		func(o store.Object) int { return sizes[o.ID] })
	for _, o := range objs {
		resp.Resources = append(resp.Resources, infos[o.ID])
	}
	return resp, nil
}

// checkRef validates a (kind, id) of a read or delete.
func (s *Server) checkRef(ctx context.Context, kind, id string) error {
	if err := checkKindName("kind", kind); err != nil {
		return err
	}
	if _, _, err := s.schemaOf(ctx, "kind", kind); err != nil {
		return err
	}
	if !idPattern.MatchString(id) {
		return &api.FieldError{Field: "id", Reason: fmt.Sprintf("%q is not an object id", id)}
	}
	return nil
}

func resourceInfo(o store.Object) *ctrlv1.ResourceInfo {
	info := &ctrlv1.ResourceInfo{Resource: &ctrlv1.Resource{Kind: o.Kind, Id: o.ID, Spec: toStruct(o.Spec())}, Deleted: !o.Live()}
	for _, r := range o.Regions {
		if !r.Deleted {
			info.Resource.Regions = append(info.Resource.Regions, r.Region)
		}
		rr := &ctrlv1.ResourceRegion{Region: r.Region, Version: r.Version, Deleted: r.Deleted, ObservedVersion: r.ObservedVersion,
			Applied: r.Actual.Converged(), Status: toStruct(r.Status),
			ClustersCounted: int32(len(r.Actual.Counted)), ClustersApplied: int32(r.Actual.Applied)}
		if !r.ObservedAt.IsZero() {
			rr.ObservedAt = timestamppb.New(r.ObservedAt)
		}
		for _, reps := range []struct {
			counted bool
			list    []actual.Report
		}{{true, r.Actual.Reports}, {false, r.Actual.Ignored}} {
			for _, rep := range reps.list {
				rr.Clusters = append(rr.Clusters, &ctrlv1.ClusterReport{ClusterId: rep.ClusterID, ObservedVersion: rep.Version,
					ObservedAt: timestamppb.New(rep.At), Deleted: rep.Deleted, Status: toStruct(rep.Status), Counted: reps.counted})
			}
		}
		slices.SortFunc(rr.Clusters, func(a, b *ctrlv1.ClusterReport) int { return strings.Compare(a.GetClusterId(), b.GetClusterId()) })
		for _, e := range r.Errors {
			rr.Errors = append(rr.Errors, &ctrlv1.ApplyError{ClusterId: e.ClusterID, Version: e.Version, Message: e.Message, Field: e.Field,
				Permanent: e.Permanent, UpdatedAt: timestamppb.New(e.UpdatedAt)})
		}
		info.Regions = append(info.Regions, rr)
	}
	return info
}

// toStruct turns a JSON object into a Struct; nil for none (or another
// JSON value, which a status report may hold).
func toStruct(doc []byte) *structpb.Struct {
	if len(doc) == 0 {
		return nil
	}
	st := &structpb.Struct{}
	if err := protojson.Unmarshal(doc, st); err != nil {
		return nil
	}
	return st
}

func checkKindName(field, kind string) error {
	if kind == "" {
		return &api.FieldError{Field: field, Reason: "a kind is required (`ctrl kind list` shows them)"}
	}
	if !store.ValidKind(kind) {
		return &api.FieldError{Field: field, Reason: fmt.Sprintf("%q is not a kind name (lowercase letters, digits, '.' and '-', e.g. quota.acme.example)", kind)}
	}
	return nil
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func caller(ctx context.Context) string { return auth.CallerName(ctx) }
