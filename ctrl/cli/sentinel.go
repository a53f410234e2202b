package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	ctrlv1 "krane.dev/proto/krane/ctrl/v1"
)

// sentinelCmd holds what every `ctrl sentinel` subcommand shares.
type sentinelCmd struct {
	api  apiFlags
	poll time.Duration
}

func newSentinel() *cobra.Command {
	s := &sentinelCmd{}
	cmd := &cobra.Command{
		Use:   "sentinel",
		Short: "Deploy, stop, show and list sentinels (one environment's routing proxy in one region)",
		Long: "Talks to ctrl's SentinelService with an operator token (CTRL_TOKEN) at CTRL_ADDR.\n" +
			"Text output is for people; -o json prints protobuf JSON for scripts. " +
			"`deploy --wait` follows the sentinel until its cluster runs the new configuration and exits 0 only when it is ready.",
	}
	s.api.add(cmd)
	cmd.PersistentFlags().DurationVar(&s.poll, "poll-interval", 500*time.Millisecond, "how often --wait asks for progress")
	_ = cmd.PersistentFlags().MarkHidden("poll-interval")
	cmd.AddCommand(s.deploy(), s.stop(), s.get(), s.list())
	return cmd
}

func (s *sentinelCmd) deploy() *cobra.Command {
	var (
		image                string
		replicas             int32
		cpu, memory          int64
		timeout, waitTimeout time.Duration
		wait                 bool
		credFiles, credKeys  []string
		creds                map[string]string // read before ctrl is dialled
	)
	cmd := &cobra.Command{
		Use:   "deploy SENTINEL_ID [--image I] [--replicas N] [--cpu M] [--memory M] [--credentials-file F] [--credential KEY] [--wait]",
		Short: "Change a sentinel's image, size or credentials (unset flags keep the current value); with --wait, follow it until it runs healthy",
		Long: "Writes the sentinel's new configuration (a new version its cluster applies) and starts SentinelService.Deploy, " +
			"which waits until the cluster reports the sentinel healthy on the image at that version, a permanent apply error, or the timeout. " +
			"A sentinel that fails is not rolled back. Exit status: 0 ready (or started, without --wait), 1 failed or error.\n\n" +
			"Credentials (database, ClickHouse, Redis, ...) are sealed by ctrl for the sentinel and reach its container as the Secret " +
			"<k8s_name>-credentials (docs/secrets.md). --credentials-file reads KEY=VALUE lines (# comments, optional export and quotes, " +
			"as --secret-env-file of `deploy create`) or, when the file starts with '{', a JSON object of strings. --credential KEY takes the " +
			"value of the environment variable KEY; --credential KEY=- reads it from stdin (no prompt, one trailing newline dropped). " +
			"Values are never taken from the command line. Given credentials replace the sentinel's as a whole; without any, it keeps the ones it has.",
		Args: cobra.ExactArgs(1),
		// The credentials are read and checked before ctrl is dialled: a
		// value on the command line never reaches the network.
		RunE: clientRun(&s.api, ctrlv1.NewSentinelServiceClient, func(cmd *cobra.Command, _ []string) (err error) {
			creds, err = credentialsFrom(credFiles, credKeys, os.LookupEnv, cmd.InOrStdin())
			return err
		}, func(cmd *cobra.Command, args []string, format output, api ctrlv1.SentinelServiceClient) error {
			req := &ctrlv1.DeploySentinelRequest{SentinelId: args[0], Image: image, Replicas: replicas, CpuMillicores: cpu, MemoryMib: memory,
				TimeoutSeconds: int32(timeout / time.Second), Credentials: creds}
			if !wait {
				resp, err := api.DeploySentinel(cmd.Context(), req)
				if err != nil {
					return apiError("deploy sentinel "+args[0], err)
				}
				if format.structured() {
					return printAs(cmd.OutOrStdout(), format, resp)
				}
				si := resp.GetSentinel()
				fmt.Fprintf(cmd.OutOrStdout(), "sentinel %s: %s at version %d (%s)\n", si.GetId(), si.GetDeployStatus(), si.GetVersion(), si.GetImage())
				fmt.Fprintf(cmd.ErrOrStderr(), "Follow it with `ctrl sentinel get %s`.\n", si.GetId())
				return nil
			}
			return s.follow(cmd, api, req, waitTimeout, format)
		}),
	}
	f := cmd.Flags()
	f.StringVar(&image, "image", "", "new image (default: keep)")
	f.Int32Var(&replicas, "replicas", 0, "new replica count (0: keep)")
	f.Int64Var(&cpu, "cpu", 0, "new CPU in millicores (0: keep)")
	f.Int64Var(&memory, "memory", 0, "new memory in MiB (0: keep)")
	f.DurationVar(&timeout, "timeout", 0, "how long the deploy waits for the cluster (0: ctrl's sentinel.deploy_timeout)")
	f.BoolVar(&wait, "wait", false, "follow the deploy and exit 0 only when the sentinel is ready")
	f.StringArrayVar(&credFiles, "credentials-file", nil, "file of the sentinel's credentials: KEY=VALUE lines, or a JSON object of strings (repeatable; a later file wins)")
	f.StringArrayVar(&credKeys, "credential", nil, "a credential whose value is the environment variable KEY, or with KEY=- read from stdin (repeatable; wins over the files)")
	f.DurationVar(&waitTimeout, "wait-timeout", 30*time.Minute, "give up following after this long (the deploy goes on)")
	return cmd
}

