package cli

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	ctrlv1 "krane.dev/proto/krane/ctrl/v1"
)

// Exit statuses of the rollout commands (besides 0 and 1, an error).
const (
	// ExitPaused: the rollout is paused and waits for an operator.
	ExitPaused = 2
	// ExitCancelled: the rollout was cancelled (or rolled back).
	ExitCancelled = 3
)

// exitError is an error with its own exit status (Main uses it).
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) ExitCode() int { return e.code }

type rolloutCmd struct {
	api  apiFlags
	poll time.Duration
}

func newRollout() *cobra.Command {
	r := &rolloutCmd{}
	cmd := &cobra.Command{
		Use:   "rollout",
		Short: "Roll a sentinel image across the fleet in waves; follow, resume, cancel or roll back the rollout",
		Long: "Talks to ctrl's RolloutService with an operator token (CTRL_TOKEN) at CTRL_ADDR. One rollout runs at a time.\n" +
			"A rollout deploys the image to every running sentinel in waves of cumulative percentages (default 1,5,25,50,100); " +
			"a wave with a sentinel that does not become ready pauses it. --watch shows the waves live.\n" +
			"Exit status: 0 completed (or, without --watch, accepted / still running), 2 paused, 3 cancelled, 1 error.",
	}
	r.api.add(cmd)
	cmd.PersistentFlags().DurationVar(&r.poll, "poll-interval", 500*time.Millisecond, "how often --watch asks for progress")
	_ = cmd.PersistentFlags().MarkHidden("poll-interval")
	cmd.AddCommand(r.start(), r.status(), r.resume(), r.cancel(), r.rollback())
	return cmd
}

// run is the shape of every rollout command: connect, call, then show
// the status once or follow it.
func (r *rolloutCmd) run(cmd *cobra.Command, what string, watch bool, waitTimeout time.Duration,
	call func(context.Context, ctrlv1.RolloutServiceClient) (*ctrlv1.RolloutStatus, error)) error {
	return clientRun(&r.api, ctrlv1.NewRolloutServiceClient, nil, func(cmd *cobra.Command, _ []string, format output, api ctrlv1.RolloutServiceClient) error {
		return r.show(cmd, what, watch, waitTimeout, format, api, call)
	})(cmd, nil)
}

// show makes the call and shows the status once, or follows it.
func (r *rolloutCmd) show(cmd *cobra.Command, what string, watch bool, waitTimeout time.Duration, format output, api ctrlv1.RolloutServiceClient,
	call func(context.Context, ctrlv1.RolloutServiceClient) (*ctrlv1.RolloutStatus, error)) error {
	st, err := call(cmd.Context(), api)
	if err != nil {
		return apiError(what, err)
	}
	if watch {
		return r.follow(cmd, api, st, waitTimeout, format)
	}
	if format.structured() {
		if err := printAs(cmd.OutOrStdout(), format, st); err != nil {
			return err
		}
	} else {
		printRollout(cmd.OutOrStdout(), st)
	}
	return nil
}

