// Package deployapi serves krane.ctrl.v1.DeploymentService, the operators'
// deploy API: create a deployment (which starts its DeployWorkflow in
// Restate), read and list deployments with their per-region state, roll
// an environment back, promote a ready deployment, stop one.
//
// Every call needs an operator token; ctrl/auth's interceptors enforce it
// before a handler runs. Inputs are checked here and refused with
// InvalidArgument naming the field; a state that forbids the call is
// FailedPrecondition; the database or Restate being unreachable is
// Unavailable (retry; creation is idempotent with an idempotency key).
//
// Ids are made here, once: "dep_" and 20 random base32 characters; the
// workload's Kubernetes name is "dep-" and the same characters, in the
// namespace "ws-<workspace id>" (made a DNS label).
package deployapi

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"krane.dev/ctrl/api"
	"krane.dev/ctrl/auth"
	"krane.dev/ctrl/deployspec"
	"krane.dev/ctrl/restateingress"
	"krane.dev/ctrl/store"
	"krane.dev/ctrl/vault"
	"krane.dev/ctrl/workflows"
	ctrlv1 "krane.dev/proto/krane/ctrl/v1"
	"krane.dev/shared/kinds"
)

// Options configure a Server.
type Options struct {
	Store   *store.Store
	Ingress *restateingress.Ingress
	Log     hclog.Logger
	// DefaultTimeout is deploy.timeout: a deploy's wait when its request
	// says none (stored with the deployment).
	DefaultTimeout time.Duration
	// Vault seals secret variables; nil when ctrl has no keyring (requests
	// with secrets are then refused).
	Vault *vault.Source
	// LiveClusterWithin is deploy.live_cluster_within: a deploy to a
	// region with no cluster heard from this recently running the
	// deployment controller is refused at once. 0: no check.
	LiveClusterWithin time.Duration
}

// Server implements ctrlv1.DeploymentServiceServer.
type Server struct {
	ctrlv1.UnimplementedDeploymentServiceServer
	store   *store.Store
	ingress *restateingress.Ingress
	log     hclog.Logger
	timeout time.Duration
	vault   *vault.Source
	live    time.Duration
}

// New returns a Server.
func New(o Options) *Server {
	if o.Log == nil {
		o.Log = hclog.NewNullLogger()
	}
	if o.DefaultTimeout <= 0 {
		o.DefaultTimeout = 5 * time.Minute
	}
	return &Server{store: o.Store, ingress: o.Ingress, log: o.Log.Named("deployapi"), timeout: o.DefaultTimeout, vault: o.Vault, live: o.LiveClusterWithin}
}

// Register adds the service to gs.
func (s *Server) Register(gs *grpc.Server) { ctrlv1.RegisterDeploymentServiceServer(gs, s) }

