package cli

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	clusterv1 "krane.dev/proto/krane/cluster/v1"
	ctrlv1 "krane.dev/proto/krane/ctrl/v1"
)

// deployCmd holds what every `ctrl deploy` subcommand shares.
type deployCmd struct {
	api  apiFlags
	poll time.Duration
}

func newDeploy() *cobra.Command {
	d := &deployCmd{}
	cmd := &cobra.Command{
		Use:   "deploy",
		Short: "Create, follow, roll back, promote, scale and stop deployments (the operators' deploy API)",
		Long: "Talks to ctrl's DeploymentService with an operator token (CTRL_TOKEN) at CTRL_ADDR.\n" +
			"Text output is for people; -o json prints protobuf JSON for scripts. " +
			"With --wait, the command follows the deploy region by region and exits 0 only when it is ready.",
	}
	d.api.add(cmd)
	cmd.PersistentFlags().DurationVar(&d.poll, "poll-interval", 500*time.Millisecond, "how often --wait asks for progress")
	_ = cmd.PersistentFlags().MarkHidden("poll-interval")
	cmd.AddCommand(d.create(), d.get(), d.list(), d.rollback(), d.promote(), d.scale(), d.stop())
	return cmd
}

func (d *deployCmd) create() *cobra.Command {
	var (
		env, secretEnv       []string
		secretFiles          []string
		timeout              time.Duration
		hcPath, hcMethod     string
		hcPort               int32
		wait                 bool
		waitTimeout          time.Duration
		replicas, port       int32
		cpuMillis, memoryMiB int64
		workspace, proj, app string
		environment, image   string
		idempotencyKey, sig  string
		regions, command     []string
		workloadFile         string
		req                  *ctrlv1.CreateDeploymentRequest // built before ctrl is dialled
	)
	cmd := &cobra.Command{
		Use:   "create --workspace W --project P --app A --environment E --image I [--region R]...",
		Short: "Create a deployment (and, with --wait, follow it until it is ready or failed)",
		Args:  cobra.NoArgs,
		// The flags and files are checked, and the request built, before
		// ctrl is dialled.
		RunE: clientRun(&d.api, ctrlv1.NewDeploymentServiceClient, func(cmd *cobra.Command, _ []string) error {
			vars, err := parseEnv(env)
			if err != nil {
				return err
			}
			secrets, err := secretEnvFrom(secretFiles, secretEnv, os.LookupEnv)
			if err != nil {
				return err
			}
			if idempotencyKey == "" {
				idempotencyKey = randomKey() // makes our own retries safe
			}
			w, err := readWorkload(workloadFile)
			if err != nil {
				return err
			}
			// A flag given wins over the file.
			set := cmd.Flags().Changed
			for _, f := range []struct {
				name  string
				apply func()
			}{
				{"image", func() { w.Image = image }}, {"cpu", func() { w.CpuMillicores = cpuMillis }}, {"memory", func() { w.MemoryMib = memoryMiB }},
				{"env", func() { w.EnvVars = vars }}, {"port", func() { w.Port = port }}, {"command", func() { w.Command = command }},
				{"shutdown-signal", func() { w.ShutdownSignal = sig }},
				{"healthcheck-path", func() { w.Healthcheck = &clusterv1.Healthcheck{Path: hcPath, Method: hcMethod, Port: hcPort} }},
			} {
				if set(f.name) {
					f.apply()
				}
			}
			if w.GetImage() == "" {
				return fmt.Errorf("an image is required: --image, or \"image\" in --workload")
			}
			req = &ctrlv1.CreateDeploymentRequest{
				WorkspaceId: workspace, ProjectId: proj, AppId: app, EnvironmentId: environment, Workload: w,
				Regions: regions, Replicas: replicas, SecretEnv: secrets, IdempotencyKey: idempotencyKey,
				TimeoutSeconds: int32(timeout / time.Second),
			}
			return nil
		}, func(cmd *cobra.Command, _ []string, format output, api ctrlv1.DeploymentServiceClient) error {
			resp, err := withRetry(cmd.Context(), func(ctx context.Context) (*ctrlv1.CreateDeploymentResponse, error) {
				return api.CreateDeployment(ctx, req)
			})
			if err != nil {
				return apiError("create the deployment", err)
			}
			return d.created(cmd, api, resp.GetDeploymentId(), wait, waitTimeout, format)
		}),
	}
	f := cmd.Flags()
	f.StringVar(&workspace, "workspace", "", "workspace id (required)")
	f.StringVar(&proj, "project", "", "project id (required)")
	f.StringVar(&app, "app", "", "app id (required)")
	f.StringVar(&environment, "environment", "", "environment id (required)")
	f.StringVar(&image, "image", "", "container image, e.g. registry.example.com/team/app:1.2.3 (required, here or in --workload)")
	f.StringVar(&workloadFile, "workload", "", "file of the workload as JSON (krane.cluster.v1.Workload, proto field names: image, command, env_vars, cpu_millicores, ...); "+
		"the flags below win over it, and it sets what they cannot")
	f.StringSliceVar(&regions, "region", nil, "region to run in (repeat or comma-separate); default every region with a registered cluster")
	f.Int32Var(&replicas, "replicas", 0, "instances per region (0: 1)")
	f.Int64Var(&cpuMillis, "cpu", 0, "CPU per instance in millicores (0: 250)")
	f.Int64Var(&memoryMiB, "memory", 0, "memory per instance in MiB (0: 256)")
	f.StringArrayVar(&env, "env", nil, "environment variable KEY=VALUE (repeatable)")
	f.StringArrayVar(&secretEnv, "secret-env", nil, "secret variable, sealed by ctrl: KEY=VALUE, or KEY alone to take the value from this command's environment "+
		"(repeatable; a value on the command line shows in process lists and shell history: prefer KEY alone or --secret-env-file)")
	f.StringArrayVar(&secretFiles, "secret-env-file", nil, "file of secret variables in dotenv form: KEY=VALUE lines, # comments, optional export and quotes (repeatable; --secret-env wins)")
	f.Int32Var(&port, "port", 0, "port the container listens on (0: 8080)")
	f.StringArrayVar(&command, "command", nil, "command and arguments, one per flag (repeatable); default the image's")
	f.StringVar(&hcPath, "healthcheck-path", "", "HTTP path of the health check, e.g. /healthz (none when empty)")
	f.StringVar(&hcMethod, "healthcheck-method", "GET", "GET or POST")
	f.Int32Var(&hcPort, "healthcheck-port", 0, "port of the health check (0: --port)")
	f.StringVar(&sig, "shutdown-signal", "", "SIGTERM (default), SIGINT, SIGQUIT or SIGKILL")
	f.DurationVar(&timeout, "timeout", 0, "how long the deploy may take to run in every region (0: ctrl's deploy.timeout)")
	f.StringVar(&idempotencyKey, "idempotency-key", "", "repeat a create safely: the same key returns the same deployment (default: a random key per command)")
	f.BoolVar(&wait, "wait", false, "follow the deploy and exit 0 only when it is ready")
	f.DurationVar(&waitTimeout, "wait-timeout", 30*time.Minute, "give up following after this long (the deploy itself goes on)")
	for _, name := range []string{"workspace", "project", "app", "environment"} {
		_ = cmd.MarkFlagRequired(name)
	}
	return cmd
}

