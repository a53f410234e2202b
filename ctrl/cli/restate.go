package cli

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"krane.dev/ctrl/serve"
	"krane.dev/ctrl/workflows"
)

func newRestate() *cobra.Command {
	cmd := &cobra.Command{Use: "restate", Short: "Restate administration: register ctrl's endpoint"}
	var force bool
	register := &cobra.Command{
		Use:   "register",
		Short: "Register ctrl's Restate endpoint (what `ctrl serve` does on start when restate.register_on_start is true)",
		Long: "Registers the endpoint at restate.endpoint.url (default: derived from restate.endpoint.listen) with the Restate admin API " +
			"at restate.admin_url. Idempotent: nothing is sent when Restate already routes every ctrl service to that URL with the same handlers; " +
			"a known URL that is stale (other handlers, or another deployment took a service over) is registered again with force. " +
			"--force forces anyway; it re-discovers in place, and invocations already running continue on the new code.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := serve.LoadConfig(cmd.Flags())
			if err != nil {
				return err
			}
			if cfg.Restate.AdminURL == "" {
				return errors.New("no Restate admin API configured: pass --restate-admin-url or set CTRL_RESTATE_ADMIN_URL")
			}
			url, err := serve.EndpointURL(cfg, cfg.Restate.Endpoint.Listen)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 30*time.Second)
			defer cancel()
			services := workflows.Services(workflows.Deps{}) // only their names and handlers are used
			res, err := workflows.Register(ctx, cfg.Restate.AdminURL, url, services, workflows.RegisterOptions{Force: force})
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s %s (Restate deployment %s)", res.Action, url, res.DeploymentID)
			if res.Reason != "" {
				fmt.Fprintf(cmd.OutOrStdout(), ": %s", res.Reason)
			}
			fmt.Fprintln(cmd.OutOrStdout())
			return nil
		},
	}
	register.Flags().BoolVar(&force, "force", false, "register with force even when nothing looks different")
	serve.AddFlags(register.Flags(), func(key string) bool {
		return key == "restate.admin_url" || key == "restate.endpoint.listen" || key == "restate.endpoint.url"
	})
	cmd.AddCommand(register)
	return cmd
}