// CreateDeployment records a pending deployment and starts its workflow.
func (s *Server) CreateDeployment(ctx context.Context, req *ctrlv1.CreateDeploymentRequest) (*ctrlv1.CreateDeploymentResponse, error) {
	if resp, err := s.replay(ctx, req.GetIdempotencyKey()); resp != nil || err != nil {
		return resp, err
	}
	secrets := req.GetSecretEnv()
	if len(secrets) > 0 && s.vault == nil {
		return nil, status.Error(codes.FailedPrecondition, "secret_env: this ctrl has no vault keyring (vault.keyring_file), so it cannot seal secrets; "+
			"an operator creates one with `ctrl vault init`")
	}
	if err := deployspec.ValidRegions("regions", req.GetRegions()); err != nil {
		return nil, err
	}
	id := deployspec.NewDeploymentID()
	spec, err := deployspec.FromCreateRequest(id, req)
	if err != nil {
		return nil, err
	}
	// A workspace keeps the namespace its deployments run in; a new one
	// gets deployspec.Namespace; none shares another's (store).
	if spec.WorkspaceID != "" {
		ns, err := s.store.WorkspaceNamespace(ctx, spec.WorkspaceID)
		if errors.Is(err, store.ErrNamespaceHeld) {
			return nil, &deployspec.FieldError{Field: "workspace_id", Reason: err.Error()}
		}
		if err != nil {
			return nil, err
		}
		spec.K8sNamespace = ns
	}
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	if err := checkSecretValues(secrets); err != nil {
		return nil, err
	}
	secretKeys := slices.Sorted(maps.Keys(secrets))
	if err := deployspec.ValidSecretEnvKeys("secret_env", secretKeys, spec.Workload.GetEnvVars()); err != nil {
		return nil, err
	}
	if err := s.checkRegions(ctx, req.GetRegions()); err != nil {
		return nil, err
	}
	if err := checkServed(ctx, s.store, req.GetRegions(), kinds.Deployment, s.live); err != nil {
		return nil, err
	}
	if err := checkSentinelsServed(ctx, s.store, spec.EnvironmentID, req.GetRegions(), s.live); err != nil {
		return nil, err
	}
	// Sealed now, for this deployment's id, before the row is written:
	// plaintext never reaches the database or the workflow's journal.
	if len(secrets) > 0 {
		blob, err := s.vault.Seal(id, secrets)
		if err != nil {
			return nil, &deployspec.FieldError{Field: "secret_env", Reason: err.Error()}
		}
		spec.EncryptedEnv, spec.SecretEnvKeys = blob, secretKeys
	}
	return s.create(ctx, spec, req.GetRegions(), req.GetTimeoutSeconds(), req.GetIdempotencyKey(), "created by "+caller(ctx))
}

// checkSecretValues refuses what a container environment cannot carry.
// Errors name the variable, never its value.
func checkSecretValues(secrets map[string]string) error {
	for _, k := range slices.Sorted(maps.Keys(secrets)) {
		if strings.ContainsRune(secrets[k], 0) {
			return &deployspec.FieldError{Field: "secret_env", Reason: fmt.Sprintf("the value of %s contains a NUL byte, which no process environment can hold", k)}
		}
	}
	return nil
}

// replay answers a request whose idempotency key was used before: the
// same deployment, before any other check (the world may have changed since
// the first call). nil, nil when the key is new or empty.
func (s *Server) replay(ctx context.Context, key string) (*ctrlv1.CreateDeploymentResponse, error) {
	if key == "" {
		return nil, nil
	}
	id, err := s.store.DeploymentByIdempotencyKey(ctx, key)
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("looking up the idempotency key failed: %w", err)
	}
	return s.ensureStarted(ctx, id)
}

// ensureStarted starts the workflow of a deployment created earlier if it
// is still pending (the first call may have failed to start it).
func (s *Server) ensureStarted(ctx context.Context, id string) (*ctrlv1.CreateDeploymentResponse, error) {
	stored, err := s.store.GetDeployment(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("reading the deployment failed: %w", err)
	}
	if stored.Status == store.StatusPending {
		req := workflows.DeployRequest{Deployment: stored.Spec, Regions: stored.Regions, TimeoutSeconds: stored.TimeoutSeconds}
		if err := s.start(ctx, req); err != nil {
			return nil, err
		}
	}
	return &ctrlv1.CreateDeploymentResponse{DeploymentId: id}, nil
}

// create writes the pending row and starts the workflow. A key used
// concurrently returns the deployment of whichever call won.
func (s *Server) create(ctx context.Context, spec deployspec.Spec, regions []string, timeout int32, key, note string) (*ctrlv1.CreateDeploymentResponse, error) {
	if timeout == 0 {
		timeout = int32(s.timeout / time.Second)
	}
	d := store.Deployment{Spec: spec, Regions: regions, TimeoutSeconds: timeout, IdempotencyKey: key}
	id, existed, err := s.store.CreateDeployment(ctx, d, note)
	if err != nil {
		return nil, fmt.Errorf("recording the deployment failed: %w", err)
	}
	if existed {
		return s.ensureStarted(ctx, id)
	}
	if err := s.start(ctx, workflows.DeployRequest{Deployment: spec, Regions: regions, TimeoutSeconds: timeout, Note: note}); err != nil {
		return nil, err
	}
	s.log.Info("deployment created", "deployment", id, "environment", spec.EnvironmentID, "image", spec.Workload.GetImage(), "by", caller(ctx))
	return &ctrlv1.CreateDeploymentResponse{DeploymentId: id}, nil
}

