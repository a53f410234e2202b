package deployapi

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/restatedev/sdk-go/ingress"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"krane.dev/ctrl/api"
	"krane.dev/ctrl/deployspec"
	"krane.dev/ctrl/restateingress"
	"krane.dev/ctrl/store"
	"krane.dev/ctrl/vault"
	"krane.dev/ctrl/workflows"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
	ctrlv1 "krane.dev/proto/krane/ctrl/v1"
	"krane.dev/shared/kinds"
)

// SentinelOptions configure the sentinel and rollout APIs.
type SentinelOptions struct {
	Store *store.Store
	// Ingress answers within 30 s; Waiting has no overall timeout (the
	// caller's deadline bounds it), for deploys that wait minutes.
	Ingress, Waiting *restateingress.Ingress
	Log              hclog.Logger
	// LiveClusterWithin: see Options.
	LiveClusterWithin time.Duration
	// Vault seals sentinels' credentials; nil when ctrl has no keyring
	// (deploys with credentials are then refused).
	Vault *vault.Source
}

// Sentinels serves krane.ctrl.v1.SentinelService (one sentinel: deploy,
// read, list) and krane.ctrl.v1.RolloutService (fleet rollouts), both
// backed by the Restate services of the same names in ctrl/workflows.
type Sentinels struct {
	ctrlv1.UnimplementedSentinelServiceServer
	store *store.Store
	// ingress answers within 30 s; waiting has no overall timeout (the
	// caller's deadline bounds it) for deploys that wait minutes.
	ingress, waiting *restateingress.Ingress
	log              hclog.Logger
	live             time.Duration
	vault            *vault.Source
}

// NewSentinels returns the sentinel and rollout APIs.
func NewSentinels(o SentinelOptions) *Sentinels {
	if o.Log == nil {
		o.Log = hclog.NewNullLogger()
	}
	return &Sentinels{store: o.Store, ingress: o.Ingress, waiting: o.Waiting,
		log: o.Log.Named("sentinelapi"), live: o.LiveClusterWithin, vault: o.Vault}
}

// Register adds both services to gs.
func (s *Sentinels) Register(gs *grpc.Server) {
	ctrlv1.RegisterSentinelServiceServer(gs, s)
	ctrlv1.RegisterRolloutServiceServer(gs, &Rollouts{s: s})
}

// startedWithin is how long DeploySentinel without wait looks for the
// deploy to have taken the sentinel (so its answer shows the new
// configuration).
const startedWithin = 5 * time.Second