// created prints a new deployment's id, or follows it with --wait.
func (d *deployCmd) created(cmd *cobra.Command, api ctrlv1.DeploymentServiceClient, id string, wait bool, waitTimeout time.Duration, format output) error {
	out := cmd.OutOrStdout()
	if !wait {
		if format.structured() {
			return printAs(out, format, &ctrlv1.CreateDeploymentResponse{DeploymentId: id})
		}
		fmt.Fprintln(out, id)
		fmt.Fprintf(cmd.ErrOrStderr(), "Deployment %s created; follow it with `ctrl deploy get %s --wait`.\n", id, id)
		return nil
	}
	progress := cmd.OutOrStdout()
	if format.structured() {
		progress = cmd.ErrOrStderr()
	}
	fmt.Fprintf(progress, "deployment %s created; following it (interrupting stops the following, not the deploy)\n", id)
	return d.follow(cmd, api, id, waitTimeout, format)
}

// follow polls a deployment until it is ready, failed or stopped, printing
// one line per change of status or of a region's counts (to stdout in text
// mode, to stderr with -o json, whose stdout is only the final document).
func (d *deployCmd) follow(cmd *cobra.Command, api ctrlv1.DeploymentServiceClient, id string, waitTimeout time.Duration, format output) error {
	return d.watch(cmd, api, id, "deployment "+id, "the deploy goes on", waitTimeout, format, func(info *ctrlv1.DeploymentInfo) (bool, error) {
		switch info.GetStatus() {
		case ctrlv1.DeploymentStatus_DEPLOYMENT_STATUS_READY, ctrlv1.DeploymentStatus_DEPLOYMENT_STATUS_FAILED, ctrlv1.DeploymentStatus_DEPLOYMENT_STATUS_STOPPED:
			return true, nil
		}
		return false, nil
	})
}