// start starts a deployment's workflow (again: Restate keeps one per id).
func (s *Server) start(ctx context.Context, req workflows.DeployRequest) error {
	id := req.Deployment.ID
	if _, err := restateingress.StartDeploy(ctx, s.ingress, req); err != nil {
		s.log.Warn("cannot start a deploy workflow", "deployment", id, "error", err)
		return status.Errorf(codes.Unavailable, "deployment %s is recorded (pending) but its deploy workflow could not be started in Restate (%v); "+
			"call again with the same idempotency_key, or ctrl starts it by itself within a couple of minutes", id, err)
	}
	return nil
}

// checkRegions refuses regions without a registered cluster: a deploy there
// could only time out.
func (s *Server) checkRegions(ctx context.Context, regions []string) error {
	have, err := s.store.ClusterRegions(ctx)
	if err != nil {
		return fmt.Errorf("reading the registered regions failed: %w", err)
	}
	if len(regions) == 0 && len(have) == 0 {
		return status.Error(codes.FailedPrecondition, "regions: none given, and no region has a registered cluster (register one with `ctrl admin cluster register`)")
	}
	if missing := workflows.MissingRegions(regions, have); len(missing) > 0 {
		return status.Errorf(codes.FailedPrecondition, "regions: no cluster is registered in %s (regions with clusters: %s)",
			strings.Join(missing, ", "), strings.Join(have, ", "))
	}
	return nil
}

// GetDeployment returns a deployment with its regions and instances.
func (s *Server) GetDeployment(ctx context.Context, req *ctrlv1.GetDeploymentRequest) (*ctrlv1.DeploymentInfo, error) {
	d, err := s.deployment(ctx, "deployment_id", req.GetDeploymentId())
	if err != nil {
		return nil, err
	}
	states, err := s.store.RegionStates(ctx, d.ID)
	if err != nil {
		return nil, fmt.Errorf("reading the deployment's regions failed: %w", err)
	}
	live, err := s.store.LiveDeployment(ctx, d.EnvironmentID)
	if err != nil {
		return nil, fmt.Errorf("reading the live deployment failed: %w", err)
	}
	events, err := s.store.DeploymentEvents(ctx, d.ID)
	if err != nil {
		return nil, fmt.Errorf("reading the deployment's history failed: %w", err)
	}
	out := info(d, states[d.ID], live == d.ID, true)
	out.History = history(events)
	fitInstances(out, maxDeploymentBytes)
	return out, nil
}

// maxDeploymentBytes is GetDeployment's byte budget: what clusters
// reported (instances, from every cluster of every region) is cut to it,
// well within ctrl's 16 MiB message limit and a client's default 4 MiB.
const maxDeploymentBytes = 3 << 20

// fitInstances leaves instances out of info, from the end of the largest
// region's list, until it encodes in at most limit bytes, and counts what
// it left out in each region's instances_omitted.
func fitInstances(info *ctrlv1.DeploymentInfo, limit int) {
	over := proto.Size(info) - limit
	for over > 0 {
		var largest *ctrlv1.RegionStatus
		for _, r := range info.GetRegions() {
			if len(r.GetInstances()) > 0 && (largest == nil || len(r.GetInstances()) > len(largest.GetInstances())) {
				largest = r
			}
		}
		if largest == nil {
			return
		}
		last := largest.Instances[len(largest.Instances)-1]
		over -= proto.Size(last) + 3 // the field's tag and length
		largest.Instances = largest.Instances[:len(largest.Instances)-1]
		largest.InstancesOmitted++
	}
}

