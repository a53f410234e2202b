package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"krane.dev/sentinel/proxy"
	"krane.dev/sentinel/watch"
)

// Admin paths.
const (
	PathMetrics = "/metrics"
	PathHealthz = "/healthz"
	PathReadyz  = "/readyz"
)

// Listeners lets a caller (a test, a benchmark) pass bound listeners; nil
// ones are opened from the Config's addresses.
type Listeners struct {
	Data, Admin net.Listener
}

// Run serves until ctx ends, then shuts down gracefully. It returns an
// error when it cannot start, or when a server fails.
func Run(ctx context.Context, cfg Config, log hclog.Logger, ls Listeners) error {
	kc, err := kubeConfig(cfg.Kubeconfig)
	if err != nil {
		return err
	}
	kc.UserAgent = "krane-sentinel"
	client, err := kubernetes.NewForConfig(kc)
	if err != nil {
		return fmt.Errorf("sentinel: kube client: %w", err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	rt, err := proxy.NewRouter(proxy.Options{
		SentinelID: cfg.SentinelID, EnvironmentID: cfg.EnvironmentID, Region: cfg.Region,
		MaxBodyBytes: cfg.MaxBodyBytes, DialTimeout: cfg.DialTimeout, ResponseHeaderTimeout: cfg.UpstreamHeaderTimeout,
		TrustedProxies: cfg.TrustedProxies, AccessLog: cfg.AccessLog, Logger: log, Registry: reg,
	})
	if err != nil {
		return err
	}
	defer rt.Close()

	if ls.Data == nil {
		if ls.Data, err = net.Listen("tcp", cfg.HTTPAddr); err != nil {
			return fmt.Errorf("sentinel: data port %s: %w (set %s to a free port)", cfg.HTTPAddr, err, EnvHTTPPort)
		}
	}
	if ls.Admin == nil {
		if ls.Admin, err = net.Listen("tcp", cfg.AdminAddr); err != nil {
			ls.Data.Close()
			return fmt.Errorf("sentinel: admin port %s: %w (set %s)", cfg.AdminAddr, err, EnvAdminAddr)
		}
	}
	errLog := log.Named("http").StandardLogger(&hclog.StandardLoggerOptions{InferLevels: true})
	data := &http.Server{
		Handler:           rt,
		ReadHeaderTimeout: cfg.ReadHeaderTimeout,
		ReadTimeout:       cfg.ReadTimeout,
		WriteTimeout:      cfg.WriteTimeout,
		IdleTimeout:       cfg.IdleTimeout,
		MaxHeaderBytes:    cfg.MaxHeaderBytes,
		ErrorLog:          errLog,
	}
	mux := http.NewServeMux()
	mux.Handle(PathMetrics, promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc(PathHealthz, func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc(PathReadyz, func(w http.ResponseWriter, _ *http.Request) {
		if ok, why := rt.Ready(); !ok {
			http.Error(w, why, http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	admin := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, ErrorLog: errLog}

	// The watch outlives ctx: instances may change while requests drain.
	wctx, stopWatch := context.WithCancel(context.Background())
	defer stopWatch()
	watchErr := make(chan error, 1)
	go func() {
		watchErr <- watch.Run(wctx, watch.Options{Client: client, Namespace: cfg.RoutesNamespace, Name: cfg.RoutesName,
			SentinelID: cfg.SentinelID, EnvironmentID: cfg.EnvironmentID, Router: rt, Logger: log.Named("watch"),
			DrainTimeout: cfg.DrainTimeout})
	}()
	serveErr := make(chan error, 2)
	go func() { serveErr <- data.Serve(ls.Data) }()
	go func() { serveErr <- admin.Serve(ls.Admin) }()
	log.Info("sentinel started", "data", ls.Data.Addr().String(), "admin", ls.Admin.Addr().String(),
		"environment", cfg.EnvironmentID, "region", cfg.Region, "routes", cfg.RoutesNamespace+"/"+cfg.RoutesName)

	var runErr error
	watchDone := false
	select {
	case <-ctx.Done():
	case err := <-serveErr:
		runErr = fmt.Errorf("sentinel: server stopped: %w", err)
	case err := <-watchErr:
		watchDone = true
		if err != nil {
			runErr = fmt.Errorf("sentinel: watch: %w", err)
		}
	}
	// Readiness first, then a pause so endpoints and load balancers stop
	// sending, then drain what is in flight.
	rt.Drain()
	if runErr == nil && cfg.ShutdownDelay > 0 {
		log.Info("shutting down: not ready, waiting before drain", "delay", cfg.ShutdownDelay)
		time.Sleep(cfg.ShutdownDelay)
	}
	dctx, cancel := context.WithTimeout(context.Background(), cfg.DrainTimeout)
	defer cancel()
	if err := data.Shutdown(dctx); err != nil {
		log.Warn("requests still in flight at the drain timeout were cut", "timeout", cfg.DrainTimeout, "error", err)
		_ = data.Close()
	}
	stopWatch()
	_ = admin.Close()
	if watchDone {
		log.Info("sentinel stopped")
		return runErr
	}
	if err := <-watchErr; err != nil && runErr == nil && !errors.Is(err, context.Canceled) {
		runErr = fmt.Errorf("sentinel: watch: %w", err)
	}
	log.Info("sentinel stopped")
	return runErr
}

func kubeConfig(path string) (*rest.Config, error) {
	if path != "" {
		c, err := clientcmd.BuildConfigFromFlags("", path)
		if err != nil {
			return nil, fmt.Errorf("sentinel: kubeconfig %s: %w (unset %s to use the in-cluster config)", path, err, EnvKubeconfig)
		}
		return c, nil
	}
	c, err := rest.InClusterConfig()
	if err != nil {
		return nil, fmt.Errorf("sentinel: in-cluster kube config: %w (outside a cluster, set %s)", err, EnvKubeconfig)
	}
	return c, nil
}