// watch reads the deployment every poll interval and prints a progress line
// whenever it changes, until done stops it (with an error, or with nil to
// print the summary through finish) or waitTimeout passes. what and goesOn
// word the message of an interrupted wait.
func (d *deployCmd) watch(cmd *cobra.Command, api ctrlv1.DeploymentServiceClient, id, what, goesOn string, waitTimeout time.Duration, format output,
	done func(*ctrlv1.DeploymentInfo) (bool, error)) error {
	progress := cmd.OutOrStdout()
	if format.structured() {
		progress = cmd.ErrOrStderr()
	}
	ctx, cancel := context.WithTimeout(cmd.Context(), waitTimeout)
	defer cancel()
	begin := time.Now()
	last := ""
	for {
		info, err := withRetry(ctx, func(ctx context.Context) (*ctrlv1.DeploymentInfo, error) {
			return api.GetDeployment(ctx, &ctrlv1.GetDeploymentRequest{DeploymentId: id})
		})
		if err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("stopped following %s after %s; %s (see `ctrl deploy get %s`)", what, time.Since(begin).Round(time.Second), goesOn, id)
			}
			return apiError("read deployment "+id, err)
		}
		if line := progressLine(info); line != last {
			fmt.Fprintf(progress, "[%6.1fs] %s\n", time.Since(begin).Seconds(), line)
			last = line
		}
		stop, err := done(info)
		if err != nil {
			return err
		}
		if stop {
			return finish(cmd, info, time.Since(begin), format)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("stopped following %s after %s (%s, %s); %s (see `ctrl deploy get %s`)",
				what, time.Since(begin).Round(time.Second), statusName(info.GetStatus()), regionCounts(info), goesOn, id)
		case <-time.After(d.poll):
		}
	}
}

// finish prints the summary and turns anything but ready into an error.
func finish(cmd *cobra.Command, info *ctrlv1.DeploymentInfo, took time.Duration, format output) error {
	out := cmd.OutOrStdout()
	if format.structured() {
		if err := printAs(out, format, info); err != nil {
			return err
		}
	} else {
		fmt.Fprintf(out, "deployment %s is %s after %s: %s", info.GetId(), statusName(info.GetStatus()), took.Round(100*time.Millisecond), regionSummary(info))
		if info.GetLive() {
			fmt.Fprint(out, "; live")
		}
		fmt.Fprintln(out)
	}
	switch info.GetStatus() {
	case ctrlv1.DeploymentStatus_DEPLOYMENT_STATUS_READY:
		return nil
	case ctrlv1.DeploymentStatus_DEPLOYMENT_STATUS_FAILED:
		return fmt.Errorf("deployment %s failed: %s", info.GetId(), info.GetError())
	}
	return fmt.Errorf("deployment %s is %s, not ready", info.GetId(), statusName(info.GetStatus()))
}

// progressLine: "network  eu 1/2 running, 1 pending | us 0/2 running".
func progressLine(info *ctrlv1.DeploymentInfo) string {
	s := fmt.Sprintf("%-9s", statusName(info.GetStatus())) // "deploying" is the longest
	if len(info.GetRegions()) > 0 {
		s += "  " + regionCounts(info)
	}
	s = strings.TrimRight(s, " ")
	if info.GetStatus() == ctrlv1.DeploymentStatus_DEPLOYMENT_STATUS_FAILED {
		s += "  " + info.GetError()
	}
	return s
}

