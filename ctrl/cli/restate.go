package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"krane.dev/ctrl/restateendpoint"
	"krane.dev/ctrl/serve"
	"krane.dev/ctrl/workflows"
	"krane.dev/shared/version"
)

func newRestate() *cobra.Command {
	cmd := &cobra.Command{Use: "restate", Short: "Restate administration: register ctrl's endpoint, see and drain the deployments of ctrl's lines, its request identity key"}
	var force bool
	register := &cobra.Command{
		Use:   "register",
		Short: "Register ctrl's Restate endpoint (what `ctrl serve` does on start when restate.register_on_start is true)",
		Long: "Registers this ctrl line's endpoint, restate.endpoint.url (default: derived from restate.endpoint.listen) and the path of the line " +
			"(/v0.2), with the Restate admin API at restate.admin_url. Each ctrl line is a Restate deployment of its own: registering one leaves " +
			"the others' deployments alone, so what they started finishes on their code (docs/compatibility.md). Idempotent: nothing is sent " +
			"when Restate already routes every ctrl service to this URL with the same handlers, or when a newer line takes them; a known URL " +
			"that is stale (other handlers, or an older line took a service over) is registered again with force. --force forces anyway, " +
			"also over a newer line (a rollback); it re-discovers in place, and invocations already running on this URL continue on the new code.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := serve.LoadConfig(cmd.Flags())
			if err != nil {
				return err
			}
			if cfg.Restate.AdminURL == "" {
				return errors.New("no Restate admin API configured: pass --restate-admin-url or set CTRL_RESTATE_ADMIN_URL")
			}
			url, err := serve.EndpointURL(cfg, cfg.Restate.Endpoint.Listen, version.Version)
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
			client, err := serve.RestateAdminClient(cfg.Restate)
			if err != nil {
				return err
			}
			res, err := restateendpoint.Register(ctx, cfg.Restate.AdminURL, url, services, restateendpoint.RegisterOptions{Force: force, HTTPClient: client})
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s %s (Restate deployment %s)", res.Action, url, res.DeploymentID)
			if res.Reason != "" {
				fmt.Fprintf(cmd.OutOrStdout(), ": %s", res.Reason)
			}
			fmt.Fprintln(cmd.OutOrStdout())
			if res.Newer != "" {
				fmt.Fprintf(cmd.OutOrStdout(), "a newer ctrl line's deployment %s takes new invocations; this line's finishes what is pinned to it (`ctrl restate drain`)\n", res.Newer)
			}
			return nil
		},
	}
	register.Flags().BoolVar(&force, "force", false, "register with force even when nothing looks different, or over a newer line (a rollback)")
	restateFlags(register)
	cmd.AddCommand(register, newRestateDeployments(), newRestateDrain(), newIdentityKey())
	return cmd
}

// restateAdmin is the admin URL and this ctrl's endpoint URL, from the
// settings `ctrl serve` reads.
func restateAdmin(cmd *cobra.Command) (admin, url string, err error) {
	cfg, err := serve.LoadConfig(cmd.Flags())
	if err != nil {
		return "", "", err
	}
	if cfg.Restate.AdminURL == "" {
		return "", "", errors.New("no Restate admin API configured: pass --restate-admin-url or set CTRL_RESTATE_ADMIN_URL")
	}
	url, err = serve.EndpointURL(cfg, cfg.Restate.Endpoint.Listen, version.Version)
	return cfg.Restate.AdminURL, url, err
}

func restateFlags(cmd *cobra.Command) {
	serve.AddFlags(cmd.Flags(), func(key string) bool {
		return key == "restate.admin_url" || key == "restate.ca_file" || key == "restate.endpoint.listen" || key == "restate.endpoint.url"
	})
}

func newRestateDeployments() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "deployments",
		Short: "List the Restate deployments of ctrl's lines: which takes new invocations, and what is still pinned to each",
		Long: "Each ctrl line (v0.2, v0.3, ...) is a Restate deployment of its own, and every invocation finishes on the deployment it " +
			"started on. This lists them: the line, which services' new invocations go there, and the invocations pinned to each that " +
			"have not completed. A deployment that takes nothing new and has nothing pinned is drained: `ctrl restate drain` removes it, " +
			"and its replicas may stop.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			admin, url, err := restateAdmin(cmd)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 30*time.Second)
			defer cancel()
			deps, err := restateendpoint.Deployments(ctx, admin, workflows.Services(workflows.Deps{}), nil)
			if err != nil {
				return err
			}
			printDeployments(cmd.OutOrStdout(), deps, url)
			return nil
		},
	}
	restateFlags(cmd)
	return cmd
}

