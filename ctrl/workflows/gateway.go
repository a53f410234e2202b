package workflows

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	restate "github.com/restatedev/sdk-go"

	"krane.dev/ctrl/store"
)

// GatewayName is the Restate name of CtrlIngress, the one service of ctrl
// that Restate's ingress may call. Every other handler is private to the
// ingress: it answers only other handlers, so whoever reaches the ingress
// cannot make a deployment live (DeployWorkflow.Notify), deploy a sentinel,
// stamp versions or start a rollout. ctrl's own calls from outside Restate
// (the operators' APIs, the Notifier) go through CtrlIngress.Call, signed
// with a key only ctrl holds (store.RestateIngressKey, shared by every
// replica through the database); Call checks the signature, starts the
// private handler's invocation and answers its id at once, and the caller
// attaches to that invocation for its result: attaching (reading a result)
// stays open on the ingress, as it starts nothing. Call never waits for
// the invocation it starts: a burst of calls held open in Call would hold
// Restate's invoker slots while the calls they wait for queue for one.
const GatewayName = "CtrlIngress"

// SignatureHeader carries the HMAC-SHA256 of a CtrlIngress.Call body, as
// "v1=<hex>".
const SignatureHeader = "x-krane-ctrl-signature"

// signatureMaxAge is how old a signed call may be when CtrlIngress first
// runs it (its At field): a call seen on the wire cannot be sent again
// later. The check is journaled, so Restate retrying the invocation later
// does not fail it.
const signatureMaxAge = 5 * time.Minute

// gatewayVerify is CtrlIngress's one step: the signature check.
var gatewayVerify = newStep(GatewayName, "verify")

// GatewayCall asks CtrlIngress to call a private handler: the body of
// CtrlIngress.Call, which ctrl/restateingress signs and sends.
type GatewayCall struct {
	Service string `json:"service"`
	Key     string `json:"key,omitempty"`
	Handler string `json:"handler"`
	// Input is the handler's input, as JSON.
	Input json.RawMessage `json:"input,omitempty"`
	// IdempotencyKey is passed on to the call.
	IdempotencyKey string `json:"idempotency_key,omitempty"`
	// At is when ctrl signed the call, unix milliseconds.
	At int64 `json:"at"`
	// Nonce is random, once per call: CtrlIngress remembers it for
	// signatureMaxAge (in the database, for every replica), so a call
	// seen on the wire cannot be sent again within its window either.
	Nonce string `json:"nonce"`
}

// GatewayResult is CtrlIngress.Call's answer: the id of the invocation it
// started.
type GatewayResult struct {
	InvocationID string `json:"invocation_id"`
}

// gatewayRoutes are the private handlers ctrl calls from outside Restate,
// by service, with the service's kind.
var gatewayRoutes = map[string]struct {
	kind     string
	handlers []string
}{
	DeployWorkflowName:    {"workflow", []string{"Run", "Notify"}},
	SentinelServiceName:   {"object", []string{"Deploy", "NotifyReady", "NotifyFailed"}},
	RolloutServiceName:    {"object", []string{"Rollout", "Status", "Resume", "Cancel", "RollbackAll"}},
	VersioningServiceName: {"object", []string{"Stamp"}},
}

// SignBody is the signature header's value for a Call body.
func SignBody(key, body []byte) string {
	m := hmac.New(sha256.New, key)
	m.Write(body)
	return "v1=" + hex.EncodeToString(m.Sum(nil))
}

type gateway struct {
	key   []byte
	hooks Hooks
	store *store.Store
}

// NewGateway is CtrlIngress (see GatewayName). key is the signing key;
// without one every call is refused.
func NewGateway(d Deps) restate.ServiceDefinition {
	g := &gateway{key: d.IngressKey, hooks: d.Hooks, store: d.Store}
	return restate.NewService(GatewayName, RetryPolicy(),
		// Calls are frequent (Status polls) and carry nothing to debug
		// later: keep their journals briefly.
		restate.WithJournalRetention(10*time.Minute),
	).Handler("Call", restate.NewServiceHandler(g.call))
}

// verify checks a Call's signature, age and nonce. It runs in a step: its
// answer is journaled, so a later retry of the invocation reuses it (and
// a retry of the step itself finds the nonce used by its own invocation).
func (g *gateway) verify(rc restate.RunContext, in GatewayCall) (string, error) {
	if refused := g.checkSignature(rc, in); refused != "" {
		return refused, nil
	}
	if len(in.Nonce) < 16 || len(in.Nonce) > 64 {
		return "the call carries no nonce", nil
	}
	fresh, err := g.store.UseCallNonce(rc, in.Nonce, rc.Request().ID, time.UnixMilli(in.At).Add(signatureMaxAge))
	if err != nil {
		return "", err
	}
	if !fresh {
		return "its nonce was used by another call (a replay)", nil
	}
	return "", nil
}

// checkSignature checks a Call's signature and age.
func (g *gateway) checkSignature(rc restate.RunContext, in GatewayCall) string {
	if len(g.key) == 0 {
		return "this ctrl has no ingress key"
	}
	var sig string
	for k, v := range rc.Request().Headers.Iter() {
		if strings.EqualFold(k, SignatureHeader) {
			sig = v
		}
	}
	if sig == "" {
		return "the call carries no " + SignatureHeader + " header"
	}
	if !hmac.Equal([]byte(sig), []byte(SignBody(g.key, rc.Request().Body))) {
		return "its signature does not match"
	}
	if age := time.Since(time.UnixMilli(in.At)); age > signatureMaxAge || age < -signatureMaxAge {
		return fmt.Sprintf("it was signed %s ago, more than %s", age.Round(time.Second), signatureMaxAge)
	}
	return ""
}

// call starts the invocation of the private handler a signed call names.
func (g *gateway) call(ctx restate.Context, in GatewayCall) (GatewayResult, error) {
	refused, err := runStep(ctx, g.hooks, gatewayVerify, func(rc restate.RunContext) (string, error) { return g.verify(rc, in) })
	if err != nil {
		return GatewayResult{}, err
	}
	if refused != "" {
		return GatewayResult{}, restate.ToTerminalError(fmt.Errorf("%s.Call refused: %s: only ctrl calls ctrl's services", GatewayName, refused),
			restate.WithErrorCode(codeUnauthorized))
	}
	route, ok := gatewayRoutes[in.Service]
	if !ok || !slices.Contains(route.handlers, in.Handler) {
		return GatewayResult{}, restate.ToTerminalError(fmt.Errorf("%s.Call: %s/%s is not a handler ctrl calls from outside Restate", GatewayName, in.Service, in.Handler),
			restate.WithErrorCode(codeInvalid))
	}
	input := any(in.Input)
	if len(in.Input) == 0 {
		input = restate.Void{}
	}
	var opts []restate.SendOption
	if in.IdempotencyKey != "" {
		opts = append(opts, restate.WithIdempotencyKey(in.IdempotencyKey))
	}
	var inv restate.Invocation
	switch route.kind {
	case "workflow":
		inv = restate.WorkflowSend(ctx, in.Service, in.Key, in.Handler).Send(input, opts...)
	default:
		inv = restate.ObjectSend(ctx, in.Service, in.Key, in.Handler).Send(input, opts...)
	}
	return GatewayResult{InvocationID: inv.GetInvocationId()}, nil
}