// follow runs the deploy with wait, printing a progress line whenever the
// sentinel's reported state changes (stdout in text mode, stderr with -o
// json, whose stdout is only the final document).
func (s *sentinelCmd) follow(cmd *cobra.Command, api ctrlv1.SentinelServiceClient, req *ctrlv1.DeploySentinelRequest, waitTimeout time.Duration, format output) error {
	progress := cmd.OutOrStdout()
	if format.structured() {
		progress = cmd.ErrOrStderr()
	}
	ctx, cancel := context.WithTimeout(cmd.Context(), waitTimeout)
	defer cancel()
	req.Wait = true
	type result struct {
		resp *ctrlv1.DeploySentinelResponse
		err  error
	}
	done := make(chan result, 1)
	go func() {
		resp, err := api.DeploySentinel(ctx, req)
		done <- result{resp, err}
	}()
	begin, last := time.Now(), ""
	for {
		if info, err := api.GetSentinel(ctx, &ctrlv1.GetSentinelRequest{SentinelId: req.GetSentinelId()}); err == nil {
			if line := sentinelLine(info); line != last {
				fmt.Fprintf(progress, "[%6.1fs] %s\n", time.Since(begin).Seconds(), line)
				last = line
			}
		}
		select {
		case r := <-done:
			if r.err != nil {
				if ctx.Err() != nil {
					return fmt.Errorf("stopped following sentinel %s after %s; the deploy goes on (see `ctrl sentinel get %s`)",
						req.GetSentinelId(), time.Since(begin).Round(time.Second), req.GetSentinelId())
				}
				return apiError("deploy sentinel "+req.GetSentinelId(), r.err)
			}
			si := r.resp.GetSentinel()
			if format.structured() {
				if err := printAs(cmd.OutOrStdout(), format, r.resp); err != nil {
					return err
				}
			} else {
				fmt.Fprintf(cmd.OutOrStdout(), "sentinel %s is %s after %s: %s, %d/%d available, version %d\n", si.GetId(), r.resp.GetResult(),
					time.Since(begin).Round(100*time.Millisecond), si.GetImage(), si.GetAvailableReplicas(), si.GetReplicas(), si.GetVersion())
			}
			if r.resp.GetResult() != "ready" {
				return fmt.Errorf("sentinel %s failed: %s", si.GetId(), r.resp.GetMessage())
			}
			return nil
		case <-time.After(s.poll):
		}
	}
}

// sentinelLine: "progressing  unhealthy (progressing: 1/2 updated)  version 7, cluster at 6".
func sentinelLine(s *ctrlv1.SentinelInfo) string {
	line := fmt.Sprintf("%-11s  %s", s.GetDeployStatus(), s.GetHealth().Word())
	if s.GetHealthReason() != "" {
		line += " (" + s.GetHealthReason() + ")"
	}
	if s.GetRunningImage() != "" && s.GetRunningImage() != s.GetImage() {
		line += "  running " + s.GetRunningImage()
	}
	return line + fmt.Sprintf("  version %d, cluster at %d", s.GetVersion(), s.GetReportObservedVersion())
}

func (s *sentinelCmd) stop() *cobra.Command {
	return &cobra.Command{
		Use:   "stop SENTINEL_ID",
		Short: "Stop a sentinel: its cluster deletes its objects; the row stays (deploy starts it again)",
		Long: "Sets the sentinel's desired state to stopped with a new version. Its cluster's sentinel plugin deletes the " +
			"sentinel's objects; ctrl keeps the row, so `ctrl sentinel deploy SENTINEL_ID` (or the next deploy of its " +
			"environment) starts it again with the same configuration. A deploy of the sentinel in progress ends failed. " +
			"Stopping a stopped sentinel changes nothing.",
		Args: cobra.ExactArgs(1),
		RunE: clientRun(&s.api, ctrlv1.NewSentinelServiceClient, nil, func(cmd *cobra.Command, args []string, format output, api ctrlv1.SentinelServiceClient) error {
			resp, err := api.StopSentinel(cmd.Context(), &ctrlv1.StopSentinelRequest{SentinelId: args[0]})
			if err != nil {
				return apiError("stop sentinel "+args[0], err)
			}
			if format.structured() {
				return printAs(cmd.OutOrStdout(), format, resp)
			}
			si := resp.GetSentinel()
			if resp.GetStopped() {
				fmt.Fprintf(cmd.OutOrStdout(), "sentinel %s stopped at version %d; its cluster in %s deletes its objects\n", si.GetId(), si.GetVersion(), si.GetRegion())
			} else {
				fmt.Fprintf(cmd.OutOrStdout(), "sentinel %s was already stopped (version %d)\n", si.GetId(), si.GetVersion())
			}
			return nil
		}),
	}
}