func printDeployments(out io.Writer, deps []restateendpoint.Deployment, ours string) {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "DEPLOYMENT\tLINE\tURL\tNEW INVOCATIONS\tPINNED\tSTATE")
	for _, d := range deps {
		line := or(d.Line, "(root: v0.1 or a build with no version)")
		takes := "-"
		if len(d.Latest) > 0 {
			takes = strings.Join(d.Latest, ", ")
		}
		state := "running"
		switch {
		case d.Drained():
			state = "drained: remove it (`ctrl restate drain`), then stop its replicas"
		case len(d.Latest) == 0:
			state = "draining: keep its replicas"
		}
		if strings.TrimRight(d.URI, "/") == strings.TrimRight(ours, "/") {
			state += " (this ctrl's)"
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%s\n", d.ID, line, d.URI, takes, d.Pinned, state)
	}
	w.Flush()
	for _, d := range deps {
		if d.Pinned > 0 && len(d.Latest) == 0 {
			fmt.Fprintf(out, "\n%s still runs %d invocations, e.g.:\n  %s\n", d.ID, d.Pinned, strings.Join(d.Running, "\n  "))
		}
	}
}

func newRestateDrain() *cobra.Command {
	var wait time.Duration
	cmd := &cobra.Command{
		Use:   "drain",
		Short: "Remove the deployments of older ctrl lines once nothing runs on them (--wait: until then), so their replicas may stop",
		Long: "After a roll to a new ctrl line, the older line's Restate deployment takes no new invocations but finishes the ones " +
			"pinned to it, on its replicas. drain removes every deployment of ctrl's services, other than this line's, that is drained " +
			"(nothing new goes there, nothing pinned runs), and lists those still running. With --wait it checks every 5s until none " +
			"remains or the wait ends; a paused or long-waiting invocation (a rollout waiting to be resumed) keeps its deployment: " +
			"finish or cancel it. Exit status 0: no older deployment is left; its replicas may stop.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			admin, url, err := restateAdmin(cmd)
			if err != nil {
				return err
			}
			services := workflows.Services(workflows.Deps{})
			out := cmd.OutOrStdout()
			deadline := time.Now().Add(wait)
			for {
				ctx, cancel := context.WithTimeout(cmd.Context(), 30*time.Second)
				removed, remaining, err := restateendpoint.RemoveDrained(ctx, admin, url, services, nil)
				cancel()
				if err != nil {
					return err
				}
				for _, d := range removed {
					fmt.Fprintf(out, "removed drained deployment %s (%s, line %s): its replicas may stop\n", d.ID, d.URI, or(d.Line, "root"))
				}
				var older []restateendpoint.Deployment
				for _, d := range remaining {
					if strings.TrimRight(d.URI, "/") != strings.TrimRight(url, "/") {
						older = append(older, d)
					}
				}
				if len(older) == 0 {
					fmt.Fprintf(out, "no other ctrl line's deployment is left: only %s serves ctrl's services\n", url)
					return nil
				}
				if !time.Now().Before(deadline) {
					printDeployments(out, older, url)
					return fmt.Errorf("%d deployments of other ctrl lines still run invocations or take new ones: keep their replicas; run drain again (--wait 10m waits)", len(older))
				}
				pinned := 0
				for _, d := range older {
					pinned += d.Pinned
				}
				fmt.Fprintf(out, "waiting: %d deployments of other lines, %d invocations pinned to them\n", len(older), pinned)
				select {
				case <-cmd.Context().Done():
					return cmd.Context().Err()
				case <-time.After(5 * time.Second):
				}
			}
		},
	}
	cmd.Flags().DurationVar(&wait, "wait", 0, "check again every 5s until every other line's deployment is drained and removed, or this long passed")
	restateFlags(cmd)
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