// ListDeployments lists an environment's deployments, newest first.
func (s *Server) ListDeployments(ctx context.Context, req *ctrlv1.ListDeploymentsRequest) (*ctrlv1.ListDeploymentsResponse, error) {
	if err := deployspec.ValidName("environment_id", req.GetEnvironmentId()); err != nil {
		return nil, err
	}
	size := int(req.GetPageSize()) // 0..100, its declared bound
	if size == 0 {
		size = 20
	}
	cursor, err := decodePageToken(req.GetPageToken())
	if err != nil {
		return nil, err
	}
	list, err := s.store.ListDeployments(ctx, req.GetEnvironmentId(), cursor, size+1)
	if err != nil {
		return nil, fmt.Errorf("listing deployments failed: %w", err)
	}
	resp := &ctrlv1.ListDeploymentsResponse{}
	if len(list) > size {
		list = list[:size]
		last := list[size-1]
		resp.NextPageToken = encodePageToken(store.DeploymentCursor{CreatedAt: last.CreatedAt.UnixMilli(), ID: last.ID})
	}
	ids := make([]string, len(list))
	for i, d := range list {
		ids[i] = d.ID
	}
	states, err := s.store.RegionStates(ctx, ids...)
	if err != nil {
		return nil, fmt.Errorf("reading the deployments' regions failed: %w", err)
	}
	live, err := s.store.LiveDeployment(ctx, req.GetEnvironmentId())
	if err != nil {
		return nil, fmt.Errorf("reading the live deployment failed: %w", err)
	}
	for _, d := range list {
		resp.Deployments = append(resp.Deployments, info(d, states[d.ID], live == d.ID, false))
	}
	return resp, nil
}

// Rollback creates a new deployment with an earlier deployment's
// configuration, in the regions that one ran in. It becomes live when
// ready.
func (s *Server) Rollback(ctx context.Context, req *ctrlv1.RollbackRequest) (*ctrlv1.CreateDeploymentResponse, error) {
	env := req.GetEnvironmentId()
	if resp, err := s.replay(ctx, req.GetIdempotencyKey()); resp != nil || err != nil {
		return resp, err
	}
	if err := deployspec.ValidName("environment_id", env); err != nil {
		return nil, err
	}
	live, err := s.store.LiveDeployment(ctx, env)
	if err != nil {
		return nil, fmt.Errorf("reading the live deployment failed: %w", err)
	}
	targetID := req.GetTargetDeploymentId()
	if targetID == "" {
		if live == "" {
			return nil, status.Errorf(codes.FailedPrecondition, "environment %s has no live deployment: name the deployment to roll back to in target_deployment_id", env)
		}
		liveDep, err := s.store.GetDeployment(ctx, live)
		if err != nil {
			return nil, fmt.Errorf("reading the live deployment failed: %w", err)
		}
		targetID, err = s.store.LastReadyBefore(ctx, liveDep)
		if errors.Is(err, store.ErrNotFound) {
			return nil, status.Errorf(codes.FailedPrecondition, "no deployment of environment %s before the live one (%s) ever became ready: name target_deployment_id", env, live)
		}
		if err != nil {
			return nil, fmt.Errorf("finding the rollback target failed: %w", err)
		}
	}
	target, err := s.deployment(ctx, "target_deployment_id", targetID)
	if err != nil {
		return nil, err
	}
	if target.EnvironmentID != env {
		return nil, &deployspec.FieldError{Field: "target_deployment_id", Reason: fmt.Sprintf("deployment %s belongs to environment %s, not %s", target.ID, target.EnvironmentID, env)}
	}
	if target.ID == live {
		return nil, status.Errorf(codes.FailedPrecondition, "deployment %s is already live in environment %s; there is nothing to roll back", target.ID, env)
	}
	ready, err := s.store.EverReady(ctx, target.ID)
	if err != nil {
		return nil, fmt.Errorf("reading the target's history failed: %w", err)
	}
	if !ready {
		return nil, status.Errorf(codes.FailedPrecondition, "deployment %s never became ready; roll back to one that did (see `ctrl deploy list`)", target.ID)
	}
	states, err := s.store.RegionStates(ctx, target.ID)
	if err != nil {
		return nil, fmt.Errorf("reading the target's regions failed: %w", err)
	}
	regions := target.Regions
	if rs := states[target.ID]; len(rs) > 0 {
		regions = nil
		for _, r := range rs {
			regions = append(regions, r.Region)
		}
	}
	if err := s.checkRegions(ctx, regions); err != nil {
		return nil, err
	}
	if err := checkServed(ctx, s.store, regions, kinds.Deployment, s.live); err != nil {
		return nil, err
	}
	id := deployspec.NewDeploymentID()
	spec := target.Spec
	spec.ID, spec.K8sName, spec.RolledBackFrom = id, deployspec.K8sName(id), live
	if len(target.EncryptedEnv) > 0 {
		// A blob opens only for the deployment it was sealed for.
		if spec.EncryptedEnv, err = s.reseal(target, id); err != nil {
			return nil, err
		}
	}
	note := fmt.Sprintf("rollback to the configuration of %s, by %s", target.ID, caller(ctx))
	if live != "" {
		note = fmt.Sprintf("rollback of %s to the configuration of %s, by %s", live, target.ID, caller(ctx))
	}
	return s.create(ctx, spec, regions, target.TimeoutSeconds, req.GetIdempotencyKey(), note)
}