func regionCounts(info *ctrlv1.DeploymentInfo) string {
	var parts []string
	for _, r := range info.GetRegions() {
		p := fmt.Sprintf("%s %d/%d running", r.GetRegion(), r.GetRunning(), r.GetDesiredReplicas())
		if r.GetPending() > 0 {
			p += fmt.Sprintf(", %d pending", r.GetPending())
		}
		if r.GetFailed() > 0 {
			p += fmt.Sprintf(", %d failed", r.GetFailed())
		}
		if r.GetDesiredStatus() == "stopped" {
			p += " (stopped)"
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, " | ")
}

func regionSummary(info *ctrlv1.DeploymentInfo) string {
	if len(info.GetRegions()) == 0 {
		return "no regions"
	}
	var parts []string
	for _, r := range info.GetRegions() {
		parts = append(parts, fmt.Sprintf("%s %d/%d", r.GetRegion(), r.GetRunning(), r.GetDesiredReplicas()))
	}
	return strings.Join(parts, ", ")
}

func statusName(s ctrlv1.DeploymentStatus) string {
	return strings.ToLower(strings.TrimPrefix(s.String(), "DEPLOYMENT_STATUS_"))
}

func (d *deployCmd) get() *cobra.Command {
	var wait bool
	var waitTimeout time.Duration
	cmd := &cobra.Command{
		Use:   "get DEPLOYMENT_ID",
		Short: "Show a deployment: status, error, regions and instances (with --wait, follow it)",
		Args:  cobra.ExactArgs(1),
		RunE: clientRun(&d.api, ctrlv1.NewDeploymentServiceClient, nil, func(cmd *cobra.Command, args []string, format output, api ctrlv1.DeploymentServiceClient) error {
			if wait {
				return d.follow(cmd, api, args[0], waitTimeout, format)
			}
			info, err := api.GetDeployment(cmd.Context(), &ctrlv1.GetDeploymentRequest{DeploymentId: args[0]})
			if err != nil {
				return apiError("read deployment "+args[0], err)
			}
			if format.structured() {
				return printAs(cmd.OutOrStdout(), format, info)
			}
			printDeployment(cmd.OutOrStdout(), info)
			return nil
		}),
	}
	cmd.Flags().BoolVar(&wait, "wait", false, "follow the deploy and exit 0 only when it is ready")
	cmd.Flags().DurationVar(&waitTimeout, "wait-timeout", 30*time.Minute, "give up following after this long")
	return cmd
}

// printHistory lists a deployment's history, oldest first.
func printHistory(out io.Writer, events []*ctrlv1.DeploymentEvent) {
	if len(events) == 0 {
		return
	}
	fmt.Fprintln(out)
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "AT\tSTATUS\tNOTE")
	for _, e := range events {
		fmt.Fprintf(w, "%s\t%s\t%s\n", e.GetAt().AsTime().Format(time.RFC3339), statusName(e.GetStatus()), e.GetMessage())
	}
	w.Flush()
}

