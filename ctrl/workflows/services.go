package workflows

import (
	"context"
	"fmt"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	restate "github.com/restatedev/sdk-go"

	"krane.dev/ctrl/store"
)

// Deps are what ctrl's Restate services need. Fields only some services use
// are ignored by the others.
type Deps struct {
	Store *store.Store
	Log   hclog.Logger
	// Sentinel is the configuration of sentinels the deploy workflow
	// creates for environments that have none yet.
	Sentinel SentinelDefaults
	// DeployTimeout is how long a deploy waits for every region to run
	// when its request does not say.
	DeployTimeout time.Duration
	// SentinelDeployTimeout is how long a SentinelService.Deploy waits for
	// the cluster when its request does not say (sentinel.deploy_timeout).
	SentinelDeployTimeout time.Duration
	// Vault re-seals an environment's sentinel credentials for a sentinel
	// a deploy creates; nil when ctrl has no keyring (the deploy then says
	// the new sentinel starts without them).
	Vault store.Resealer
	// IngressKey signs ctrl's calls through Restate's ingress (see
	// GatewayName): CtrlIngress refuses calls without its signature.
	IngressKey []byte
	// Registerer receives the services' metrics; nil registers none.
	Registerer prometheus.Registerer
	// Hooks are for tests.
	Hooks Hooks

	m *metrics
}

// metrics are the services' own metrics (the Notifier has its own).
type metrics struct {
	versioningBypassed prometheus.Counter
	deploy             *deployMetrics
}

// metrics returns the services' metrics, registering them on first use.
// Services builds every service from one Deps, so they share them.
func (d *Deps) metrics() *metrics {
	if d.m == nil {
		d.m = &metrics{versioningBypassed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "krane_ctrl_versioning_bypassed_total",
			Help: "Deploys that stamped their rows themselves because the VersioningService did not answer in time: one of its invocations is paused or stuck (see `restate invocations ls`).",
		}), deploy: newDeployMetrics(d.Store, d.Log)}
		if d.Registerer != nil {
			d.Registerer.MustRegister(d.m.versioningBypassed)
			d.Registerer.MustRegister(d.m.deploy.collectors()...)
		}
	}
	return d.m
}

// SentinelDefaults configure new sentinels (ctrl config sentinel.default_*).
type SentinelDefaults struct {
	Image         string
	Replicas      int32
	CPUMillicores int64
	MemoryMiB     int64
}

// Hooks let tests act at chosen points. Production code never sets them.
type Hooks struct {
	// AfterStep runs inside a restate.Run body after its side effects
	// committed and before Restate has journaled the result (a crash here
	// makes the body run again). step names the body, e.g.
	// "VersioningService.stamp" (see Steps); ctx is the body's
	// restate.RunContext. An error it returns fails the body as if the
	// process had died there: Restate runs the body again.
	AfterStep func(ctx context.Context, step string) error
	// StepResult sees the result of every body that AfterStep let
	// through (the result Restate journals): the crash-point suite checks
	// the steps that write nothing by their results.
	StepResult func(ctx context.Context, step string, result any)
	// VersioningWait replaces how long a deploy waits for the
	// VersioningService (0: versioningWait).
	VersioningWait time.Duration
}

func (h Hooks) after(ctx context.Context, step string) error {
	if h.AfterStep == nil {
		return nil
	}
	return h.AfterStep(ctx, step)
}

// services declares every Restate service ctrl serves, in registration
// order: its name and its constructor. It is the one list of them: Services
// builds from it, ServiceNames reads it, and ctrl/doc.go's test checks
// the package docs name each. A new service is a file with its constructor
// and a line here.
var services = []struct {
	name  string
	build func(Deps) restate.ServiceDefinition
}{
	{VersioningServiceName, NewVersioningService},
	{DeployWorkflowName, NewDeployWorkflow},
	{SentinelServiceName, NewSentinelService},
	{RolloutServiceName, NewSentinelRolloutService},
	{RolloutWorkerName, NewSentinelRolloutWorker},
	{GatewayName, NewGateway},
}

// ServiceNames are the names of every Restate service ctrl serves, in
// registration order.
func ServiceNames() []string {
	names := make([]string, len(services))
	for i, s := range services {
		names[i] = s.name
	}
	return names
}

// Services builds every Restate service ctrl serves, in registration order.
func Services(d Deps) []restate.ServiceDefinition {
	d.metrics()
	defs := make([]restate.ServiceDefinition, len(services))
	for i, s := range services {
		defs[i] = s.build(d)
		if defs[i].Name() != s.name {
			panic(fmt.Sprintf("workflows: service declared as %s builds as %s", s.name, defs[i].Name()))
		}
	}
	return defs
}

// private hides a service from Restate's ingress: only other handlers call
// it (ctrl's own calls from outside go through CtrlIngress).
func private() restate.ServiceDefinitionOption { return restate.WithIngressPrivate(true) }

// RetryPolicy is the invocation retry policy every service of ctrl sets.
//
// An ordinary error (the database or ctrl's endpoint unreachable, a
// deadlock) is retried: 0.5 s after the first attempt, doubling to at most
// 30 s between attempts, for 250 attempts, about two hours. That rides out a
// database failover or a ctrl rollout. Restate's own default would pause an
// invocation after about an hour (70 attempts) and nobody would notice; here
// the horizon is explicit, and ctrl's deploy resync logs and counts every
// deployment still in progress past its deadline
// (krane_ctrl_deploys_overdue), which is what a paused deploy looks like.
// A paused invocation keeps its journal: once the cause is fixed, `restate
// invocations resume <id>` continues it where it stopped. Pausing rather than
// killing is deliberate: a killed deploy would leave its deployment half
// way, without its cleanup.
//
// Input that can never succeed is a terminal error (no retry) with an HTTP
// like code: 400 invalid input, 404 a missing row, 412 a state that forbids
// the step. 409 is Restate's own code for a cancelled invocation, so ctrl
// never uses it.
func RetryPolicy() restate.ServiceDefinitionOption {
	return restate.WithInvocationRetryPolicy(
		restate.WithInitialRetryInterval(500*time.Millisecond),
		restate.WithRetryIntervalFactor(2),
		restate.WithMaxRetryInterval(30*time.Second),
		restate.WithMaxRetryAttempts(250),
		restate.PauseOnMaxAttempts(),
	)
}

// Terminal error codes (see RetryPolicy).
const (
	codeInvalid      = 400
	codeUnauthorized = 401
	codeNotFound     = 404
	codePrecondition = 412
	// codeCancelled is Restate's, on an invocation an operator cancelled.
	codeCancelled = 409
)