// reseal seals the target's secrets for the rollback's new deployment id.
func (s *Server) reseal(target store.Deployment, newID string) ([]byte, error) {
	if s.vault == nil {
		return nil, status.Errorf(codes.FailedPrecondition, "deployment %s has secret variables and this ctrl has no vault keyring (vault.keyring_file) to re-seal them", target.ID)
	}
	blob, err := s.vault.Reseal(target.ID, target.EncryptedEnv, newID)
	var unknown *vault.UnknownKeyError
	switch {
	case errors.As(err, &unknown):
		return nil, status.Errorf(codes.FailedPrecondition, "the secrets of deployment %s cannot be opened: %v", target.ID, err)
	case err != nil:
		s.log.Error("cannot re-seal secrets for a rollback", "target", target.ID, "error", err)
		return nil, status.Errorf(codes.Internal, "the secrets of deployment %s cannot be re-sealed (%v); an operator must look at its stored environment", target.ID, err)
	}
	return blob, nil
}

// Promote makes a ready deployment its environment's live one.
func (s *Server) Promote(ctx context.Context, req *ctrlv1.PromoteRequest) (*ctrlv1.PromoteResponse, error) {
	d, err := s.deployment(ctx, "deployment_id", req.GetDeploymentId())
	if err != nil {
		return nil, err
	}
	_, err = s.store.WriteTx(ctx, func(ctx context.Context, tx *store.Tx) error {
		cur, err := tx.LockDeployment(ctx, d.ID)
		if err != nil {
			return err
		}
		if cur != store.StatusReady {
			return status.Errorf(codes.FailedPrecondition, "deployment %s is %s; only a ready deployment can be promoted", d.ID, cur)
		}
		live, err := tx.LiveDeployment(ctx, d.EnvironmentID)
		if err != nil || live == d.ID {
			return err
		}
		if err := tx.SetLiveDeployment(ctx, d.EnvironmentID, d.ID); err != nil {
			return err
		}
		msg := "promoted by " + caller(ctx)
		if live != "" {
			msg += ", replacing " + live
		}
		return tx.RecordEvent(ctx, d.ID, cur, msg)
	})
	if err != nil {
		return nil, fmt.Errorf("promoting failed: %w", err)
	}
	s.log.Info("deployment promoted", "deployment", d.ID, "environment", d.EnvironmentID, "by", caller(ctx))
	return &ctrlv1.PromoteResponse{}, nil
}

