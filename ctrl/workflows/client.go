package workflows

import (
	"context"
	"net"
	"net/http"
	"time"

	restate "github.com/restatedev/sdk-go"
	"github.com/restatedev/sdk-go/ingress"
)

// NewIngressClient is a client of Restate's ingress at url with timeouts
// and a connection pool sized for ctrl (the SDK's default client has
// neither a timeout nor more than two idle connections per host).
func NewIngressClient(url string) *ingress.Client {
	tr := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        256,
		MaxIdleConnsPerHost: 256,
		IdleConnTimeout:     90 * time.Second,
	}
	return ingress.NewClient(url, ingress.WithHttpClient(&http.Client{Transport: tr, Timeout: 30 * time.Second}))
}

// StartDeploy starts the deploy workflow of req.Deployment.ID and returns
// its invocation id. Starting it again is harmless: Restate answers with the
// invocation it already has for that workflow id.
func StartDeploy(ctx context.Context, c *ingress.Client, req DeployRequest) (string, error) {
	h, err := ingress.Workflow[DeployRequest, DeployResult](c, DeployWorkflowName, req.Deployment.ID, "Run").Send(ctx, req)
	if err != nil {
		return "", err
	}
	return h.Id(), nil
}

// DeployOutcome waits for a deploy workflow's result.
func DeployOutcome(ctx context.Context, c *ingress.Client, deploymentID string) (DeployResult, error) {
	return ingress.WorkflowHandle[DeployResult](c, DeployWorkflowName, deploymentID).Attach(ctx)
}

// NotifyDeploy hands a decided outcome to a deploy workflow.
func NotifyDeploy(ctx context.Context, c *ingress.Client, deploymentID string, o Outcome) error {
	_, err := ingress.WorkflowSend[Outcome](c, DeployWorkflowName, deploymentID, "Notify").Send(ctx, o)
	return err
}

// Stamp calls VersioningService.Stamp from outside Restate. A retry with
// the same idempotency key returns the same versions; without a key, every
// call stamps anew.
func Stamp(ctx context.Context, c *ingress.Client, refs []Ref, idempotencyKey string) (StampResponse, error) {
	var opts []ingress.RequestOption
	if idempotencyKey != "" {
		opts = append(opts, restate.WithIdempotencyKey(idempotencyKey))
	}
	return ingress.Object[StampRequest, StampResponse](c, VersioningServiceName, VersioningKey, "Stamp").Request(ctx, StampRequest{Refs: refs}, opts...)
}
