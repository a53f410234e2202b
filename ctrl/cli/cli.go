// Package cli is the `ctrl` command line: serve, migrate, the
// administration of clusters, operator tokens and the Restate registration
// (these read the same configuration as `ctrl serve`: flags, CTRL_*
// variables, --config), and `ctrl deploy`, `ctrl sentinel` and `ctrl
// rollout`, clients of the operators' APIs (CTRL_ADDR, CTRL_TOKEN).
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"krane.dev/ctrl/auth"
	"krane.dev/ctrl/serve"
	"krane.dev/ctrl/store"
	"krane.dev/internal/version"
)

// NewRoot returns the `ctrl` command. Other parts of ctrl add their command
// groups (deploy, sentinel, rollout) with AddCommand.
func NewRoot() *cobra.Command {
	root := &cobra.Command{
		Use:           "ctrl",
		Short:         "Krane's control plane: desired state for every cluster, served to krane agents",
		Version:       version.Version,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetVersionTemplate("{{.Version}}\n")
	serve.AddConfigFlag(root.PersistentFlags())
	serve.AddFlags(root.PersistentFlags(), func(key string) bool { return key == "db.dsn" })
	root.AddCommand(newServe(), newMigrate(), newCluster(), newToken(), newDeploy(), newRestate(), newVault())
	root.AddCommand(newSentinel(), newRollout())
	return root
}

// Main runs the command line and returns the process exit code.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	root := NewRoot()
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	if err := root.ExecuteContext(ctx); err != nil {
		fmt.Fprintf(stderr, "ctrl: %v\n", err)
		var coded interface{ ExitCode() int } // an outcome with its own status (e.g. a paused rollout)
		if errors.As(err, &coded) {
			return coded.ExitCode()
		}
		return 1
	}
	return 0
}

func newServe() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Serve the ClusterService (gRPC) and /healthz, /readyz, /metrics (HTTP)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := serve.LoadConfig(cmd.Flags())
			if err != nil {
				return err
			}
			if err := cfg.Validate(); err != nil {
				return err
			}
			log := serve.NewLogger(cfg.Log, cmd.ErrOrStderr())
			srv, err := serve.Start(cmd.Context(), cfg, log, serve.Deps{})
			if err != nil {
				return err
			}
			return srv.Wait()
		},
	}
	serve.AddFlags(cmd.Flags(), func(key string) bool { return key != "db.dsn" })
	return cmd
}

// openStore opens the configured database; needCurrent refuses a database
// whose schema is behind (with the command that fixes it).
func openStore(cmd *cobra.Command, needCurrent bool) (*store.Store, error) {
	cfg, err := serve.LoadConfig(cmd.Flags())
	if err != nil {
		return nil, err
	}
	if cfg.DB.DSN == "" {
		return nil, errors.New("no database configured: pass --db-dsn, set CTRL_DB_DSN, or name a --config file with db.dsn")
	}
	ctx, cancel := context.WithTimeout(cmd.Context(), 30*time.Second)
	defer cancel()
	st, err := store.Open(ctx, cfg.DB.DSN, store.PoolOptions{MaxOpenConns: 4})
	if err != nil {
		return nil, err
	}
	if needCurrent {
		ok, err := st.MigrationsCurrent(ctx)
		if err != nil {
			st.Close()
			return nil, err
		}
		if !ok {
			st.Close()
			return nil, errors.New("the database schema is not current: run `ctrl migrate` first")
		}
	}
	return st, nil
}

func newMigrate() *cobra.Command {
	return &cobra.Command{
		Use:   "migrate",
		Short: "Apply pending schema migrations (safe to run from several places at once)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, err := openStore(cmd, false)
			if err != nil {
				return err
			}
			defer st.Close()
			applied, err := st.Migrate(cmd.Context())
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			for _, m := range applied {
				fmt.Fprintf(out, "applied %s (version %d) in %s\n", m.Source, m.Version, m.Duration.Round(time.Millisecond))
			}
			if len(applied) == 0 {
				fmt.Fprintln(out, "schema is current; nothing to apply")
			}
			return nil
		},
	}
}