// StopDeployment removes a deployment from every region: its topology is
// stopped with new versions in the same transaction as the status change.
// A live deployment stops being live. Stopping a stopped or failed
// deployment (already removed) changes nothing.
func (s *Server) StopDeployment(ctx context.Context, req *ctrlv1.StopDeploymentRequest) (*ctrlv1.StopDeploymentResponse, error) {
	d, err := s.deployment(ctx, "deployment_id", req.GetDeploymentId())
	if err != nil {
		return nil, err
	}
	var before string
	_, err = s.store.WriteTx(ctx, func(ctx context.Context, tx *store.Tx) error {
		var err error
		if before, err = tx.LockDeployment(ctx, d.ID); err != nil {
			return err
		}
		if before == store.StatusStopped || before == store.StatusFailed {
			return nil
		}
		if _, err := tx.StopTopology(ctx, d.ID, true); err != nil {
			return err
		}
		if _, _, err := tx.TransitionDeployment(ctx, d.ID, []string{before}, store.StatusStopped, "stopped by "+caller(ctx)); err != nil {
			return err
		}
		live, err := tx.LiveDeployment(ctx, d.EnvironmentID)
		if err != nil || live != d.ID {
			return err
		}
		return tx.SetLiveDeployment(ctx, d.EnvironmentID, "")
	})
	if err != nil {
		return nil, fmt.Errorf("stopping failed: %w", err)
	}
	if before == store.StatusDeploying || before == store.StatusNetwork {
		// End the workflow's wait now rather than at its timeout; if this
		// fails, its next check sees the stopped status anyway.
		if err := restateingress.NotifyDeploy(ctx, s.ingress, d.ID, workflows.Outcome{Result: workflows.ResultStopped}); err != nil {
			s.log.Warn("cannot tell a deploy workflow its deployment was stopped", "deployment", d.ID, "error", err)
		}
	}
	if before != store.StatusStopped && before != store.StatusFailed {
		s.log.Info("deployment stopped", "deployment", d.ID, "was", before, "by", caller(ctx))
	}
	return &ctrlv1.StopDeploymentResponse{}, nil
}

// ScaleDeployment changes a deployment's replicas per region in place: the
// running topology rows get the new count and new versions in one
// transaction, so every region's krane applies it like any other change.
// Only a deployment that runs (ready, or network while it becomes ready)
// can be scaled; a deploy still rolling out would race its own workflow.
func (s *Server) ScaleDeployment(ctx context.Context, req *ctrlv1.ScaleDeploymentRequest) (*ctrlv1.ScaleDeploymentResponse, error) {
	// replicas is in range (its declared bound, checked before the
	// handler). No read of the deployment first: the transaction's lock finds it or
	// not, and a scale is one statement in a group commit (store).
	id := req.GetDeploymentId()
	if id == "" {
		return nil, &deployspec.FieldError{Field: "deployment_id", Reason: "a deployment id (dep_...) is required"}
	}
	var before int32
	_, err := s.store.WriteTx(ctx, func(ctx context.Context, tx *store.Tx) error {
		cur, err := tx.LockDeploymentToScale(ctx, id)
		if errors.Is(err, store.ErrNotFound) {
			return status.Errorf(codes.NotFound, "deployment_id: no deployment %q", id)
		}
		if err != nil {
			return err
		}
		if cur != store.StatusReady && cur != store.StatusNetwork {
			return status.Errorf(codes.FailedPrecondition, "deployment %s is %s; only a ready deployment can be scaled (wait for it, or create a new one)", id, cur)
		}
		if before, err = tx.ScaleTopology(ctx, id, req.GetReplicas()); err != nil {
			return err
		}
		if before == req.GetReplicas() {
			return nil
		}
		return tx.RecordEvent(ctx, id, cur, fmt.Sprintf("scaled from %d to %d replicas per region by %s", before, req.GetReplicas(), caller(ctx)))
	})
	if err != nil {
		return nil, fmt.Errorf("scaling failed: %w", err)
	}
	if before != req.GetReplicas() {
		s.log.Info("deployment scaled", "deployment", id, "from", before, "to", req.GetReplicas(), "by", caller(ctx))
	}
	return &ctrlv1.ScaleDeploymentResponse{PreviousReplicas: before, Replicas: req.GetReplicas()}, nil
}

