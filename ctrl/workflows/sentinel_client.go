package workflows

import (
	"context"
	"net"
	"net/http"
	"time"

	restate "github.com/restatedev/sdk-go"
	"github.com/restatedev/sdk-go/ingress"
)

// Ingress helpers for the sentinel services (callers outside Restate: the
// operators' API and the Notifier).

// NewWaitingIngressClient is like NewIngressClient without the overall
// timeout, for calls that wait for an invocation to end (bound them with a
// deadline on the context).
func NewWaitingIngressClient(url string) *ingress.Client {
	tr := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        64,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     90 * time.Second,
	}
	return ingress.NewClient(url, ingress.WithHttpClient(&http.Client{Transport: tr}))
}

// StartSentinelDeploy starts SentinelService.Deploy on a sentinel and
// returns its invocation id (which becomes the row's deploy_request).
// Deploys of one sentinel run one after another.
func StartSentinelDeploy(ctx context.Context, c *ingress.Client, id string, req SentinelDeployRequest) (string, error) {
	h, err := ingress.Object[SentinelDeployRequest, SentinelDeployResult](c, SentinelServiceName, id, "Deploy").Send(ctx, req)
	if err != nil {
		return "", err
	}
	return h.Id(), nil
}

// SentinelDeployOutcome waits for a sentinel deploy started with
// StartSentinelDeploy. Use a client without an overall timeout (and a
// deadline on ctx): a deploy may wait for its cluster for minutes.
func SentinelDeployOutcome(ctx context.Context, c *ingress.Client, invocationID string) (SentinelDeployResult, error) {
	return ingress.InvocationById[SentinelDeployResult](c, invocationID).Attach(ctx)
}

// NotifySentinel hands a decided outcome to the sentinel's deploy that
// owns n.Request.
func NotifySentinel(ctx context.Context, c *ingress.Client, id string, n SentinelNotice) (NotifyResult, error) {
	handler := "NotifyReady"
	if n.Result != ResultReady {
		handler = "NotifyFailed"
	}
	return ingress.Object[SentinelNotice, NotifyResult](c, SentinelServiceName, id, handler).Request(ctx, n)
}

// StartRollout calls SentinelRolloutService.Rollout.
func StartRollout(ctx context.Context, c *ingress.Client, req RolloutRequest) (RolloutStatus, error) {
	return ingress.Object[RolloutRequest, RolloutStatus](c, RolloutServiceName, RolloutKey, "Rollout").Request(ctx, req)
}

// GetRolloutStatus calls SentinelRolloutService.Status (a shared handler:
// it answers while a wave is in flight).
func GetRolloutStatus(ctx context.Context, c *ingress.Client) (RolloutStatus, error) {
	return ingress.Object[restate.Void, RolloutStatus](c, RolloutServiceName, RolloutKey, "Status").Request(ctx, restate.Void{})
}

// ResumeRollout calls SentinelRolloutService.Resume.
func ResumeRollout(ctx context.Context, c *ingress.Client, req ResumeRequest) (RolloutStatus, error) {
	return ingress.Object[ResumeRequest, RolloutStatus](c, RolloutServiceName, RolloutKey, "Resume").Request(ctx, req)
}

// CancelRollout calls SentinelRolloutService.Cancel.
func CancelRollout(ctx context.Context, c *ingress.Client) (RolloutStatus, error) {
	return ingress.Object[restate.Void, RolloutStatus](c, RolloutServiceName, RolloutKey, "Cancel").Request(ctx, restate.Void{})
}

// StartRollbackAll calls SentinelRolloutService.RollbackAll, which returns
// once the reverts are sent (state rolling_back); Status says when they are
// done.
func StartRollbackAll(ctx context.Context, c *ingress.Client) (RolloutStatus, error) {
	return ingress.Object[restate.Void, RolloutStatus](c, RolloutServiceName, RolloutKey, "RollbackAll").Request(ctx, restate.Void{})
}