// DeploySentinel starts SentinelService.Deploy on one sentinel and, with
// wait, returns once it is ready or failed.
func (s *Sentinels) DeploySentinel(ctx context.Context, req *ctrlv1.DeploySentinelRequest) (*ctrlv1.DeploySentinelResponse, error) {
	dr := workflows.SentinelDeployRequest{Image: req.GetImage(), Replicas: req.GetReplicas(), CPUMillicores: req.GetCpuMillicores(),
		MemoryMiB: req.GetMemoryMib(), TimeoutSeconds: req.GetTimeoutSeconds()}
	if err := dr.Validate(); err != nil {
		return nil, err
	}
	creds := req.GetCredentials()
	if len(creds) > 0 && s.vault == nil {
		return nil, status.Error(codes.FailedPrecondition, "credentials: this ctrl has no vault keyring (vault.keyring_file), so it cannot seal them; "+
			"an operator creates one with `ctrl vault init`")
	}
	if err := checkCredentials(creds); err != nil {
		return nil, err
	}
	row, err := s.sentinel(ctx, req.GetSentinelId())
	if err != nil {
		return nil, err
	}
	if len(creds) > 0 {
		if err := s.sealCredentials(row, creds, &dr); err != nil {
			return nil, err
		}
	}
	// A stopped sentinel is started again by its deploy (SentinelService).
	if err := checkServed(ctx, s.store, []string{row.Region}, kinds.Sentinel, s.live); err != nil {
		return nil, err
	}
	inv, err := restateingress.StartSentinelDeploy(ctx, s.ingress, row.ID, dr)
	if err != nil {
		return nil, restateError(ctx, err, "starting the sentinel deploy in Restate")
	}
	s.log.Info("sentinel deploy started", "sentinel", row.ID, "image", dr.Image, "replicas", dr.Replicas, "credentials", len(dr.CredentialNames),
		"invocation", inv, "by", caller(ctx))
	resp := &ctrlv1.DeploySentinelResponse{InvocationId: inv}
	if req.GetWait() {
		res, err := restateingress.SentinelDeployOutcome(ctx, s.waiting, inv)
		if err != nil {
			return nil, restateError(ctx, err, "waiting for the sentinel deploy")
		}
		resp.Result, resp.Message = res.Status, res.Message
	} else {
		// The deploy runs after any earlier one of the same sentinel; until
		// it took the row, answer with what is there.
		deadline := time.Now().Add(startedWithin)
		for time.Now().Before(deadline) {
			if row, err = s.store.GetSentinel(ctx, row.ID); err != nil || row.DeployRequest == inv {
				break
			}
			select {
			case <-ctx.Done():
				return nil, status.FromContextError(ctx.Err()).Err()
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	if row, err = s.store.GetSentinel(ctx, row.ID); err != nil {
		return nil, fmt.Errorf("reading the sentinel failed: %w", err)
	}
	resp.Sentinel = sentinelInfo(row)
	return resp, nil
}

// checkCredentials checks the names and values of a sentinel's
// credentials; errors name the variable, never a value.
func checkCredentials(creds map[string]string) error {
	names := slices.Sorted(maps.Keys(creds))
	if err := deployspec.ValidSecretEnvKeys("credentials", names, nil); err != nil {
		return err
	}
	for _, k := range names {
		if strings.ContainsRune(creds[k], 0) {
			return &deployspec.FieldError{Field: "credentials", Reason: fmt.Sprintf("the value of %s contains a NUL byte, which no process environment can hold", k)}
		}
	}
	return nil
}

// sealCredentials seals creds for the sentinel into dr: the plaintext ends
// here. When the sentinel's stored credentials open to the same values,
// dr says so (CredentialsSameAs), and the deploy keeps them unchanged.
func (s *Sentinels) sealCredentials(row store.SentinelRow, creds map[string]string, dr *workflows.SentinelDeployRequest) error {
	blob, err := s.vault.Seal(row.ID, creds)
	if err != nil {
		return &deployspec.FieldError{Field: "credentials", Reason: err.Error()}
	}
	dr.EncryptedCredentials, dr.CredentialNames = blob, slices.Sorted(maps.Keys(creds))
	if len(row.EncryptedCredentials) > 0 {
		// A stored blob that does not open (a key removed from the keyring)
		// is simply replaced.
		old, _, err := s.vault.Open(row.ID, row.EncryptedCredentials)
		if err == nil && maps.Equal(old, creds) {
			dr.CredentialsSameAs = row.EncryptedCredentials
		}
		clear(old)
	}
	return nil
}

// StopSentinel sets a sentinel's desired state to stopped with a new
// version (a soft delete); its cluster deletes the sentinel's objects. A
// deploy of the sentinel in progress ends failed ("stopped while it
// deployed"). DeploySentinel, or a deploy of its environment, starts it
// again.
func (s *Sentinels) StopSentinel(ctx context.Context, req *ctrlv1.StopSentinelRequest) (*ctrlv1.StopSentinelResponse, error) {
	if _, err := s.sentinel(ctx, req.GetSentinelId()); err != nil {
		return nil, err
	}
	row, stopped, err := s.store.StopSentinel(ctx, req.GetSentinelId())
	if errors.Is(err, store.ErrNotFound) {
		return nil, status.Errorf(codes.NotFound, "sentinel_id: no sentinel %q (see `ctrl sentinel list`)", req.GetSentinelId())
	}
	if err != nil {
		return nil, fmt.Errorf("stopping the sentinel failed: %w", err)
	}
	if stopped {
		s.log.Info("sentinel stopped", "sentinel", row.ID, "region", row.Region, "environment", row.EnvironmentID, "version", row.Version, "by", caller(ctx))
	}
	return &ctrlv1.StopSentinelResponse{Sentinel: sentinelInfo(row), Stopped: stopped}, nil
}

// GetSentinel returns one sentinel: desired state, what its cluster
// reports, where its last deploy stands.
func (s *Sentinels) GetSentinel(ctx context.Context, req *ctrlv1.GetSentinelRequest) (*ctrlv1.SentinelInfo, error) {
	row, err := s.sentinel(ctx, req.GetSentinelId())
	if err != nil {
		return nil, err
	}
	return sentinelInfo(row), nil
}

// ListSentinels lists sentinels in id order, optionally of one region or
// environment.
func (s *Sentinels) ListSentinels(ctx context.Context, req *ctrlv1.ListSentinelsRequest) (*ctrlv1.ListSentinelsResponse, error) {
	if r := req.GetRegion(); r != "" {
		if err := deployspec.ValidRegions("region", []string{r}); err != nil {
			return nil, err
		}
	}
	if e := req.GetEnvironmentId(); e != "" {
		if err := deployspec.ValidName("environment_id", e); err != nil {
			return nil, err
		}
	}
	size, after, err := api.Parse(req.GetPageSize(), req.GetPageToken(), "ListSentinels", 100, 500)
	if err != nil {
		return nil, err
	}
	rows, err := s.store.ListSentinels(ctx, store.SentinelFilter{Region: req.GetRegion(), EnvironmentID: req.GetEnvironmentId()}, after, size+1)
	if err != nil {
		return nil, fmt.Errorf("listing sentinels failed: %w", err)
	}
	resp := &ctrlv1.ListSentinelsResponse{}
	rows, resp.NextPageToken = api.Next(rows, size, func(r store.SentinelRow) string { return r.ID })
	for _, r := range rows {
		resp.Sentinels = append(resp.Sentinels, sentinelInfo(r))
	}
	return resp, nil
}

// sentinel reads one sentinel named by the request.
func (s *Sentinels) sentinel(ctx context.Context, id string) (store.SentinelRow, error) {
	if id == "" { // its length is bounded on the request
		return store.SentinelRow{}, &deployspec.FieldError{Field: "sentinel_id", Reason: "a sentinel id (sen_...) is required"}
	}
	row, err := s.store.GetSentinel(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return store.SentinelRow{}, status.Errorf(codes.NotFound, "sentinel_id: no sentinel %q (see `ctrl sentinel list`)", id)
	}
	if err != nil {
		return store.SentinelRow{}, fmt.Errorf("reading the sentinel failed: %w", err)
	}
	return row, nil
}

func sentinelInfo(r store.SentinelRow) *ctrlv1.SentinelInfo {
	return &ctrlv1.SentinelInfo{
		Id: r.ID, Region: r.Region, EnvironmentId: r.EnvironmentID, WorkspaceId: r.WorkspaceID, ProjectId: r.ProjectID, AppId: r.AppID,
		K8SName: r.K8sName, Image: r.Image, Replicas: r.Replicas, CpuMillicores: r.CPUMillicores, MemoryMib: r.MemoryMiB,
		DesiredState: r.DesiredState, RunningImage: r.RunningImage, AvailableReplicas: r.AvailableReplicas,
		UpdatedReplicas: r.UpdatedReplicas, ReadyReplicas: r.ReadyReplicas, ObservedGeneration: r.ObservedGeneration,
		Health: healthEnum(r.Health), HealthReason: r.HealthReason, DeployStatus: r.DeployStatus, DeployMessage: r.DeployMessage,
		Version: r.Version, ReportObservedVersion: r.ReportObservedVersion, UpdatedAt: timestamppb.New(r.UpdatedAt),
		CredentialNames: r.CredentialNames,
	}
}

func healthEnum(h string) clusterv1.Health {
	switch h {
	case "healthy":
		return clusterv1.Health_HEALTH_HEALTHY
	case "unhealthy":
		return clusterv1.Health_HEALTH_UNHEALTHY
	case "paused":
		return clusterv1.Health_HEALTH_PAUSED
	}
	return clusterv1.Health_HEALTH_UNSPECIFIED
}

// restateError turns an error of a Restate call into a gRPC status: a
// handler's terminal error by its code (the message is the handler's), a
// failure to reach Restate as Unavailable.
func restateError(ctx context.Context, err error, what string) error {
	if ctx.Err() != nil {
		return status.FromContextError(ctx.Err()).Err()
	}
	var ie ingress.Error
	if errors.As(err, &ie) && ie.IsInvocationError() {
		code := codes.Internal
		switch ie.Code() {
		case 400:
			code = codes.InvalidArgument
		case 404:
			code = codes.NotFound
		case 412:
			code = codes.FailedPrecondition
		case 409:
			code = codes.Aborted
		}
		return status.Error(code, ie.Message())
	}
	return status.Errorf(codes.Unavailable, "%s failed: Restate is unavailable (%v); retry", what, err)
}