func (s *sentinelCmd) get() *cobra.Command {
	return &cobra.Command{
		Use:   "get SENTINEL_ID",
		Short: "Show a sentinel: configuration, what its cluster reports, its last deploy",
		Args:  cobra.ExactArgs(1),
		RunE: clientRun(&s.api, ctrlv1.NewSentinelServiceClient, nil, func(cmd *cobra.Command, args []string, format output, api ctrlv1.SentinelServiceClient) error {
			info, err := api.GetSentinel(cmd.Context(), &ctrlv1.GetSentinelRequest{SentinelId: args[0]})
			if err != nil {
				return apiError("read sentinel "+args[0], err)
			}
			if format.structured() {
				return printAs(cmd.OutOrStdout(), format, info)
			}
			printSentinel(cmd.OutOrStdout(), info)
			return nil
		}),
	}
}

func printSentinel(out io.Writer, s *ctrlv1.SentinelInfo) {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintf(w, "Sentinel:\t%s\n", s.GetId())
	fmt.Fprintf(w, "Region:\t%s\n", s.GetRegion())
	fmt.Fprintf(w, "Environment:\t%s (workspace %s, project %s, app %s)\n", s.GetEnvironmentId(), s.GetWorkspaceId(), s.GetProjectId(), s.GetAppId())
	fmt.Fprintf(w, "Image:\t%s\n", s.GetImage())
	fmt.Fprintf(w, "Size:\t%d replicas, %dm CPU, %d MiB\n", s.GetReplicas(), s.GetCpuMillicores(), s.GetMemoryMib())
	fmt.Fprintf(w, "Credentials:\t%s\n", or(strings.Join(s.GetCredentialNames(), ", "), "-"))
	fmt.Fprintf(w, "Desired state:\t%s (version %d)\n", s.GetDesiredState(), s.GetVersion())
	fmt.Fprintf(w, "Deploy:\t%s\n", s.GetDeployStatus())
	if s.GetDeployMessage() != "" {
		fmt.Fprintf(w, "Deploy error:\t%s\n", s.GetDeployMessage())
	}
	health := s.GetHealth().Word()
	if s.GetHealthReason() != "" {
		health += ": " + s.GetHealthReason()
	}
	fmt.Fprintf(w, "Health:\t%s\n", health)
	fmt.Fprintf(w, "Running image:\t%s\n", or(s.GetRunningImage(), "-"))
	fmt.Fprintf(w, "Replicas:\t%d available, %d updated, %d ready\n", s.GetAvailableReplicas(), s.GetUpdatedReplicas(), s.GetReadyReplicas())
	fmt.Fprintf(w, "Reported at version:\t%d\n", s.GetReportObservedVersion())
	w.Flush()
}

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func (s *sentinelCmd) list() *cobra.Command {
	var region, environment string
	var limit int
	cmd := &cobra.Command{
		Use:   "list [--region R] [--environment E]",
		Short: "List sentinels in id order",
		Args:  cobra.NoArgs,
		RunE: clientRun(&s.api, ctrlv1.NewSentinelServiceClient, nil, func(cmd *cobra.Command, _ []string, format output, api ctrlv1.SentinelServiceClient) error {
			sentinels, err := allPages(500, int32(limit), func(size int32, token string) ([]*ctrlv1.SentinelInfo, string, error) {
				page, err := api.ListSentinels(cmd.Context(), &ctrlv1.ListSentinelsRequest{Region: region, EnvironmentId: environment, PageSize: size, PageToken: token})
				return page.GetSentinels(), page.GetNextPageToken(), err
			})
			if err != nil {
				return apiError("list sentinels", err)
			}
			all := &ctrlv1.ListSentinelsResponse{Sentinels: sentinels}
			if format.structured() {
				return printAs(cmd.OutOrStdout(), format, all)
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "SENTINEL\tREGION\tENVIRONMENT\tIMAGE\tREPLICAS\tHEALTH\tDEPLOY")
			for _, si := range all.GetSentinels() {
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d/%d\t%s\t%s\n", si.GetId(), si.GetRegion(), si.GetEnvironmentId(), si.GetImage(),
					si.GetAvailableReplicas(), si.GetReplicas(), si.GetHealth().Word(), si.GetDeployStatus())
			}
			return w.Flush()
		}),
	}
	cmd.Flags().StringVar(&region, "region", "", "only this region")
	cmd.Flags().StringVar(&environment, "environment", "", "only this environment")
	cmd.Flags().IntVar(&limit, "limit", 0, "at most this many (0: all)")
	return cmd
}