func (r *rolloutCmd) start() *cobra.Command {
	var (
		image, slack               string
		waves                      []int
		bake, deployTimeout, waitT time.Duration
		watch                      bool
	)
	cmd := &cobra.Command{
		Use:   "start --image I [--waves 1,5,25,50,100] [--bake 10m] [--slack-webhook URL] [--watch]",
		Short: "Start rolling an image to every running sentinel",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			pcts := make([]int32, len(waves))
			for i, w := range waves {
				pcts[i] = int32(w)
			}
			req := &ctrlv1.StartRolloutRequest{Image: image, WavePercentages: pcts, SlackWebhookUrl: slack,
				BakeSeconds: int32(bake / time.Second), DeployTimeoutSeconds: int32(deployTimeout / time.Second)}
			return r.run(cmd, "start the rollout", watch, waitT, func(ctx context.Context, api ctrlv1.RolloutServiceClient) (*ctrlv1.RolloutStatus, error) {
				return api.StartRollout(ctx, req)
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&image, "image", "", "sentinel image to roll out (required)")
	f.IntSliceVar(&waves, "waves", nil, "cumulative wave percentages, strictly increasing, ending at 100 (default 1,5,25,50,100)")
	f.DurationVar(&bake, "bake", 0, "pause after each successful wave before the next")
	f.DurationVar(&deployTimeout, "deploy-timeout", 0, "how long each sentinel may take (0: ctrl's sentinel.deploy_timeout)")
	f.StringVar(&slack, "slack-webhook", "", "Slack incoming webhook URL for a message at every transition")
	f.BoolVar(&watch, "watch", false, "follow the rollout until it completes, pauses or is cancelled")
	f.DurationVar(&waitT, "wait-timeout", 24*time.Hour, "give up watching after this long (the rollout goes on)")
	_ = cmd.MarkFlagRequired("image")
	return cmd
}

func (r *rolloutCmd) status() *cobra.Command {
	var watch bool
	var waitT time.Duration
	cmd := &cobra.Command{
		Use:   "status [--watch]",
		Short: "Show the rollout: state, waves, failed sentinels (exit status 2 when paused, 3 when cancelled)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var last *ctrlv1.RolloutStatus
			err := r.run(cmd, "read the rollout", watch, waitT, func(ctx context.Context, api ctrlv1.RolloutServiceClient) (*ctrlv1.RolloutStatus, error) {
				st, err := api.GetRolloutStatus(ctx, &ctrlv1.GetRolloutStatusRequest{})
				last = st
				return st, err
			})
			if err != nil || watch {
				return err
			}
			return outcome(last)
		},
	}
	cmd.Flags().BoolVar(&watch, "watch", false, "follow the rollout until it completes, pauses or is cancelled")
	cmd.Flags().DurationVar(&waitT, "wait-timeout", 24*time.Hour, "give up watching after this long (the rollout goes on)")
	return cmd
}

func (r *rolloutCmd) resume() *cobra.Command {
	var retry, watch bool
	var waitT time.Duration
	cmd := &cobra.Command{
		Use:   "resume [--retry-failed] [--watch]",
		Short: "Continue a paused rollout: past the failed wave, or retrying its failed sentinels first",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return r.run(cmd, "resume the rollout", watch, waitT, func(ctx context.Context, api ctrlv1.RolloutServiceClient) (*ctrlv1.RolloutStatus, error) {
				return api.ResumeRollout(ctx, &ctrlv1.ResumeRolloutRequest{RetryFailed: retry})
			})
		},
	}
	cmd.Flags().BoolVar(&retry, "retry-failed", false, "deploy the failed sentinels again before moving on")
	cmd.Flags().BoolVar(&watch, "watch", false, "follow the rollout until it completes, pauses or is cancelled")
	cmd.Flags().DurationVar(&waitT, "wait-timeout", 24*time.Hour, "give up watching after this long (the rollout goes on)")
	return cmd
}

func (r *rolloutCmd) cancel() *cobra.Command {
	return &cobra.Command{
		Use:   "cancel",
		Short: "Cancel the rollout: no further wave starts (deploys in flight finish; nothing is reverted); a rollback that does not end is cancelled too",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return r.run(cmd, "cancel the rollout", false, 0, func(ctx context.Context, api ctrlv1.RolloutServiceClient) (*ctrlv1.RolloutStatus, error) {
				return api.CancelRollout(ctx, &ctrlv1.CancelRolloutRequest{})
			})
		},
	}
}