func printDeployment(out io.Writer, d *ctrlv1.DeploymentInfo) {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintf(w, "Deployment:\t%s\n", d.GetId())
	fmt.Fprintf(w, "Status:\t%s\n", statusName(d.GetStatus()))
	if d.GetError() != "" {
		fmt.Fprintf(w, "Error:\t%s\n", d.GetError())
	}
	fmt.Fprintf(w, "Live:\t%v\n", d.GetLive())
	wl := d.GetWorkload() // the top-level copies of its fields are deprecated
	fmt.Fprintf(w, "Image:\t%s\n", wl.GetImage())
	fmt.Fprintf(w, "Environment:\t%s (workspace %s, project %s, app %s)\n", d.GetEnvironmentId(), d.GetWorkspaceId(), d.GetProjectId(), d.GetAppId())
	fmt.Fprintf(w, "Size:\t%d replicas per region, %dm CPU, %d MiB\n", d.GetReplicas(), wl.GetCpuMillicores(), wl.GetMemoryMib())
	if d.GetRolledBackFrom() != "" {
		fmt.Fprintf(w, "Rolled back from:\t%s\n", d.GetRolledBackFrom())
	}
	if len(wl.GetEnvVars()) > 0 {
		fmt.Fprintf(w, "Env:\t%s\n", strings.Join(slices.Sorted(maps.Keys(wl.GetEnvVars())), ", "))
	}
	if len(d.GetSecretEnvKeys()) > 0 {
		fmt.Fprintf(w, "Secret env:\t%s (sealed; values are never shown)\n", strings.Join(d.GetSecretEnvKeys(), ", "))
	}
	fmt.Fprintf(w, "Created:\t%s\n", d.GetCreatedAt().AsTime().Format(time.RFC3339))
	w.Flush()
	printHistory(out, d.GetHistory())
	if len(d.GetRegions()) == 0 {
		return
	}
	fmt.Fprintln(out)
	w = tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "REGION\tDESIRED\tRUNNING\tPENDING\tFAILED\tSTATE")
	for _, r := range d.GetRegions() {
		fmt.Fprintf(w, "%s\t%d\t%d\t%d\t%d\t%s\n", r.GetRegion(), r.GetDesiredReplicas(), r.GetRunning(), r.GetPending(), r.GetFailed(), r.GetDesiredStatus())
	}
	w.Flush()
	var instances [][]string
	for _, r := range d.GetRegions() {
		for _, in := range r.GetInstances() {
			why := in.GetReason()
			if in.GetMessage() != "" {
				why = strings.TrimPrefix(why+": "+in.GetMessage(), ": ")
			}
			instances = append(instances, []string{r.GetRegion(), in.GetClusterId(), in.GetK8SName(), in.GetStatus(), why})
		}
		if n := r.GetInstancesOmitted(); n > 0 {
			instances = append(instances, []string{r.GetRegion(), "", fmt.Sprintf("(%d more, left out to keep the answer small)", n), "", ""})
		}
	}
	if len(instances) > 0 {
		fmt.Fprintln(out)
		w = tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "REGION\tCLUSTER\tINSTANCE\tSTATUS\tREASON")
		for _, row := range instances {
			fmt.Fprintln(w, strings.Join(row, "\t"))
		}
		w.Flush()
	}
}

func (d *deployCmd) list() *cobra.Command {
	var environment string
	var limit int32
	cmd := &cobra.Command{
		Use:   "list --environment E",
		Short: "List an environment's deployments, newest first",
		Args:  cobra.NoArgs,
		RunE: clientRun(&d.api, ctrlv1.NewDeploymentServiceClient, nil, func(cmd *cobra.Command, _ []string, format output, api ctrlv1.DeploymentServiceClient) error {
			deployments, err := allPages(100, limit, func(size int32, token string) ([]*ctrlv1.DeploymentInfo, string, error) {
				page, err := api.ListDeployments(cmd.Context(), &ctrlv1.ListDeploymentsRequest{EnvironmentId: environment, PageSize: size, PageToken: token})
				return page.GetDeployments(), page.GetNextPageToken(), err
			})
			if err != nil {
				return apiError("list deployments", err)
			}
			all := &ctrlv1.ListDeploymentsResponse{Deployments: deployments}
			if format.structured() {
				return printAs(cmd.OutOrStdout(), format, all)
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "DEPLOYMENT\tSTATUS\tLIVE\tIMAGE\tREGIONS\tCREATED")
			for _, d := range all.GetDeployments() {
				live := ""
				if d.GetLive() {
					live = "live"
				}
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", d.GetId(), statusName(d.GetStatus()), live, d.GetWorkload().GetImage(), regionSummary(d),
					d.GetCreatedAt().AsTime().Format(time.RFC3339))
			}
			return w.Flush()
		}),
	}
	cmd.Flags().StringVar(&environment, "environment", "", "environment id (required)")
	cmd.Flags().Int32Var(&limit, "limit", 20, "at most this many (0: all)")
	_ = cmd.MarkFlagRequired("environment")
	return cmd
}

