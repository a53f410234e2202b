package restateingress

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	restate "github.com/restatedev/sdk-go"
	"github.com/restatedev/sdk-go/ingress"

	"krane.dev/ctrl/workflows"
)

// Ingress is ctrl's client of Restate's ingress. Calls of ctrl's services
// go through the CtrlIngress gateway, signed with the ingress key (see
// workflows.GatewayName); attaching to an invocation, to read its result, goes to the
// ingress directly.
type Ingress struct {
	c   *ingress.Client
	key []byte
}

// NewIngressClient is a client of Restate's ingress at url, signing with
// key, with timeouts and a connection pool sized for ctrl (the SDK's
// default client has neither a timeout nor more than two idle connections
// per host).
func NewIngressClient(url string, key []byte, opts ...Option) *Ingress {
	return newIngress(url, key, 256, 30*time.Second, opts)
}

// Option changes how an Ingress connects.
type Option func(*http.Transport)

// WithTLS makes an https:// ingress URL verified with conf (a private CA,
// say) instead of the system roots.
func WithTLS(conf *tls.Config) Option {
	return func(tr *http.Transport) { tr.TLSClientConfig = conf }
}

// NewWaitingIngressClient is like NewIngressClient without the overall
// timeout, for calls that wait for an invocation to end (bound them with a
// deadline on the context).
func NewWaitingIngressClient(url string, key []byte, opts ...Option) *Ingress {
	return newIngress(url, key, 64, 0, opts)
}

func newIngress(url string, key []byte, conns int, timeout time.Duration, opts []Option) *Ingress {
	// At most conns connections: a burst of calls waits for one instead of
	// opening a connection each (a thousand at once outrun the dial
	// timeout on a busy machine).
	tr := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        conns,
		MaxIdleConnsPerHost: conns,
		MaxConnsPerHost:     conns,
		IdleConnTimeout:     90 * time.Second,
	}
	for _, o := range opts {
		o(tr)
	}
	return &Ingress{c: ingress.NewClient(url, ingress.WithHttpClient(&http.Client{Transport: tr, Timeout: timeout})), key: key}
}

// call starts a private handler's invocation through CtrlIngress.Call and
// returns its id; unless send, it then waits for the invocation (attached
// through the ingress) and decodes its output into out.
func (c *Ingress) call(ctx context.Context, service, key, handler string, input any, idempotencyKey string, send bool, out any) (string, error) {
	id, err := c.start(ctx, service, key, handler, input, idempotencyKey)
	if err != nil || send {
		return id, err
	}
	output, err := c.attach(ctx, id)
	if err != nil {
		return id, err
	}
	if out != nil && len(output) > 0 {
		if err := json.Unmarshal(output, out); err != nil {
			return id, fmt.Errorf("decode the answer of %s/%s: %w", service, handler, err)
		}
	}
	return id, nil
}

// start has CtrlIngress.Call start a private handler's invocation, signed,
// and returns its id.
func (c *Ingress) start(ctx context.Context, service, key, handler string, input any, idempotencyKey string) (string, error) {
	gc := workflows.GatewayCall{Service: service, Key: key, Handler: handler, IdempotencyKey: idempotencyKey, At: time.Now().UnixMilli(), Nonce: newNonce()}
	if input != nil {
		raw, err := json.Marshal(input)
		if err != nil {
			return "", fmt.Errorf("encode the input of %s/%s: %w", service, handler, err)
		}
		gc.Input = raw
	}
	body, err := json.Marshal(gc)
	if err != nil {
		return "", err
	}
	res, err := ingress.Service[json.RawMessage, workflows.GatewayResult](c.c, workflows.GatewayName, "Call").
		Request(ctx, json.RawMessage(body), restate.WithHeaders(map[string]string{workflows.SignatureHeader: workflows.SignBody(c.key, body)}))
	return res.InvocationID, err
}

// attachNotFoundFor bounds how long attach retries an invocation the
// ingress does not know yet: CtrlIngress.Call answers once it has sent
// the invocation, which the partition owning it may not have created yet
// (right after Restate restarted, while its partitions recover, that can
// take longer than this).
const attachNotFoundFor = 10 * time.Second

// attach waits for the invocation id and returns its output.
//
// Restate answers an attach to an invocation its partition does not know
// with 404 "not found" marked as the invocation's own outcome, the same
// answer as a handler's terminal 404. Here the invocation exists (Call
// started it; Restate delivers it), so once the bound is spent attach
// returns an error that says to retry, without the ingress error in its
// chain: the operators' APIs answer it UNAVAILABLE, not NOT_FOUND.
func (c *Ingress) attach(ctx context.Context, id string) (json.RawMessage, error) {
	deadline := time.Now().Add(attachNotFoundFor)
	wait := 10 * time.Millisecond
	for {
		output, err := ingress.InvocationById[json.RawMessage](c.c, id).Attach(ctx)
		var nf *ingress.InvocationNotFoundError
		if !errors.As(err, &nf) {
			return output, err
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("restate: invocation %s, started by %s.Call, is still unknown to its partition after %s "+
				"(Restate may be recovering, e.g. just restarted); retry the call: %v", id, workflows.GatewayName, attachNotFoundFor, err)
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(wait):
		}
		wait = min(2*wait, 500*time.Millisecond)
	}
}