func (r *rolloutCmd) rollback() *cobra.Command {
	var waitT time.Duration
	cmd := &cobra.Command{
		Use:   "rollback",
		Short: "Deploy every sentinel a paused or cancelled rollout touched back to its previous image, and wait for them",
		Long:  "Exit status: 0 when every touched sentinel is back on its previous image, 1 when some are not (they are listed).",
		Args:  cobra.NoArgs,
		RunE: clientRun(&r.api, ctrlv1.NewRolloutServiceClient, nil, func(cmd *cobra.Command, _ []string, format output, api ctrlv1.RolloutServiceClient) error {
			progress := cmd.OutOrStdout()
			if format.structured() {
				progress = cmd.ErrOrStderr()
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), waitT)
			defer cancel()
			type result struct {
				resp *ctrlv1.RollbackAllResponse
				err  error
			}
			done := make(chan result, 1)
			go func() {
				resp, err := api.RollbackAll(ctx, &ctrlv1.RollbackAllRequest{})
				done <- result{resp, err}
			}()
			begin, last := time.Now(), ""
			for {
				select {
				case res := <-done:
					if res.err != nil {
						return apiError("roll back", res.err)
					}
					st := res.resp.GetStatus()
					if format.structured() {
						if err := printAs(cmd.OutOrStdout(), format, res.resp); err != nil {
							return err
						}
					} else {
						fmt.Fprintf(cmd.OutOrStdout(), "rollout %s rolled back after %s: %d of %d touched sentinels are on their previous image again\n",
							st.GetRun(), time.Since(begin).Round(100*time.Millisecond), res.resp.GetReverted(), st.GetRollbackTotal())
					}
					if n := len(res.resp.GetFailedIds()); n > 0 {
						return fmt.Errorf("%d sentinels did not go back: %s (see `ctrl sentinel get <id>`)", n, strings.Join(res.resp.GetFailedIds(), ", "))
					}
					return nil
				case <-time.After(r.poll):
				}
				if st, err := api.GetRolloutStatus(ctx, &ctrlv1.GetRolloutStatusRequest{}); err == nil && st.GetState() == "rolling_back" {
					if line := fmt.Sprintf("rolling_back  %d of %d back", st.GetReverted(), st.GetRollbackTotal()); line != last {
						fmt.Fprintf(progress, "[%6.1fs] %s\n", time.Since(begin).Seconds(), line)
						last = line
					}
				}
			}
		}),
	}
	cmd.Flags().DurationVar(&waitT, "wait-timeout", 2*time.Hour, "give up waiting after this long (the rollback goes on)")
	return cmd
}

// follow polls the rollout until it completes, pauses or is cancelled. On
// a terminal the wave table is redrawn in place; otherwise (a pipe, a log)
// one line is printed per change. With -o json the progress goes to
// stderr and stdout gets the final status.
func (r *rolloutCmd) follow(cmd *cobra.Command, api ctrlv1.RolloutServiceClient, st *ctrlv1.RolloutStatus, waitTimeout time.Duration, format output) error {
	progress := cmd.OutOrStdout()
	if format.structured() {
		progress = cmd.ErrOrStderr()
	}
	tty := isTerminal(progress)
	ctx, cancel := context.WithTimeout(cmd.Context(), waitTimeout)
	defer cancel()
	begin, last, drawn := time.Now(), "", 0
	for {
		if tty {
			var b bytes.Buffer
			fmt.Fprintf(&b, "[%6.1fs] ", time.Since(begin).Seconds())
			printRollout(&b, st)
			if drawn > 0 {
				fmt.Fprintf(progress, "\x1b[%dA\x1b[J", drawn) // back to the table's first line, clear below
			}
			_, _ = progress.Write(b.Bytes())
			drawn = bytes.Count(b.Bytes(), []byte("\n"))
		} else if line := rolloutLine(st); line != last {
			fmt.Fprintf(progress, "[%6.1fs] %s\n", time.Since(begin).Seconds(), line)
			last = line
		}
		switch st.GetState() {
		case "completed", "paused", "cancelled", "idle":
			if format.structured() {
				if err := printAs(cmd.OutOrStdout(), format, st); err != nil {
					return err
				}
			} else if !tty {
				printRollout(cmd.OutOrStdout(), st)
			}
			return outcome(st)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("stopped watching rollout %s after %s (%s); it goes on (see `ctrl rollout status`)",
				st.GetRun(), time.Since(begin).Round(time.Second), st.GetState())
		case <-time.After(r.poll):
		}
		next, err := api.GetRolloutStatus(ctx, &ctrlv1.GetRolloutStatusRequest{})
		if err != nil {
			if status.Code(err) == codes.Unavailable && ctx.Err() == nil {
				continue // ctrl or Restate briefly away
			}
			if ctx.Err() != nil {
				continue // reported by the select above
			}
			return apiError("read the rollout", err)
		}
		st = next
	}
}