func newCluster() *cobra.Command {
	cmd := &cobra.Command{Use: "cluster", Short: "Register clusters, revoke their tokens, list them"}

	var region, cluster string
	register := &cobra.Command{
		Use:   "register --region R --cluster C",
		Short: "Register a cluster (or add a token to it) and print its token once",
		Long: "Register a cluster in a region and print a new cluster token on stdout. " +
			"ctrl stores only the token's hash: copy it into the cluster's krane configuration now, it cannot be shown again. " +
			"Registering an existing cluster again adds a token (for rotation); revoke the old one afterwards.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, err := openStore(cmd, true)
			if err != nil {
				return err
			}
			defer st.Close()
			token, err := auth.RegisterCluster(cmd.Context(), st, region, cluster)
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), token)
			fmt.Fprintf(cmd.ErrOrStderr(), "Registered cluster %s in region %s. Its token went to stdout and is shown only once: ctrl keeps just its hash.\n", cluster, region)
			return nil
		},
	}
	register.Flags().StringVar(&region, "region", "", "region the cluster serves (required)")
	register.Flags().StringVar(&cluster, "cluster", "", "cluster id, unique across regions (required)")
	_ = register.MarkFlagRequired("region")
	_ = register.MarkFlagRequired("cluster")

	var revokeID string
	revoke := &cobra.Command{
		Use:   "revoke --cluster C",
		Short: "Revoke every token of a cluster; its open streams end within seconds",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, err := openStore(cmd, true)
			if err != nil {
				return err
			}
			defer st.Close()
			n, err := st.RevokeClusterTokens(cmd.Context(), revokeID)
			if errors.Is(err, store.ErrNotFound) {
				return fmt.Errorf("no cluster %q is registered (see `ctrl cluster list`)", revokeID)
			}
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "revoked %d token(s) of cluster %s\n", n, revokeID)
			return nil
		},
	}
	revoke.Flags().StringVar(&revokeID, "cluster", "", "cluster id (required)")
	_ = revoke.MarkFlagRequired("cluster")

	list := &cobra.Command{
		Use:   "list",
		Short: "List registered clusters, their valid tokens and last heartbeat",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, err := openStore(cmd, true)
			if err != nil {
				return err
			}
			defer st.Close()
			clusters, err := st.ListClusters(cmd.Context())
			if err != nil {
				return err
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "CLUSTER\tREGION\tTOKENS\tLAST HEARTBEAT\tAGENT")
			for _, c := range clusters {
				hb := "never"
				if !c.LastHeartbeatAt.IsZero() {
					hb = c.LastHeartbeatAt.UTC().Format(time.RFC3339)
				}
				fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%s\n", c.ID, c.Region, c.ActiveTokens, hb, c.AgentVersion)
			}
			return w.Flush()
		},
	}
	cmd.AddCommand(register, revoke, list)
	return cmd
}

func newToken() *cobra.Command {
	cmd := &cobra.Command{Use: "token", Short: "Operator API tokens"}
	var name string
	create := &cobra.Command{
		Use:   "create-operator --name N",
		Short: "Create an operator token and print it once",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, err := openStore(cmd, true)
			if err != nil {
				return err
			}
			defer st.Close()
			token, err := auth.CreateOperatorToken(cmd.Context(), st, name)
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), token)
			fmt.Fprintf(cmd.ErrOrStderr(), "Created operator token %q. It went to stdout and is shown only once: ctrl keeps just its hash.\n", name)
			return nil
		},
	}
	create.Flags().StringVar(&name, "name", "", "whose token this is, e.g. a person or a pipeline (required)")
	_ = create.MarkFlagRequired("name")
	cmd.AddCommand(create)
	return cmd
}
