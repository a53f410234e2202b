package sdk

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"
	"k8s.io/klog/v2"

	"krane.dev/sdk/telemetry"
)

// EnvLogLevel is how the host passes its log level to plugins.
const EnvLogLevel = "KRANE_PLUGIN_LOG_LEVEL"

// Factory builds a plugin's Controller. The logger writes to the host.
type Factory func(log hclog.Logger) Controller

// Serve runs a plugin binary: it never returns.
//
// It answers `--version` (prints name and version) and `--describe` (prints
// Info as JSON) for people and tools. Otherwise, started by the host, it:
//   - builds an hclog JSON logger on the real stderr *before* go-plugin takes
//     stdio over, and routes klog (client-go's logger) into it, so every log
//     line reaches the host;
//   - keeps stdout for the handshake: anything the factory prints goes to
//     stderr instead of corrupting it;
//   - serves krane.plugin.v1 with a raised message limit (AutoMTLS is used
//     whenever the host asks for it, as the krane host always does);
//   - exits when the host process goes away (parent watcher) and shuts down
//     the controller on SIGTERM;
//   - turns OpenTelemetry tracing on when the OTEL_* variables ask for it
//     (package telemetry) and continues the host's trace around Apply;
//   - writes a heap profile on SIGUSR1 when EnvHeapProfileDir is set.
func Serve(factory Factory) {
	log := hclog.New(&hclog.LoggerOptions{
		Level:      hclog.LevelFromString(envOr(EnvLogLevel, "info")),
		Output:     os.Stderr,
		JSONFormat: true,
	})
	klog.SetLogger(newLogr(log.Named("klog")))

	realStdout := os.Stdout
	os.Stdout = os.Stderr
	impl := factory(log)
	os.Stdout = realStdout

	if len(os.Args) > 1 {
		switch os.Args[1] {
		case "--version", "-version", "version":
			info := mustDescribe(impl)
			fmt.Printf("%s %s (krane plugin protocol %d)\n", info.Name, info.Version, ProtocolVersion)
			os.Exit(0)
		case "--describe", "-describe", "describe":
			out, _ := json.MarshalIndent(mustDescribe(impl), "", "  ")
			fmt.Println(string(out))
			os.Exit(0)
		}
	}

	// Tracing from the OTEL_* variables the host passes on (see package
	// telemetry); the plugin reports under its own name, not the host's.
	service := filepath.Base(os.Args[0])
	if !strings.HasPrefix(service, "krane-plugin-") {
		service = "krane-plugin-" + service
	}
	flush, err := telemetry.Setup(context.Background(), service, telemetry.Options{IgnoreServiceNameEnv: true})
	if err != nil {
		log.Error("tracing is off: the OTEL_* environment cannot be used", "error", err)
	}

	HeapProfileOnSignal(log, service)
	go exitWithParent(log, impl)
	go shutdownOnSIGTERM(log, impl)

	plugin.Serve(ServeConfig(impl, log))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	_ = flush(ctx)
	cancel()
	os.Exit(0)
}

// ServeConfig is the go-plugin configuration Serve uses; sdk/plugintest
// serves controllers in a test process with it.
func ServeConfig(impl Controller, log hclog.Logger) *plugin.ServeConfig {
	return &plugin.ServeConfig{
		HandshakeConfig:  Handshake,
		VersionedPlugins: pluginSets(&grpcPlugin{impl: impl}),
		GRPCServer: func(opts []grpc.ServerOption) *grpc.Server {
			return grpc.NewServer(append(opts, serverOptions()...)...)
		},
		Logger: log,
	}
}

func mustDescribe(impl Controller) Info {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := impl.Describe(ctx, &DescribeRequest{})
	if err != nil || resp == nil {
		fmt.Fprintln(os.Stderr, "describe:", err)
		os.Exit(1)
	}
	return resp.Info
}

// exitWithParent ends the plugin when the host dies. The host also sets
// Pdeathsig, but that is Linux-only and tied to the forking thread; this
// watcher catches everything else.
func exitWithParent(log hclog.Logger, impl Controller) {
	parent := os.Getppid()
	for range time.Tick(time.Second) {
		if os.Getppid() != parent {
			log.Warn("krane host went away, exiting", "old_parent_pid", parent)
			shutdown(impl, 2*time.Second)
			os.Exit(1)
		}
	}
}

func shutdownOnSIGTERM(log hclog.Logger, impl Controller) {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGTERM)
	<-ch
	log.Info("SIGTERM received, shutting down")
	shutdown(impl, defaultShutdownTimeout)
	os.Exit(0)
}

func shutdown(impl Controller, timeout time.Duration) {
	sd, ok := impl.(Shutdowner)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	_ = sd.Shutdown(ctx)
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
