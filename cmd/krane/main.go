// Command krane is the per-cluster agent: it connects to ctrl, runs the
// controller plugins enabled in krane.hcl and keeps the cluster matching the
// desired state ctrl streams.
//
//	krane run -config krane.hcl        (default command)
//	krane validate -c krane.hcl   (check a file without running; --cluster: and the plugins' RBAC)
//	krane --version
package main

import (
	"context"
	"crypto/sha256"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/spf13/cobra"

	"krane.dev/host/agent"
	"krane.dev/host/config"
	"krane.dev/sdk"
	"krane.dev/sdk/telemetry"
	"krane.dev/shared/version"
)

func main() {
	var cfgPath string
	root := &cobra.Command{
		Use:           "krane",
		Short:         "Krane: keeps a Kubernetes cluster matching the desired state of ctrl",
		Version:       version.Version,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.PersistentFlags().StringVarP(&cfgPath, "config", "c", "krane.hcl", "path of krane.hcl")
	run := &cobra.Command{
		Use:   "run",
		Short: "Run the agent (the default)",
		RunE:  func(*cobra.Command, []string) error { return runAgent(cfgPath) },
	}
	var checkCluster bool
	validate := &cobra.Command{
		Use:   "validate",
		Short: "Check krane.hcl, including each enabled plugin's config block against the plugin's schema",
		Long: "Check krane.hcl, including each enabled plugin's config block against the plugin's schema. With --cluster, also ask " +
			"the API server whether each plugin's identity has every RBAC permission the plugin declares, and name the missing ones.",
		RunE: func(cmd *cobra.Command, _ []string) error {
			return validateConfig(cmd.Context(), cfgPath, checkCluster)
		},
	}
	validate.Flags().BoolVar(&checkCluster, "cluster", false, "also check each plugin's RBAC permissions against the cluster of krane.hcl's kubernetes block")
	root.RunE = run.RunE
	root.AddCommand(run, validate)
	if err := root.ExecuteContext(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "krane:", err)
		os.Exit(1)
	}
}

func newLogger(cfg *config.Config) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{
		Name: "krane", Level: hclog.LevelFromString(cfg.Log.Level), JSONFormat: cfg.Log.JSON,
		Output: os.Stderr, IncludeLocation: false,
	})
}

func runAgent(path string) error {
	cfg, err := config.Load(path, nil)
	if err != nil {
		return err
	}
	log := newLogger(cfg)
	log.Info("starting krane", "version", version.Version, "config", path)
	// Before any plugin starts: they run as krane's user, and krane's
	// environment may hold the ctrl token.
	if err := protectEnviron(); err != nil {
		log.Warn("cannot make krane's environment unreadable to its plugins (prctl PR_SET_DUMPABLE); a plugin could read the ctrl token from /proc", "error", err)
	} else if !environProtected {
		log.Warn("this system cannot hide krane's environment from its plugins, which run as its user: run only plugins you trust with the ctrl token")
	}
	if pi := cfg.Kubernetes.PluginIdentities; pi.Enabled && pi.PodName == "" {
		log.Info("plugin tokens are not bound to a pod (kubernetes.plugin_identities.pod_name is unset: krane is not in a pod, or its manifest does not say): a leaked token stays valid until it expires")
	}
	sdk.HeapProfileOnSignal(log, "krane")
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	// Tracing from OTEL_* (off when unset); plugins inherit the variables.
	flush, err := telemetry.Setup(ctx, "krane", telemetry.Options{})
	if err != nil {
		return err
	}
	defer func() {
		fctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = flush(fctx)
	}()

	a := agent.New(cfg, log, agent.Options{})
	l, err := net.Listen("tcp", cfg.Server.Listen)
	if err != nil {
		return fmt.Errorf("server.listen %s: %w", cfg.Server.Listen, err)
	}
	go func() {
		if err := a.Serve(ctx, l); err != nil {
			log.Error("health/metrics server failed", "error", err)
		}
	}()
	log.Info("serving /healthz, /readyz and /metrics", "address", l.Addr().String())
	go watchConfig(ctx, path, log, a)
	if cfg.Leader.Enabled {
		return a.RunElected(ctx)
	}
	return a.Run(ctx)
}

// watchConfig reloads on SIGHUP and when the file's content changes.
func watchConfig(ctx context.Context, path string, log hclog.Logger, a *agent.Agent) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	last := fileSum(path)
	tick := time.NewTicker(5 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			log.Info("SIGHUP: reloading configuration", "config", path)
		case <-tick.C:
			sum := fileSum(path)
			if sum == last {
				continue
			}
			log.Info("configuration file changed: reloading", "config", path)
		}
		last = fileSum(path)
		cfg, err := config.Load(path, nil)
		if err != nil {
			log.Error("reload rejected; keeping the running configuration", "error", err)
			continue
		}
		if err := a.Reload(cfg); err != nil {
			log.Error("reload failed", "error", err)
		}
	}
}

func fileSum(path string) [32]byte {
	b, err := os.ReadFile(path)
	if err != nil {
		return [32]byte{}
	}
	return sha256.Sum256(b)
}