func (d *deployCmd) rollback() *cobra.Command {
	var environment, target, key string
	var wait bool
	var waitTimeout time.Duration
	cmd := &cobra.Command{
		Use:   "rollback --environment E [--target DEPLOYMENT_ID]",
		Short: "Deploy an earlier deployment's configuration again; it becomes live when ready",
		Long: "Creates a new deployment with the configuration (image, size, variables, regions) of --target, " +
			"by default the last deployment before the live one that became ready. It becomes the environment's live deployment once ready.",
		Args: cobra.NoArgs,
		RunE: clientRun(&d.api, ctrlv1.NewDeploymentServiceClient, nil, func(cmd *cobra.Command, _ []string, format output, api ctrlv1.DeploymentServiceClient) error {
			if key == "" {
				key = randomKey()
			}
			resp, err := withRetry(cmd.Context(), func(ctx context.Context) (*ctrlv1.CreateDeploymentResponse, error) {
				return api.Rollback(ctx, &ctrlv1.RollbackRequest{EnvironmentId: environment, TargetDeploymentId: target, IdempotencyKey: key})
			})
			if err != nil {
				return apiError("roll back", err)
			}
			return d.created(cmd, api, resp.GetDeploymentId(), wait, waitTimeout, format)
		}),
	}
	cmd.Flags().StringVar(&environment, "environment", "", "environment id (required)")
	cmd.Flags().StringVar(&target, "target", "", "deployment whose configuration to restore (default: the last ready one before the live one)")
	cmd.Flags().StringVar(&key, "idempotency-key", "", "repeat a rollback safely (default: a random key per command)")
	cmd.Flags().BoolVar(&wait, "wait", false, "follow the new deployment and exit 0 only when it is ready")
	cmd.Flags().DurationVar(&waitTimeout, "wait-timeout", 30*time.Minute, "give up following after this long")
	_ = cmd.MarkFlagRequired("environment")
	return cmd
}

func (d *deployCmd) promote() *cobra.Command {
	return d.simple("promote DEPLOYMENT_ID", "Make a ready deployment its environment's live one", "promoted",
		func(ctx context.Context, api ctrlv1.DeploymentServiceClient, id string) error {
			_, err := api.Promote(ctx, &ctrlv1.PromoteRequest{DeploymentId: id})
			return err
		})
}

func (d *deployCmd) stop() *cobra.Command {
	return d.simple("stop DEPLOYMENT_ID", "Remove a deployment from every region (it stops being live)", "stopped",
		func(ctx context.Context, api ctrlv1.DeploymentServiceClient, id string) error {
			_, err := api.StopDeployment(ctx, &ctrlv1.StopDeploymentRequest{DeploymentId: id})
			return err
		})
}

func (d *deployCmd) scale() *cobra.Command {
	var (
		replicas    int32
		wait        bool
		waitTimeout time.Duration
	)
	cmd := &cobra.Command{
		Use:   "scale DEPLOYMENT_ID --replicas N",
		Short: "Change a ready deployment's replicas per region in place (and, with --wait, follow until every region runs them)",
		Args:  cobra.ExactArgs(1),
		RunE: clientRun(&d.api, ctrlv1.NewDeploymentServiceClient, nil, func(cmd *cobra.Command, args []string, format output, api ctrlv1.DeploymentServiceClient) error {
			id := args[0]
			resp, err := withRetry(cmd.Context(), func(ctx context.Context) (*ctrlv1.ScaleDeploymentResponse, error) {
				return api.ScaleDeployment(ctx, &ctrlv1.ScaleDeploymentRequest{DeploymentId: id, Replicas: replicas})
			})
			if err != nil {
				return apiError("scale "+id, err)
			}
			progress := cmd.OutOrStdout()
			if format.structured() {
				progress = cmd.ErrOrStderr()
			}
			fmt.Fprintf(progress, "deployment %s scaled from %d to %d replicas per region\n", id, resp.GetPreviousReplicas(), resp.GetReplicas())
			if wait {
				return d.followScale(cmd, api, id, replicas, waitTimeout, format)
			}
			if format.structured() {
				return printAs(cmd.OutOrStdout(), format, resp)
			}
			return nil
		}),
	}
	cmd.Flags().Int32Var(&replicas, "replicas", 0, "replicas per region, 1..1000 (required)")
	cmd.Flags().BoolVar(&wait, "wait", false, "follow until every region runs exactly that many instances")
	cmd.Flags().DurationVar(&waitTimeout, "wait-timeout", 10*time.Minute, "give up following after this long")
	_ = cmd.MarkFlagRequired("replicas")
	return cmd
}

// followScale polls until every running region reports exactly replicas
// running instances and none pending.
func (d *deployCmd) followScale(cmd *cobra.Command, api ctrlv1.DeploymentServiceClient, id string, replicas int32, waitTimeout time.Duration, format output) error {
	return d.watch(cmd, api, id, "the scale of deployment "+id, "it goes on", waitTimeout, format, func(info *ctrlv1.DeploymentInfo) (bool, error) {
		if st := info.GetStatus(); st != ctrlv1.DeploymentStatus_DEPLOYMENT_STATUS_READY && st != ctrlv1.DeploymentStatus_DEPLOYMENT_STATUS_NETWORK {
			return false, fmt.Errorf("deployment %s became %s while scaling: %s", id, statusName(st), info.GetError())
		}
		return scaled(info, replicas), nil
	})
}