// StartDeploy starts the deploy workflow of req.Deployment.ID and returns
// its invocation id. Starting it again is harmless: Restate answers with the
// invocation it already has for that workflow id.
func StartDeploy(ctx context.Context, c *Ingress, req workflows.DeployRequest) (string, error) {
	return c.call(ctx, workflows.DeployWorkflowName, req.Deployment.ID, "Run", req, "", true, nil)
}

// DeployOutcome waits for a deploy workflow's result.
func DeployOutcome(ctx context.Context, c *Ingress, deploymentID string) (workflows.DeployResult, error) {
	return ingress.WorkflowHandle[workflows.DeployResult](c.c, workflows.DeployWorkflowName, deploymentID).Attach(ctx)
}

// NotifyDeploy hands a decided outcome to a deploy workflow.
func NotifyDeploy(ctx context.Context, c *Ingress, deploymentID string, o workflows.Outcome) error {
	_, err := c.call(ctx, workflows.DeployWorkflowName, deploymentID, "Notify", o, "", true, nil)
	return err
}

// Stamp calls VersioningService.Stamp from outside Restate. A retry with
// the same idempotency key returns the same versions; without a key, every
// call stamps anew.
func Stamp(ctx context.Context, c *Ingress, refs []workflows.Ref, idempotencyKey string) (workflows.StampResponse, error) {
	var resp workflows.StampResponse
	_, err := c.call(ctx, workflows.VersioningServiceName, workflows.VersioningKey, "Stamp", workflows.StampRequest{Refs: refs}, idempotencyKey, false, &resp)
	return resp, err
}

// StartSentinelDeploy starts SentinelService.Deploy on a sentinel and
// returns its invocation id (which becomes the row's deploy_request).
// Deploys of one sentinel run one after another.
func StartSentinelDeploy(ctx context.Context, c *Ingress, id string, req workflows.SentinelDeployRequest) (string, error) {
	return c.call(ctx, workflows.SentinelServiceName, id, "Deploy", req, "", true, nil)
}

// SentinelDeployOutcome waits for a sentinel deploy started with
// StartSentinelDeploy. Use a client without an overall timeout (and a
// deadline on ctx): a deploy may wait for its cluster for minutes.
func SentinelDeployOutcome(ctx context.Context, c *Ingress, invocationID string) (workflows.SentinelDeployResult, error) {
	return ingress.InvocationById[workflows.SentinelDeployResult](c.c, invocationID).Attach(ctx)
}

// NotifySentinel hands a decided outcome to the sentinel's deploy that
// owns n.Request.
func NotifySentinel(ctx context.Context, c *Ingress, id string, n workflows.SentinelNotice) (workflows.NotifyResult, error) {
	handler := "NotifyReady"
	if n.Result != workflows.ResultReady {
		handler = "NotifyFailed"
	}
	var res workflows.NotifyResult
	_, err := c.call(ctx, workflows.SentinelServiceName, id, handler, n, "", false, &res)
	return res, err
}

// StartRollout calls SentinelRolloutService.Rollout.
func StartRollout(ctx context.Context, c *Ingress, req workflows.RolloutRequest) (workflows.RolloutStatus, error) {
	return c.rollout(ctx, "Rollout", req)
}

// GetRolloutStatus calls SentinelRolloutService.Status (a shared handler:
// it answers while a wave is in flight).
func GetRolloutStatus(ctx context.Context, c *Ingress) (workflows.RolloutStatus, error) {
	return c.rollout(ctx, "Status", nil)
}

// ResumeRollout calls SentinelRolloutService.Resume.
func ResumeRollout(ctx context.Context, c *Ingress, req workflows.ResumeRequest) (workflows.RolloutStatus, error) {
	return c.rollout(ctx, "Resume", req)
}

// CancelRollout calls SentinelRolloutService.Cancel.
func CancelRollout(ctx context.Context, c *Ingress) (workflows.RolloutStatus, error) {
	return c.rollout(ctx, "Cancel", nil)
}

// StartRollbackAll calls SentinelRolloutService.RollbackAll, which returns
// once the reverts are sent (state rolling_back); Status says when they are
// done.
func StartRollbackAll(ctx context.Context, c *Ingress) (workflows.RolloutStatus, error) {
	return c.rollout(ctx, "RollbackAll", nil)
}

func (c *Ingress) rollout(ctx context.Context, handler string, input any) (workflows.RolloutStatus, error) {
	var st workflows.RolloutStatus
	_, err := c.call(ctx, workflows.RolloutServiceName, workflows.RolloutKey, handler, input, "", false, &st)
	return st, err
}

// newNonce is 16 random bytes, hex: a signed call's once-only mark.
func newNonce() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return hex.EncodeToString(b)
}
