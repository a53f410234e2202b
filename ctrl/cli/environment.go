package cli

import (
	"context"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	ctrlv1 "krane.dev/proto/krane/ctrl/v1"
)

func newEnvironment() *cobra.Command {
	var api apiFlags
	cmd := &cobra.Command{
		Use:   "environment",
		Short: "An environment's hosts and live deployment (what its sentinels route)",
	}
	api.add(cmd)
	var hosts []string
	var clear bool
	hostsCmd := &cobra.Command{
		Use:   "hosts ENVIRONMENT [--host H]... [--clear]",
		Short: "Show an environment's hosts, or set them (--host, repeatable; --clear: none)",
		Long: "The hosts are the DNS names the environment's sentinels serve: a request for one of them reaches an instance of " +
			"the environment's live deployment in the sentinel's region; any other host is refused. A host belongs to one " +
			"environment. Setting them replaces the list; the sentinels receive it within a second of their cluster's stream.",
		Args: cobra.ExactArgs(1),
		RunE: clientRun(&api, ctrlv1.NewDeploymentServiceClient, nil, func(cmd *cobra.Command, args []string, format output, client ctrlv1.DeploymentServiceClient) error {
			var info *ctrlv1.EnvironmentInfo
			var err error
			switch {
			case len(hosts) > 0 && clear:
				return fmt.Errorf("--host and --clear exclude each other")
			case len(hosts) > 0 || clear:
				info, err = withRetry(cmd.Context(), func(ctx context.Context) (*ctrlv1.EnvironmentInfo, error) {
					return client.SetEnvironmentHosts(ctx, &ctrlv1.SetEnvironmentHostsRequest{EnvironmentId: args[0], Hosts: hosts})
				})
			default:
				info, err = client.GetEnvironment(cmd.Context(), &ctrlv1.GetEnvironmentRequest{EnvironmentId: args[0]})
			}
			if err != nil {
				return apiError("environment "+args[0], err)
			}
			if format.structured() {
				return printAs(cmd.OutOrStdout(), format, info)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "environment %s\nlive deployment: %s\nhosts: %s\n", info.GetId(),
				or(info.GetLiveDeploymentId(), "none"), or(strings.Join(info.GetHosts(), ", "), "none"))
			return nil
		}),
	}
	hostsCmd.Flags().StringArrayVar(&hosts, "host", nil, "a host the environment serves, e.g. app.example.com (repeatable; replaces the list)")
	hostsCmd.Flags().BoolVar(&clear, "clear", false, "serve no host")
	cmd.AddCommand(hostsCmd)
	return cmd
}