// scaled: every running region runs exactly replicas instances.
func scaled(info *ctrlv1.DeploymentInfo, replicas int32) bool {
	for _, r := range info.GetRegions() {
		if r.GetDesiredStatus() == "stopped" {
			continue
		}
		if r.GetDesiredReplicas() != replicas || r.GetRunning() != replicas || r.GetPending() > 0 {
			return false
		}
	}
	return true
}

// simple is a command that calls one RPC on one deployment id.
func (d *deployCmd) simple(use, short, done string, call func(context.Context, ctrlv1.DeploymentServiceClient, string) error) *cobra.Command {
	return &cobra.Command{
		Use:   use,
		Short: short,
		Args:  cobra.ExactArgs(1),
		RunE: clientRun(&d.api, ctrlv1.NewDeploymentServiceClient, nil, func(cmd *cobra.Command, args []string, format output, api ctrlv1.DeploymentServiceClient) error {
			if _, err := withRetry(cmd.Context(), func(ctx context.Context) (struct{}, error) { return struct{}{}, call(ctx, api, args[0]) }); err != nil {
				return apiError(strings.Fields(use)[0]+" "+args[0], err)
			}
			if format.structured() {
				fmt.Fprintf(cmd.OutOrStdout(), "{\"deployment_id\": %q, \"result\": %q}\n", args[0], done)
				return nil
			}
			fmt.Fprintf(cmd.OutOrStdout(), "deployment %s %s\n", args[0], done)
			return nil
		}),
	}
}

// withRetry retries a call that failed with UNAVAILABLE (ctrl restarting,
// its database or Restate briefly away): three attempts, 1 s and 2 s apart.
// Creates carry an idempotency key, so a retry never makes a second
// deployment.
func withRetry[T any](ctx context.Context, call func(context.Context) (T, error)) (T, error) {
	var v T
	var err error
	for attempt := range 3 {
		if attempt > 0 {
			select {
			case <-ctx.Done():
				return v, err
			case <-time.After(time.Duration(attempt) * time.Second):
			}
		}
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		v, err = call(cctx)
		cancel()
		if status.Code(err) != codes.Unavailable {
			return v, err
		}
	}
	return v, err
}

// apiError words a gRPC error for the terminal: what failed and ctrl's
// own explanation.
func apiError(what string, err error) error {
	st, ok := status.FromError(err)
	if !ok {
		return fmt.Errorf("%s: %w", what, err)
	}
	switch st.Code() {
	case codes.Unauthenticated:
		return fmt.Errorf("%s: ctrl refused the token (%s); check CTRL_TOKEN", what, st.Message())
	case codes.PermissionDenied:
		return fmt.Errorf("%s: %s (use an operator token, from `ctrl admin token create-operator`)", what, st.Message())
	case codes.Unimplemented:
		return fmt.Errorf("%s: this ctrl does not serve the deploy API (it runs without Restate: set restate.ingress_url)", what)
	}
	return fmt.Errorf("%s: %s", what, st.Message())
}

func parseEnv(pairs []string) (map[string]string, error) {
	out := map[string]string{}
	for _, p := range pairs {
		k, v, ok := strings.Cut(p, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--env %q: want KEY=VALUE", p)
		}
		if _, dup := out[k]; dup {
			return nil, fmt.Errorf("--env %s is given twice", k)
		}
		out[k] = v
	}
	return out, nil
}

func randomKey() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return "cli-" + hex.EncodeToString(b)
}

// readWorkload reads a --workload file (protojson of
// krane.cluster.v1.Workload); no file is an empty workload.
func readWorkload(path string) (*clusterv1.Workload, error) {
	w := &clusterv1.Workload{}
	if path == "" {
		return w, nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--workload: %w", err)
	}
	if err := protojson.Unmarshal(b, w); err != nil {
		return nil, fmt.Errorf("--workload %s is not a workload as JSON (krane.cluster.v1.Workload, e.g. {\"image\": \"registry.example.com/app:1\", \"port\": 9000}): %w", path, err)
	}
	return w, nil
}
