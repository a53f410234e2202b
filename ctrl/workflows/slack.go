package workflows

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"

	restate "github.com/restatedev/sdk-go"
)

// slackClient posts rollout notifications to Slack incoming webhooks.
type slackClient struct {
	http *http.Client
}

func newSlackClient() *slackClient {
	return &slackClient{http: &http.Client{Timeout: 5 * time.Second}}
}

// Bounds of one notification: attempts, and the wait before the second.
// A dead webhook delays the handler that sends it by at most ~16 s.
const (
	slackAttempts = 3
	slackBackoff  = 250 * time.Millisecond
)

// notify posts {"text": text} to the rollout's webhook (if it has one) in a
// restate.Run, so a replay does not post again, with bounded retries. A
// failure is logged and otherwise ignored: notifications never fail a
// rollout. Handlers are exclusive and each post completes before the
// handler goes on, so messages arrive in the order of the transitions.
func (r *rollouts) notify(ctx restate.ObjectContext, st *rolloutState, text string) {
	if st.SlackWebhookURL == "" {
		return
	}
	webhook := st.SlackWebhookURL
	_, err := runStep(ctx, r.hooks, rolloutSlack, func(rc restate.RunContext) (restate.Void, error) {
		return restate.Void{}, r.slack.post(rc, webhook, text)
	}, restate.WithMaxRetryAttempts(slackAttempts), restate.WithInitialRetryInterval(slackBackoff))
	if err != nil {
		// ctx.Log: not logged again when the handler replays.
		ctx.Log().Warn("cannot post a rollout notification to Slack; the rollout goes on", "run", st.Run, "text", text, "error", err.Error())
	}
}

func (c *slackClient) post(ctx context.Context, webhook, text string) error {
	body, _ := json.Marshal(map[string]string{"text": text})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, webhook, bytes.NewReader(body))
	if err != nil {
		return restate.ToTerminalError(fmt.Errorf("slack webhook: %w", err))
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("slack webhook: %w", err)
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	switch {
	case resp.StatusCode/100 == 2:
		return nil
	case resp.StatusCode/100 == 4 && resp.StatusCode != http.StatusTooManyRequests:
		// The webhook refuses the message (revoked, wrong URL): retrying
		// cannot help.
		return restate.ToTerminalError(fmt.Errorf("slack webhook answered %s: %s", resp.Status, bytes.TrimSpace(msg)))
	}
	return fmt.Errorf("slack webhook answered %s: %s", resp.Status, bytes.TrimSpace(msg))
}
