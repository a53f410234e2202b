// Command krane-sentinel is the sentinel data plane: the HTTP reverse proxy
// that fronts one environment's workloads in one region. It reads its
// routes from a ConfigMap the sentinel plugin writes and its instances from
// EndpointSlices, and takes no flags: the sentinel plugin configures it
// through the environment (see krane.dev/sentinel/server for the variables).
//
//	krane-sentinel            (serve)
//	krane-sentinel --version
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/hashicorp/go-hclog"

	"krane.dev/sentinel/server"
	"krane.dev/shared/version"
)

func main() {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case "--version", "-version", "version":
			fmt.Println("krane-sentinel", version.Version)
			return
		default:
			fmt.Fprintf(os.Stderr, "krane-sentinel takes no arguments (got %q); it is configured through the environment\n", os.Args[1:])
			os.Exit(2)
		}
	}
	cfg, err := server.FromEnv(os.Getenv)
	log := hclog.New(&hclog.LoggerOptions{Name: "krane-sentinel", Level: hclog.LevelFromString(cfg.LogLevel), JSONFormat: true, Output: os.Stderr})
	if err != nil {
		log.Error(err.Error())
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := server.Run(ctx, cfg, log, server.Listeners{}); err != nil {
		log.Error(err.Error())
		os.Exit(1)
	}
}
