package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"

	"krane.dev/ctrl/restateendpoint"
	"krane.dev/ctrl/serve"
	"krane.dev/ctrl/workflows"
)

func newRestate() *cobra.Command {
	cmd := &cobra.Command{Use: "restate", Short: "Restate administration: register ctrl's endpoint, its request identity key"}
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
			// Register compares handler names, kinds and ingress privacy,
			// which only the SDK's definitions carry: the constructors
			// declare them once, so they are built here with no
			// dependencies (nothing is registered or connected; the
			// handlers never run) rather than listed a second time.
			services := workflows.Services(workflows.Deps{})
			res, err := restateendpoint.Register(ctx, cfg.Restate.AdminURL, url, services, restateendpoint.RegisterOptions{Force: force})
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
	cmd.AddCommand(register, newIdentityKey())
	return cmd
}

// newIdentityKey prints the public key (restate.identity_keys) of Restate's
// request identity private key, making the key first when asked to.
func newIdentityKey() *cobra.Command {
	var create bool
	cmd := &cobra.Command{
		Use:   "identity-key PRIVATE_KEY_PEM",
		Short: "Print the public key (for restate.identity_keys) of Restate's request identity private key; --create makes the key",
		Long: "Restate signs its calls to ctrl's endpoint with an Ed25519 private key (restate-server: " +
			"worker.invoker.request-identity-private-key-pem-file); ctrl checks them with the public key in restate.identity_keys. " +
			"This prints that public key (publickeyv1_...) from the private key's PEM file, so both can be configured before either starts. " +
			"With --create it first writes a new key to the file (mode 0600), refusing to replace one that exists.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			path := args[0]
			if create {
				data, public, err := restateendpoint.NewIdentityKeyPEM()
				if err != nil {
					return err
				}
				f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
				if err != nil {
					return fmt.Errorf("create the private key file (an existing key is never replaced; omit --create to read it): %w", err)
				}
				if _, err := f.Write(data); err != nil {
					f.Close()
					return fmt.Errorf("write %s: %w", path, err)
				}
				if err := f.Close(); err != nil {
					return fmt.Errorf("write %s: %w", path, err)
				}
				fmt.Fprintln(cmd.OutOrStdout(), public)
				return nil
			}
			data, err := os.ReadFile(path)
			if err != nil {
				return fmt.Errorf("read Restate's request identity private key: %w", err)
			}
			public, err := restateendpoint.IdentityKeyOfPEM(data)
			if err != nil {
				return fmt.Errorf("%s: %w", path, err)
			}
			fmt.Fprintln(cmd.OutOrStdout(), public)
			return nil
		},
	}
	cmd.Flags().BoolVar(&create, "create", false, "write a new Ed25519 private key to PRIVATE_KEY_PEM first")
	return cmd
}