// outcome is the exit status of a rollout state: paused and cancelled are
// errors with their own codes.
func outcome(st *ctrlv1.RolloutStatus) error {
	switch st.GetState() {
	case "paused":
		return &exitError{ExitPaused, fmt.Errorf("rollout %s is paused: %s", st.GetRun(), st.GetMessage())}
	case "cancelled":
		return &exitError{ExitCancelled, fmt.Errorf("rollout %s is cancelled: %s", st.GetRun(), st.GetMessage())}
	}
	return nil
}

// rolloutLine: "in_progress  wave 3/5  ready 5/100, failed 0  | w1 1/1 completed | w2 4/4 completed | w3 0/20 in_progress".
func rolloutLine(st *ctrlv1.RolloutStatus) string {
	s := fmt.Sprintf("%-12s", st.GetState())
	if len(st.GetWaves()) > 0 {
		s += fmt.Sprintf("  wave %d/%d  ready %d/%d, failed %d ", st.GetCurrentWave(), len(st.GetWaves()), st.GetSucceeded(), st.GetTotal(), st.GetFailed())
		for _, w := range st.GetWaves() {
			s += fmt.Sprintf(" | w%d %d/%d %s", w.GetIndex(), w.GetSucceeded(), w.GetSize(), w.GetState())
		}
	}
	if st.GetState() == "rolling_back" {
		s += fmt.Sprintf("  | %d of %d back", st.GetReverted(), st.GetRollbackTotal())
	}
	return strings.TrimRight(s, " ")
}

// printRollout prints a rollout's summary and its wave table.
func printRollout(out io.Writer, st *ctrlv1.RolloutStatus) {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	if st.GetRun() == "" {
		fmt.Fprintf(w, "Rollout:\tnone yet (%s)\n", st.GetState())
		w.Flush()
		return
	}
	fmt.Fprintf(w, "Rollout:\t%s (%s)\n", st.GetRun(), st.GetState())
	fmt.Fprintf(w, "Image:\t%s\n", st.GetImage())
	if len(st.GetWaves()) > 0 {
		fmt.Fprintf(w, "Progress:\twave %d/%d; %d of %d sentinels ready, %d failed\n", st.GetCurrentWave(), len(st.GetWaves()), st.GetSucceeded(), st.GetTotal(), st.GetFailed())
	}
	if st.GetMessage() != "" {
		fmt.Fprintf(w, "Message:\t%s\n", st.GetMessage())
	}
	if len(st.GetFailedIds()) > 0 {
		fmt.Fprintf(w, "Failed:\t%s\n", strings.Join(st.GetFailedIds(), ", "))
	}
	if st.GetRollbackTotal() > 0 {
		fmt.Fprintf(w, "Rollback:\t%d of %d touched sentinels back\n", st.GetReverted(), st.GetRollbackTotal())
	}
	w.Flush()
	if len(st.GetWaves()) == 0 {
		return
	}
	w = tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "WAVE\tUP TO\tSIZE\tREADY\tFAILED\tSTATE\tPROGRESS")
	for _, wv := range st.GetWaves() {
		fmt.Fprintf(w, "%d\t%d%%\t%d\t%d\t%d\t%s\t%s\n", wv.GetIndex(), wv.GetPercentage(), wv.GetSize(), wv.GetSucceeded(), wv.GetFailed(), wv.GetState(), bar(wv))
	}
	w.Flush()
}

// bar: "[#######x....]", ready '#', failed 'x', the rest '.'.
func bar(w *ctrlv1.Wave) string {
	const width = 20
	if w.GetSize() == 0 {
		return ""
	}
	ready := int(w.GetSucceeded()) * width / int(w.GetSize())
	failed := (int(w.GetSucceeded()+w.GetFailed()) * width / int(w.GetSize())) - ready
	if w.GetFailed() > 0 && failed == 0 {
		failed, ready = 1, min(ready, width-1)
	}
	return "[" + strings.Repeat("#", ready) + strings.Repeat("x", failed) + strings.Repeat(".", width-ready-failed) + "]"
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
