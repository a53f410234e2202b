package serve

import (
	"context"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	restate "github.com/restatedev/sdk-go"
	"google.golang.org/grpc"

	"krane.dev/ctrl/background"
	"krane.dev/ctrl/deployapi"
	"krane.dev/ctrl/deployspec"
	"krane.dev/ctrl/fleetapi"
	"krane.dev/ctrl/restateendpoint"
	"krane.dev/ctrl/restateingress"
	"krane.dev/ctrl/store"
	"krane.dev/ctrl/vault"
	"krane.dev/ctrl/workflows"
)

// restateStack is ctrl's Restate side while it runs: the endpoint Restate
// calls, its registration, the Notifier (the reports listener) and the
// deploy API registered on the gRPC server.
type restateStack struct {
	endpoint   *restateendpoint.Endpoint
	lis        net.Listener
	url        string
	notifier   *background.Notifier
	registered chan struct{}
	wg         sync.WaitGroup
}

// WorkflowDeps are the workflows' dependencies as configured.
func WorkflowDeps(cfg Config, st *store.Store, log hclog.Logger) workflows.Deps {
	return workflows.Deps{
		Store: st, Log: log, DeployTimeout: cfg.Deploy.Timeout,
		SentinelDeployTimeout: cfg.Sentinel.DeployTimeout,
		Sentinel: workflows.SentinelDefaults{
			Image: cfg.Sentinel.DefaultImage, Replicas: int32(cfg.Sentinel.DefaultReplicas),
			CPUMillicores: int64(cfg.Sentinel.DefaultCPUMillicores), MemoryMiB: int64(cfg.Sentinel.DefaultMemoryMiB),
		},
	}
}

// EndpointURL is the URL Restate calls: restate.endpoint.url, or derived
// from the address the endpoint listens on.
func EndpointURL(cfg Config, listening string) (string, error) {
	if cfg.Restate.Endpoint.URL != "" {
		return cfg.Restate.Endpoint.URL, nil
	}
	return restateendpoint.EndpointURL(listening)
}

// startRestate starts the endpoint, the Notifier and background
// registration (each stopped by ctx), and registers the deploy API on gs.
// It returns before registration succeeds: ctrl serves clusters whether or
// not Restate is up.
func startRestate(ctx context.Context, cfg Config, log hclog.Logger, st *store.Store, gs *grpc.Server, reg prometheus.Registerer, hooks workflows.Hooks, keys *vault.Source) (*restateStack, error) {
	if err := deployspec.ValidImage("sentinel.default_image", cfg.Sentinel.DefaultImage); err != nil {
		return nil, err
	}
	log = log.Named("restate")
	key, err := st.CtrlKey(ctx, store.RestateIngressKey)
	if err != nil {
		return nil, fmt.Errorf("the key that signs ctrl's calls through Restate's ingress: %w", err)
	}
	deps := WorkflowDeps(cfg, st, log)
	deps.Hooks, deps.Registerer, deps.IngressKey = hooks, reg, key
	if keys != nil {
		deps.Vault = keys // a nil *vault.Source would be a non-nil Resealer
	}
	services := workflows.Services(deps)
	if reg != nil {
		// The deployments' fleet gauges, read from MySQL on each scrape,
		// beside the deploy workflow's own metrics.
		reg.MustRegister(fleetapi.NewDeploymentCollector(st, log))
	}
	endpoint, err := restateendpoint.NewEndpoint(services, log, cfg.Restate.IdentityKeyList())
	if err != nil {
		return nil, err
	}
	lis, err := net.Listen("tcp", cfg.Restate.Endpoint.Listen)
	if err != nil {
		return nil, fmt.Errorf("listen for Restate on %s (restate.endpoint.listen): %w", cfg.Restate.Endpoint.Listen, err)
	}
	url, err := EndpointURL(cfg, lis.Addr().String())
	if err != nil {
		lis.Close()
		return nil, err
	}
	ingress := restateingress.NewIngressClient(cfg.Restate.IngressURL, key)
	r := &restateStack{
		endpoint: endpoint, lis: lis, url: url, registered: make(chan struct{}),
		notifier: background.NewNotifier(background.NotifierOptions{
			Store: st, Ingress: ingress, Log: log, Registerer: reg,
			ResyncInterval: cfg.Deploy.ResyncInterval, DefaultTimeout: cfg.Deploy.Timeout,
			SentinelTimeout: cfg.Sentinel.DeployTimeout,
		}),
	}
	// The operator APIs backed by Restate. Another one registers here too;
	// ctrl/auth already requires an operator token for every service but
	// the ClusterService.
	deployapi.New(deployapi.Options{Store: st, Ingress: ingress, Log: log, DefaultTimeout: cfg.Deploy.Timeout, Vault: keys,
		LiveClusterWithin: cfg.Deploy.LiveClusterWithin}).Register(gs)
	deployapi.NewSentinels(deployapi.SentinelOptions{Store: st, Ingress: ingress, Waiting: restateingress.NewWaitingIngressClient(cfg.Restate.IngressURL, key), Log: log,
		LiveClusterWithin: cfg.Deploy.LiveClusterWithin, Vault: keys}).Register(gs)

	r.wg.Go(func() {
		if err := endpoint.Serve(lis); err != nil {
			log.Error("the Restate endpoint stopped", "error", err)
		}
	})
	r.wg.Go(func() { r.notifier.Run(ctx) })
	sweeper := background.NewSentinelSweeper(background.SentinelSweeperOptions{Store: st, Log: log, Registerer: reg, IdleAfter: cfg.Sentinel.IdleStopAfter})
	r.wg.Go(func() { sweeper.Run(ctx) })
	if cfg.Restate.RegisterOnStart {
		r.wg.Go(func() { r.register(ctx, cfg.Restate.AdminURL, services, log) })
	} else {
		close(r.registered)
	}
	log.Info("Restate endpoint serving", "listen", lis.Addr().String(), "url", url, "ingress", cfg.Restate.IngressURL)
	return r, nil
}

// register registers the endpoint, retrying with backoff (Restate may
// start after ctrl) until it succeeds or ctx ends.
func (r *restateStack) register(ctx context.Context, admin string, services []restate.ServiceDefinition, log hclog.Logger) {
	backoff := 500 * time.Millisecond
	for {
		res, err := restateendpoint.Register(ctx, admin, r.url, services, restateendpoint.RegisterOptions{})
		if err == nil {
			log.Info("registered with Restate", "action", res.Action, "deployment", res.DeploymentID, "reason", res.Reason, "url", r.url)
			close(r.registered)
			return
		}
		if ctx.Err() != nil {
			return
		}
		log.Warn("cannot register with Restate yet; retrying (deploys wait until it works)", "admin", admin, "retry_in", backoff, "error", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 30*time.Second)
	}
}

// stop shuts the endpoint down and waits for the stack's goroutines (ctx
// of startRestate must be cancelled first).
func (r *restateStack) stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// Past the deadline the endpoint is closed forcibly: Restate retries
	// the invocations it cut off once an endpoint serves again.
	_ = r.endpoint.Shutdown(ctx)
	r.wg.Wait()
}
