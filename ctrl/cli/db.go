package cli

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"
)

// newDB is `ctrl admin db`: operations on ctrl's database itself.
func newDB() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "db",
		Short: "Operations on ctrl's database (after a restore or a failover)",
	}
	var reason string
	restored := &cobra.Command{
		Use:   "restored",
		Short: "Record that the database was restored from a backup or failed over: every krane host bootstraps again",
		Long: `Gives the database a new generation. Versions are only comparable within one
generation: after a restore from a backup, or a failover to a replica that had
not received the last commits, versions at or below the cursors krane hosts
hold are issued again to other changes, and a host resuming from its cursor
would skip them. With a new generation every host's next stream is refused,
and the host bootstraps that kind again: it applies what the database holds
and garbage-collects what it does not (under the usual brake).

Run it once, after the restore or the promotion and before ctrl serves again
(see docs/operating.md, "Backup, restore and failover").`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, err := openStore(cmd, true)
			if err != nil {
				return err
			}
			defer st.Close()
			old, err := st.Generation(cmd.Context())
			if err != nil {
				return err
			}
			why := strings.TrimSpace(reason)
			if why == "" {
				why = "ctrl admin db restored"
			}
			g, err := st.NewGeneration(cmd.Context(), why)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "database generation %s -> %s; krane hosts bootstrap again on their next stream\n", old, g)
			return nil
		},
	}
	restored.Flags().StringVar(&reason, "reason", "", "why (recorded with the generation), e.g. \"restored from the 02:00 backup\"")
	cmd.AddCommand(restored)
	return cmd
}
