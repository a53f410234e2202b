package cli

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"krane.dev/ctrl/fleetapi"
	ctrlv1 "krane.dev/proto/krane/ctrl/v1"
)

// fleetListLong explains what `ctrl fleet list` and `ctrl admin cluster list`
// print; the two print the same (fleetapi.Load is their one source).
const fleetListLong = "Per cluster: region, valid tokens, last heartbeat, krane version and the controllers its host runs (plugin versions; " +
	"\"not reported\" for a host older than ctrl). Per cluster and kind: the cursor it last reported, ctrl's newest version, " +
	"LAG = newest minus cursor (versions are global, so a distance, not a count of changes), LAG AGE = how long the oldest change above " +
	"the cursor had been committed when the cluster sent its last heartbeat (0s: it had applied everything committed before), " +
	"PARKED = objects its host holds parked, APPLY ERRORS = objects it reported it could not apply. \"-\" means not reported. " +
	"Cursors and parked counts are as of the last heartbeat (every 30s). -o json prints the FleetService's ListClustersResponse as protobuf JSON, for scripts."

func newFleet() *cobra.Command {
	var api apiFlags
	cmd := &cobra.Command{
		Use:   "fleet",
		Short: "Show the clusters ctrl serves (the same view as `ctrl admin cluster list`, through the API)",
		Long: "Talks to ctrl's FleetService with an operator token (CTRL_TOKEN) at CTRL_ADDR (the web console's Fleet page makes the same call). " +
			"`ctrl admin cluster list` prints the same, reading ctrl's database instead.\n" +
			"Text output is for people; -o json prints protobuf JSON for scripts.",
	}
	api.add(cmd)
	var region string
	list := &cobra.Command{
		Use:   "list [--region R]",
		Short: "List clusters by region: heartbeat, krane and controller versions, per kind lag (versions and seconds), parked objects, apply errors",
		Long:  fleetListLong,
		Args:  cobra.NoArgs,
		RunE: clientRun(&api, ctrlv1.NewFleetServiceClient, nil, func(cmd *cobra.Command, _ []string, format output, fleet ctrlv1.FleetServiceClient) error {
			resp, err := fleetapi.ListAll(cmd.Context(), fleet, region)
			if err != nil {
				return apiError("list clusters", err)
			}
			return printFleet(cmd, resp, region, format)
		}),
	}
	list.Flags().StringVar(&region, "region", "", "only this region's clusters")
	cmd.AddCommand(list)
	return cmd
}

// printFleet prints the fleet view as `ctrl fleet list` and `ctrl cluster
// list` do.
func printFleet(cmd *cobra.Command, resp *ctrlv1.ListClustersResponse, region string, format output) error {
	if format.structured() {
		return printAs(cmd.OutOrStdout(), format, resp)
	}
	if len(resp.GetClusters()) == 0 {
		fmt.Fprintln(cmd.ErrOrStderr(), "No cluster is registered"+regionSuffix(region)+": register one with `ctrl admin cluster register --region R --cluster C`.")
		return nil
	}
	return writeFleet(cmd.OutOrStdout(), resp, time.Now())
}

// writeFleet writes the two tables: clusters, then their kinds; then the
// errors of controllers that do not run.
func writeFleet(out io.Writer, resp *ctrlv1.ListClustersResponse, now time.Time) error {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "CLUSTER\tREGION\tTOKENS\tLAST HEARTBEAT\tKRANE\tCONTROLLERS")
	var down []string
	for _, c := range resp.GetClusters() {
		hb := "never"
		if t := c.GetLastHeartbeatAt(); t != nil {
			hb = now.Sub(t.AsTime()).Round(time.Second).String() + " ago"
		}
		fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%s\t%s\n", c.GetId(), c.GetRegion(), c.GetActiveTokens(), hb, agent(c), controllers(c))
		if m := c.GetAgentSkewMessage(); m != "" {
			down = append(down, c.GetId()+": "+m)
		}
		for _, ctl := range c.GetControllers() {
			if !ctl.GetRunning() {
				down = append(down, fmt.Sprintf("%s: controller %s is not running: %s", c.GetId(), ctl.GetName(), or(ctl.GetLastError(), "no error reported")))
			}
		}
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "CLUSTER\tKIND\tCURSOR\tNEWEST\tLAG\tLAG AGE\tPARKED\tAPPLY ERRORS")
	for _, c := range resp.GetClusters() {
		for _, k := range c.GetKinds() {
			cursor, lag, age, parked := "-", "-", "-", "-"
			if k.Cursor != nil {
				cursor = fmt.Sprint(k.GetCursor())
			}
			if k.LagVersions != nil {
				lag = fmt.Sprint(k.GetLagVersions())
			}
			if k.LagSeconds != nil {
				age = (time.Duration(k.GetLagSeconds() * float64(time.Second))).Round(100 * time.Millisecond).String()
			}
			if k.Parked != nil {
				parked = fmt.Sprint(k.GetParked())
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%s\t%s\t%s\t%d\n", c.GetId(), k.GetKind(), cursor, k.GetHeadVersion(), lag, age, parked, k.GetApplyErrors())
		}
	}
	if err := w.Flush(); err != nil {
		return err
	}
	if len(down) > 0 {
		fmt.Fprintln(out)
		fmt.Fprintln(out, strings.Join(down, "\n"))
	}
	return nil
}

// agent is the host's krane version, marked when it stands outside ctrl's
// skew window (docs/compatibility.md).
func agent(c *ctrlv1.ClusterInfo) string {
	v := or(c.GetAgentVersion(), "-")
	switch c.GetAgentSkew() {
	case "too-old":
		return v + " (too old: refused)"
	case "newer-than-ctrl":
		return v + " (newer than ctrl)"
	}
	return v
}

// controllers is "name version, ..." with "(not running)" marks, or "not
// reported".
func controllers(c *ctrlv1.ClusterInfo) string {
	if !c.GetControllersReported() {
		return "not reported"
	}
	if len(c.GetControllers()) == 0 {
		return "none"
	}
	parts := make([]string, 0, len(c.GetControllers()))
	for _, ctl := range c.GetControllers() {
		p := ctl.GetName()
		if v := ctl.GetPluginVersion(); v != "" {
			p += " " + v
		}
		if !ctl.GetRunning() {
			p += " (not running)"
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, ", ")
}

func regionSuffix(region string) string {
	if region == "" {
		return ""
	}
	return " in region " + region
}
