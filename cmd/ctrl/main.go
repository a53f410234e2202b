// Command ctrl is Krane's control plane: `ctrl serve` runs it, the other
// subcommands administer its database, clusters and tokens.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"krane.dev/ctrl/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
