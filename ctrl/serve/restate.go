package serve

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
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
	"krane.dev/shared/certreload"
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

// EndpointURL is the URL Restate calls a ctrl of version v at:
// restate.endpoint.url (or one derived from the address the endpoint
// listens on) and the path of v's line (restateendpoint.Base), so that
// each ctrl line is a Restate deployment of its own.
func EndpointURL(cfg Config, listening, v string) (string, error) {
	u := cfg.Restate.Endpoint.URL
	if u == "" {
		var err error
		if u, err = restateendpoint.EndpointURL(listening); err != nil {
			return "", err
		}
		if cfg.Restate.Endpoint.TLSCert != "" {
			u = "https://" + strings.TrimPrefix(u, "http://")
		}
	}
	return strings.TrimRight(u, "/") + restateendpoint.Base(v), nil
}

// startRestate starts the endpoint, the Notifier and background
// registration (each stopped by ctx), and registers the deploy API on gs.
// It returns before registration succeeds: ctrl serves clusters whether or
// not Restate is up.
func startRestate(ctx context.Context, cfg Config, log hclog.Logger, st *store.Store, gs *grpc.Server, reg prometheus.Registerer, hooks workflows.Hooks, keys *vault.Source, ctrlVersion string) (*restateStack, error) {
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
	var endpointTLS *tls.Config
	if e := cfg.Restate.Endpoint; e.TLSCert != "" {
		// Read again when the files change, like grpc.tls_cert.
		kp, err := certreload.LoadKeyPair(e.TLSCert, e.TLSKey, certreload.Options{Log: log, Name: "restate.endpoint.tls_cert"})
		if err != nil {
			return nil, fmt.Errorf("the Restate endpoint: %w", err)
		}
		endpointTLS = certreload.ServerConfig(kp, nil)
	}
	endpoint, err := restateendpoint.NewEndpoint(services, restateendpoint.EndpointOptions{
		Log: log, IdentityKeys: cfg.Restate.IdentityKeyList(), Base: restateendpoint.Base(ctrlVersion), Registerer: reg, TLS: endpointTLS,
	})
	if err != nil {
		return nil, err
	}
	lis, err := net.Listen("tcp", cfg.Restate.Endpoint.Listen)
	if err != nil {
		return nil, fmt.Errorf("listen for Restate on %s (restate.endpoint.listen): %w", cfg.Restate.Endpoint.Listen, err)
	}
	url, err := EndpointURL(cfg, lis.Addr().String(), ctrlVersion)
	if err != nil {
		lis.Close()
		return nil, err
	}
	ingressTLS, adminTLS, err := restateTLSConfigs(cfg.Restate, log)
	if err != nil {
		lis.Close()
		return nil, err
	}
	var ingressOpts []restateingress.Option
	if ingressTLS != nil {
		ingressOpts = append(ingressOpts, restateingress.WithTLS(ingressTLS))
	}
	adminClient := adminHTTPClient(adminTLS)
	ingress := restateingress.NewIngressClient(cfg.Restate.IngressURL, key, ingressOpts...)
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
	deployapi.NewSentinels(deployapi.SentinelOptions{Store: st, Ingress: ingress, Waiting: restateingress.NewWaitingIngressClient(cfg.Restate.IngressURL, key, ingressOpts...), Log: log,
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
		r.wg.Go(func() { r.register(ctx, cfg.Restate.AdminURL, adminClient, services, log) })
	} else {
		close(r.registered)
	}
	log.Info("Restate endpoint serving", "listen", lis.Addr().String(), "url", url, "ingress", cfg.Restate.IngressURL)
	return r, nil
}

// RestateAdminClient is the HTTP client for restate.admin_url that c
// describes (restate.ca_file for an https:// URL), for the CLI's
// registration.
func RestateAdminClient(c RestateConfig) (*http.Client, error) {
	_, adminTLS, err := restateTLSConfigs(c, nil)
	if err != nil {
		return nil, err
	}
	return adminHTTPClient(adminTLS), nil
}

func adminHTTPClient(conf *tls.Config) *http.Client {
	c := &http.Client{Timeout: 10 * time.Second}
	if conf != nil {
		c.Transport = &http.Transport{TLSClientConfig: conf, Proxy: http.ProxyFromEnvironment}
	}
	return c
}

// restateTLSConfigs verify https:// restate.ingress_url and
// restate.admin_url against restate.ca_file (re-read when it changes), each
// for its own URL's host; nil (the system roots) when it is not set.
func restateTLSConfigs(c RestateConfig, log hclog.Logger) (ingress, admin *tls.Config, err error) {
	if c.CAFile == "" {
		return nil, nil, nil
	}
	roots, err := certreload.LoadCAPool(c.CAFile, certreload.Options{Log: log, Name: "restate.ca_file"})
	if err != nil {
		return nil, nil, err
	}
	host := func(raw string) string {
		u, err := url.Parse(raw)
		if err != nil {
			return ""
		}
		return u.Hostname()
	}
	return certreload.ClientConfig(host(c.IngressURL), roots, nil), certreload.ClientConfig(host(c.AdminURL), roots, nil), nil
}

// reregisterEvery is how often a registered ctrl checks that Restate
// still routes its services as Register decides: a replica of an older
// line restarting during a roll (v0.1 replicas take the services back on
// start) hands new invocations back to the newest line within it.
const reregisterEvery = time.Minute

// register registers the endpoint, retrying with backoff (Restate may
// start after ctrl) until it succeeds, then checks again every
// reregisterEvery, until ctx ends.
func (r *restateStack) register(ctx context.Context, admin string, client *http.Client, services []restate.ServiceDefinition, log hclog.Logger) {
	backoff := 500 * time.Millisecond
	last := ""
	for {
		res, err := restateendpoint.Register(ctx, admin, r.url, services, restateendpoint.RegisterOptions{HTTPClient: client})
		wait := reregisterEvery
		switch {
		case err == nil:
			if said := res.Action + res.Newer; said != last || res.Action != restateendpoint.RegisterUnchanged {
				log.Info("registered with Restate", "action", res.Action, "deployment", res.DeploymentID, "reason", res.Reason, "url", r.url)
				if res.Newer != "" {
					log.Info("a newer ctrl line takes new invocations; this replica finishes those pinned to its deployment, and can stop once `ctrl restate drain` says it is drained", "newer", res.Newer)
				}
				last = said
			}
			select {
			case <-r.registered:
			default:
				close(r.registered)
			}
			backoff = 500 * time.Millisecond
		case ctx.Err() != nil:
			return
		default:
			log.Warn("cannot register with Restate; retrying (deploys wait until it works)", "admin", admin, "retry_in", backoff, "error", err)
			wait, backoff = backoff, min(backoff*2, 30*time.Second)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
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