// deployment reads one deployment named by a request field.
func (s *Server) deployment(ctx context.Context, field, id string) (store.Deployment, error) {
	if id == "" { // its length is bounded on the request
		return store.Deployment{}, &deployspec.FieldError{Field: field, Reason: "a deployment id (dep_...) is required"}
	}
	d, err := s.store.GetDeployment(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return store.Deployment{}, status.Errorf(codes.NotFound, "%s: no deployment %q", field, id)
	}
	if err != nil {
		return store.Deployment{}, fmt.Errorf("reading the deployment failed: %w", err)
	}
	return d, nil
}

// The page key of ListDeployments is "<created_at ms>/<id>", in the one
// page-token codec (api.EncodeToken).
func encodePageToken(c store.DeploymentCursor) string {
	return api.EncodeToken(strconv.FormatInt(c.CreatedAt, 10) + "/" + c.ID)
}

func decodePageToken(t string) (store.DeploymentCursor, error) {
	key, err := api.DecodeToken(t, "ListDeployments")
	if err != nil || key == "" {
		return store.DeploymentCursor{}, err
	}
	ms, id, ok := strings.Cut(key, "/")
	n, err := strconv.ParseInt(ms, 10, 64)
	if !ok || err != nil || id == "" {
		return store.DeploymentCursor{}, &api.FieldError{Field: "page_token", Reason: "not a token from a previous ListDeployments answer"}
	}
	return store.DeploymentCursor{CreatedAt: n, ID: id}, nil
}

// caller names the operator token's owner, for history and logs.
func caller(ctx context.Context) string { return auth.CallerName(ctx) }

// SetEnvironmentHosts replaces the hosts an environment's sentinels serve;
// its sentinels receive them as new routes.
func (s *Server) SetEnvironmentHosts(ctx context.Context, req *ctrlv1.SetEnvironmentHostsRequest) (*ctrlv1.EnvironmentInfo, error) {
	hosts, err := deployspec.Hosts(req.GetHosts())
	if err != nil {
		return nil, err
	}
	env := req.GetEnvironmentId()
	if _, err := s.store.WriteTx(ctx, func(ctx context.Context, tx *store.Tx) error {
		return tx.SetEnvironmentHosts(ctx, env, hosts)
	}); err != nil {
		return nil, fmt.Errorf("setting the hosts of environment %s failed: %w", env, err)
	}
	s.log.Info("environment hosts set", "environment", env, "hosts", hosts, "by", caller(ctx))
	return s.GetEnvironment(ctx, &ctrlv1.GetEnvironmentRequest{EnvironmentId: env})
}

// GetEnvironment shows an environment's live deployment and hosts.
func (s *Server) GetEnvironment(ctx context.Context, req *ctrlv1.GetEnvironmentRequest) (*ctrlv1.EnvironmentInfo, error) {
	env := req.GetEnvironmentId()
	live, err := s.store.LiveDeployment(ctx, env)
	if err != nil {
		return nil, err
	}
	hosts, err := s.store.EnvironmentHosts(ctx, env)
	if err != nil {
		return nil, err
	}
	return &ctrlv1.EnvironmentInfo{Id: env, LiveDeploymentId: live, Hosts: hosts}, nil
}
