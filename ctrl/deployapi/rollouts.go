package deployapi

import (
	"context"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"krane.dev/ctrl/restateingress"
	"krane.dev/ctrl/workflows"
	ctrlv1 "krane.dev/proto/krane/ctrl/v1"
)

// Rollouts serves krane.ctrl.v1.RolloutService: fleet-wide sentinel image
// rollouts, run by the SentinelRolloutService in Restate. Every call but
// RollbackAll returns at once; invalid calls (a rollout already active,
// resuming one that is not paused, ...) are FailedPrecondition with the
// rollout service's explanation.
type Rollouts struct {
	ctrlv1.UnimplementedRolloutServiceServer
	s *Sentinels
}

// rollbackPoll is how often RollbackAll looks whether the reverts are done.
const rollbackPoll = 200 * time.Millisecond

// StartRollout starts a rollout of an image to every running sentinel.
func (r *Rollouts) StartRollout(ctx context.Context, req *ctrlv1.StartRolloutRequest) (*ctrlv1.RolloutStatus, error) {
	in := workflows.RolloutRequest{Image: req.GetImage(), WavePercentages: req.GetWavePercentages(), SlackWebhookURL: req.GetSlackWebhookUrl(),
		BakeSeconds: req.GetBakeSeconds(), DeployTimeoutSeconds: req.GetDeployTimeoutSeconds()}
	if err := in.Validate(); err != nil {
		return nil, err
	}
	st, err := restateingress.StartRollout(ctx, r.s.ingress, in)
	if err != nil {
		return nil, restateError(ctx, err, "starting the rollout")
	}
	r.s.log.Info("sentinel rollout started", "run", st.Run, "image", in.Image, "sentinels", st.Total, "waves", len(st.Waves), "by", caller(ctx))
	return rolloutStatus(st), nil
}

// GetRolloutStatus answers at once, even while a wave is in flight.
func (r *Rollouts) GetRolloutStatus(ctx context.Context, _ *ctrlv1.GetRolloutStatusRequest) (*ctrlv1.RolloutStatus, error) {
	st, err := restateingress.GetRolloutStatus(ctx, r.s.ingress)
	if err != nil {
		return nil, restateError(ctx, err, "reading the rollout")
	}
	return rolloutStatus(st), nil
}

// ResumeRollout continues a paused rollout.
func (r *Rollouts) ResumeRollout(ctx context.Context, req *ctrlv1.ResumeRolloutRequest) (*ctrlv1.RolloutStatus, error) {
	st, err := restateingress.ResumeRollout(ctx, r.s.ingress, workflows.ResumeRequest{RetryFailed: req.GetRetryFailed()})
	if err != nil {
		return nil, restateError(ctx, err, "resuming the rollout")
	}
	r.s.log.Info("sentinel rollout resumed", "run", st.Run, "retry_failed", req.GetRetryFailed(), "by", caller(ctx))
	return rolloutStatus(st), nil
}

// CancelRollout stops a rollout before its next wave.
func (r *Rollouts) CancelRollout(ctx context.Context, _ *ctrlv1.CancelRolloutRequest) (*ctrlv1.RolloutStatus, error) {
	st, err := restateingress.CancelRollout(ctx, r.s.ingress)
	if err != nil {
		return nil, restateError(ctx, err, "cancelling the rollout")
	}
	r.s.log.Info("sentinel rollout cancelled", "run", st.Run, "by", caller(ctx))
	return rolloutStatus(st), nil
}

// RollbackAll deploys every sentinel the rollout touched back to its
// previous image and returns once they all answered (the caller's deadline
// bounds the wait; the rollback goes on without it).
func (r *Rollouts) RollbackAll(ctx context.Context, _ *ctrlv1.RollbackAllRequest) (*ctrlv1.RollbackAllResponse, error) {
	st, err := restateingress.StartRollbackAll(ctx, r.s.ingress)
	if err != nil {
		return nil, restateError(ctx, err, "starting the rollback")
	}
	r.s.log.Info("sentinel rollback started", "run", st.Run, "sentinels", st.RollbackTotal, "by", caller(ctx))
	for st.State == workflows.RolloutRollingBack {
		select {
		case <-ctx.Done():
			return nil, status.Errorf(status.FromContextError(ctx.Err()).Code(),
				"the rollback of rollout %s goes on (%d of %d back so far); follow it with GetRolloutStatus", st.Run, st.Reverted, st.RollbackTotal)
		case <-time.After(rollbackPoll):
		}
		if st, err = restateingress.GetRolloutStatus(ctx, r.s.ingress); err != nil {
			if status.Code(restateError(ctx, err, "")) == codes.Unavailable && ctx.Err() == nil {
				continue // Restate briefly away: keep waiting
			}
			return nil, restateError(ctx, err, "reading the rollback's progress")
		}
	}
	return &ctrlv1.RollbackAllResponse{Reverted: int32(st.Reverted), FailedIds: st.RollbackFailedIDs, Status: rolloutStatus(st)}, nil
}

func rolloutStatus(v workflows.RolloutStatus) *ctrlv1.RolloutStatus {
	out := &ctrlv1.RolloutStatus{
		State: v.State, Image: v.Image, CurrentWave: int32(v.CurrentWave), Total: int32(v.Total), Succeeded: int32(v.Succeeded),
		Failed: int32(v.Failed), FailedIds: v.FailedIDs, Message: v.Message, Run: v.Run, BakeSeconds: v.BakeSeconds,
		RollbackTotal: int32(v.RollbackTotal), Reverted: int32(v.Reverted), RollbackFailedIds: v.RollbackFailedIDs,
	}
	if v.StartedAtMs > 0 {
		out.StartedAt = timestamppb.New(time.UnixMilli(v.StartedAtMs))
	}
	if v.UpdatedAtMs > 0 {
		out.UpdatedAt = timestamppb.New(time.UnixMilli(v.UpdatedAtMs))
	}
	for _, w := range v.Waves {
		out.Waves = append(out.Waves, &ctrlv1.Wave{Index: int32(w.Index), Percentage: w.Percentage, Size: int32(w.Size),
			Succeeded: int32(w.Succeeded), Failed: int32(w.Failed), State: w.State})
	}
	return out
}
