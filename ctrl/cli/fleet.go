package cli

import (
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	ctrlv1 "krane.dev/proto/krane/ctrl/v1"
)

func newFleet() *cobra.Command {
	var api apiFlags
	cmd := &cobra.Command{
		Use:   "fleet",
		Short: "Show the clusters ctrl serves: heartbeats, and per kind how far each cluster is behind",
		Long: "Talks to ctrl's FleetService with an operator token (CTRL_TOKEN) at CTRL_ADDR (the web console's Fleet page makes the same call).\n" +
			"Text output is for people; -o json prints protobuf JSON for scripts.",
	}
	api.add(cmd)
	var region string
	list := &cobra.Command{
		Use:   "list [--region R]",
		Short: "List clusters by region: last heartbeat, krane version, per kind cursor, newest version and apply errors",
		Long: "Cursors are what each cluster reported in its last heartbeat (every 30s): a cluster shown behind may have caught up since. " +
			"APPLY ERRORS counts the objects the cluster reported it could not apply.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			asJSON, err := api.json()
			if err != nil {
				return err
			}
			conn, err := api.dial()
			if err != nil {
				return err
			}
			defer conn.Close()
			resp, err := ctrlv1.NewFleetServiceClient(conn).ListClusters(cmd.Context(), &ctrlv1.ListClustersRequest{Region: region})
			if err != nil {
				return apiError("list clusters", err)
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), resp)
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "REGION\tCLUSTER\tLAST HEARTBEAT\tKRANE\tKIND\tCURSOR\tNEWEST\tLAG\tAPPLY ERRORS")
			for _, c := range resp.GetClusters() {
				hb := "never"
				if t := c.GetLastHeartbeatAt(); t != nil {
					hb = timestamp(t.AsTime()) + " (" + time.Since(t.AsTime()).Round(time.Second).String() + " ago)"
				}
				agent := c.GetAgentVersion()
				if agent == "" {
					agent = "-"
				}
				if len(c.GetKinds()) == 0 {
					fmt.Fprintf(w, "%s\t%s\t%s\t%s\t-\t-\t-\t-\t-\n", c.GetRegion(), c.GetId(), hb, agent)
				}
				for _, k := range c.GetKinds() {
					cursor, lag := "-", "caught up"
					if k.Cursor != nil {
						cursor = fmt.Sprint(k.GetCursor())
					}
					if k.GetBehind() {
						lag = "behind"
					}
					fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%d\n", c.GetRegion(), c.GetId(), hb, agent, k.GetKind(), cursor, k.GetHeadVersion(), lag, k.GetApplyErrors())
				}
			}
			if err := w.Flush(); err != nil {
				return err
			}
			if len(resp.GetClusters()) == 0 {
				fmt.Fprintln(cmd.ErrOrStderr(), "No cluster is registered"+regionSuffix(region)+": register one with `ctrl cluster register --region R --cluster C`.")
			}
			return nil
		},
	}
	list.Flags().StringVar(&region, "region", "", "only this region's clusters")
	cmd.AddCommand(list)
	return cmd
}

func regionSuffix(region string) string {
	if region == "" {
		return ""
	}
	return " in region " + region
}
