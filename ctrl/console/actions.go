package console

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	clusterv1 "krane.dev/proto/krane/cluster/v1"
	ctrlv1 "krane.dev/proto/krane/ctrl/v1"
)

// confirmation is the page a destructive action shows before it runs.
type confirmation struct {
	Question string
	Details  []string
	// Extra are hidden fields the confirmed form adds (e.g. an
	// idempotency key made once, here).
	Extra map[string]string

	// Set by action: where the confirmed form posts, what it re-posts,
	// where "back" goes.
	Action string
	Fields []formField
	Back   string
}

type formField struct{ Name, Value string }

type confirmFunc func(r *http.Request) confirmation

// doFunc runs an action through the operator API and says where to go
// next and what to tell the operator.
type doFunc func(ctx context.Context, r *http.Request) (redirect, done string, err error)

// action serves a form's POST: the session's anti-forgery token first,
// then (for confirm) a confirmation page, then the API call. The outcome
// is shown on the page it redirects to.
func (c *Console) action(name string, confirm confirmFunc, do doFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		r.Body = http.MaxBytesReader(w, r.Body, maxForm)
		s := c.requireSession(w, r)
		if s == nil {
			return
		}
		if err := r.ParseForm(); err != nil {
			http.Error(w, "unreadable form", http.StatusBadRequest)
			return
		}
		if !s.validCSRF(r.PostFormValue("csrf")) {
			c.forged(w, r, s, name)
			return
		}
		back := localPath(r.PostFormValue("back"), "/fleet")
		if confirm != nil && r.PostFormValue("confirmed") != "yes" {
			cf := confirm(r)
			cf.Action, cf.Back, cf.Fields = r.URL.Path, back, repost(r, cf.Extra)
			v := c.newView(r, s, "")
			v.Title = "Confirm"
			v.Page = cf
			c.m.requests.WithLabelValues(name+"-confirm", "200").Inc()
			c.render(w, http.StatusOK, "confirm", v)
			return
		}
		ctx, cancel := c.callCtx(r.Context(), s)
		defer cancel()
		to, done, err := do(ctx, r)
		if msg, refused := authRefusal(err); refused {
			c.m.actions.WithLabelValues(name, "refused").Inc()
			c.refused(w, r, s, msg)
			return
		}
		if err != nil {
			result := "failed"
			switch status.Code(err) {
			case codes.InvalidArgument, codes.FailedPrecondition, codes.NotFound, codes.AlreadyExists, codes.PermissionDenied, codes.OutOfRange:
				result = "refused"
			}
			c.m.actions.WithLabelValues(name, result).Inc()
			c.log.Info("console action refused", "action", name, "token_id", s.tokenID, "remote", r.RemoteAddr, "error", err)
			c.flash(r, s, "error", "ctrl refused the action: "+describe(err))
			c.m.requests.WithLabelValues(name, "303").Inc()
			http.Redirect(w, r, back, http.StatusSeeOther)
			return
		}
		c.m.actions.WithLabelValues(name, "ok").Inc()
		c.log.Info("console action", "action", name, "token_id", s.tokenID, "remote", r.RemoteAddr, "result", done)
		c.flash(r, s, "ok", done)
		c.m.requests.WithLabelValues(name, "303").Inc()
		http.Redirect(w, r, localPath(to, back), http.StatusSeeOther)
	}
}

// flash sets the message the session's next page shows; a message the
// store could not keep is logged.
func (c *Console) flash(r *http.Request, s *session, kind, text string) {
	if err := c.sessions.setFlash(r.Context(), s, kind, text); err != nil {
		c.log.Warn("keeping a console message failed", "token_id", s.tokenID, "error", err)
	}
}

// repost lists the form's fields for the confirmed form to send again,
// without the anti-forgery token (the page adds the session's) and with
// extra (fields already posted win).
func repost(r *http.Request, extra map[string]string) []formField {
	var out []formField
	keys := make([]string, 0, len(r.PostForm))
	for k := range r.PostForm {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if k == "csrf" || k == "confirmed" {
			continue
		}
		for _, v := range r.PostForm[k] {
			out = append(out, formField{Name: k, Value: v})
		}
	}
	extraKeys := make([]string, 0, len(extra))
	for k := range extra {
		extraKeys = append(extraKeys, k)
	}
	sort.Strings(extraKeys)
	for _, k := range extraKeys {
		if !r.PostForm.Has(k) {
			out = append(out, formField{Name: k, Value: extra[k]})
		}
	}
	return out
}

// formInt reads an optional whole number; empty is 0.
func formInt(r *http.Request, field string) (int32, error) {
	v := strings.TrimSpace(r.PostFormValue(field))
	if v == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(v, 10, 32)
	if err != nil {
		return 0, status.Errorf(codes.InvalidArgument, "%s: %q is not a whole number", field, v)
	}
	return int32(n), nil
}

func (c *Console) createDeployment(ctx context.Context, r *http.Request) (string, string, error) {
	replicas, err := formInt(r, "replicas")
	if err != nil {
		return "", "", err
	}
	var regions []string
	for _, reg := range r.PostForm["regions"] {
		if reg = strings.TrimSpace(reg); reg != "" {
			regions = append(regions, reg)
		}
	}
	req := &ctrlv1.CreateDeploymentRequest{
		WorkspaceId: field(r, "workspace"), ProjectId: field(r, "project"), AppId: field(r, "app"),
		EnvironmentId: field(r, "environment"), Workload: &clusterv1.Workload{Image: field(r, "image")}, Regions: regions, Replicas: replicas,
		IdempotencyKey: field(r, "idempotency_key"),
	}
	resp, err := c.deploys.CreateDeployment(ctx, req)
	if err != nil {
		return "", "", err
	}
	id := resp.GetDeploymentId()
	return "/deployments/" + id, fmt.Sprintf("Deployment %s of %s created; its deploy is running and this page follows it.", id, req.GetWorkload().GetImage()), nil
}

func field(r *http.Request, name string) string { return strings.TrimSpace(r.PostFormValue(name)) }

func confirmPromote(r *http.Request) confirmation {
	return confirmation{
		Question: fmt.Sprintf("Make deployment %s the live deployment of environment %s?", r.PathValue("id"), field(r, "environment")),
		Details:  []string{"Traffic of the environment goes to this deployment; the deployment that is live now stays running until it is stopped."},
	}
}

func (c *Console) promote(ctx context.Context, r *http.Request) (string, string, error) {
	id := r.PathValue("id")
	if _, err := c.deploys.Promote(ctx, &ctrlv1.PromoteRequest{DeploymentId: id}); err != nil {
		return "", "", err
	}
	return "/deployments/" + id, fmt.Sprintf("Deployment %s is now live.", id), nil
}

func confirmRollback(r *http.Request) confirmation {
	target := field(r, "target")
	what := "the last ready deployment before the live one"
	if target != "" {
		what = "deployment " + target
	}
	return confirmation{
		Question: fmt.Sprintf("Roll environment %s back to %s?", field(r, "environment"), what),
		Details:  []string{"A new deployment is created with that deployment's configuration, in the regions it ran in; it becomes live when it is ready."},
		Extra:    map[string]string{"idempotency_key": randomToken()},
	}
}

func (c *Console) rollback(ctx context.Context, r *http.Request) (string, string, error) {
	resp, err := c.deploys.Rollback(ctx, &ctrlv1.RollbackRequest{
		EnvironmentId: field(r, "environment"), TargetDeploymentId: field(r, "target"), IdempotencyKey: field(r, "idempotency_key"),
	})
	if err != nil {
		return "", "", err
	}
	id := resp.GetDeploymentId()
	return "/deployments/" + id, fmt.Sprintf("Rollback started: deployment %s restores the earlier configuration; it becomes live when ready.", id), nil
}

// rolloutRequest reads the rollout form.
func rolloutRequest(r *http.Request) (*ctrlv1.StartRolloutRequest, error) {
	req := &ctrlv1.StartRolloutRequest{Image: field(r, "image")}
	for _, part := range strings.FieldsFunc(field(r, "waves"), func(r rune) bool { return r == ',' || r == ' ' || r == '%' }) {
		n, err := strconv.ParseInt(part, 10, 32)
		if err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "waves: %q is not a percentage (want e.g. 1,5,25,50,100)", part)
		}
		req.WavePercentages = append(req.WavePercentages, int32(n))
	}
	var err error
	if req.DeployTimeoutSeconds, err = formInt(r, "deploy_timeout_seconds"); err != nil {
		return nil, err
	}
	if req.BakeSeconds, err = formInt(r, "bake_seconds"); err != nil {
		return nil, err
	}
	return req, nil
}

func confirmRolloutStart(r *http.Request) confirmation {
	waves := field(r, "waves")
	if waves == "" {
		waves = "1, 5, 25, 50, 100 (the default)"
	}
	return confirmation{
		Question: fmt.Sprintf("Roll every running sentinel of every region to %s?", field(r, "image")),
		Details: []string{
			"Waves, in cumulative percent of the sentinels: " + waves + ".",
			"A wave in which any sentinel fails pauses the rollout; you then resume, cancel or roll back.",
		},
	}
}

func (c *Console) startRollout(ctx context.Context, r *http.Request) (string, string, error) {
	req, err := rolloutRequest(r)
	if err != nil {
		return "", "", err
	}
	st, err := c.rollouts.StartRollout(ctx, req)
	if err != nil {
		return "", "", err
	}
	return "/rollouts", fmt.Sprintf("Rollout %s of %s started: %d sentinels in %d waves.", st.GetRun(), st.GetImage(), st.GetTotal(), len(st.GetWaves())), nil
}

func confirmResume(r *http.Request) confirmation {
	if r.PostFormValue("retry_failed") != "" {
		return confirmation{Question: "Resume the rollout, deploying its failed sentinels again first?",
			Details: []string{"The next wave starts only when every retried sentinel is ready."}}
	}
	return confirmation{Question: "Resume the rollout with the next wave, leaving its failed sentinels as they are?",
		Details: []string{"The failed sentinels stay on whatever they run now and count as failed."}}
}

func (c *Console) resumeRollout(ctx context.Context, r *http.Request) (string, string, error) {
	st, err := c.rollouts.ResumeRollout(ctx, &ctrlv1.ResumeRolloutRequest{RetryFailed: r.PostFormValue("retry_failed") != ""})
	if err != nil {
		return "", "", err
	}
	return "/rollouts", fmt.Sprintf("Rollout %s resumed.", st.GetRun()), nil
}

func confirmCancel(*http.Request) confirmation {
	return confirmation{Question: "Cancel the rollout?",
		Details: []string{"No further wave starts. Deploys already sent finish; sentinels keep whatever image they reach. You can roll back afterwards."}}
}

func (c *Console) cancelRollout(ctx context.Context, _ *http.Request) (string, string, error) {
	st, err := c.rollouts.CancelRollout(ctx, &ctrlv1.CancelRolloutRequest{})
	if err != nil {
		return "", "", err
	}
	return "/rollouts", fmt.Sprintf("Rollout %s cancelled.", st.GetRun()), nil
}

func confirmRollbackAll(*http.Request) confirmation {
	return confirmation{Question: "Roll back every sentinel the rollout touched to its previous image?",
		Details: []string{"Sentinels of every wave that started, failed ones included, are deployed back to the image they had before the rollout."}}
}

// rollbackStartWait is how long the console waits for a rollback before
// handing the rest to the live page (RollbackAll answers when every
// sentinel is back, which may take minutes).
const rollbackStartWait = 3 * time.Second

func (c *Console) rollbackAll(ctx context.Context, _ *http.Request) (string, string, error) {
	wctx, cancel := context.WithTimeout(ctx, rollbackStartWait)
	defer cancel()
	resp, err := c.rollouts.RollbackAll(wctx, &ctrlv1.RollbackAllRequest{})
	if status.Code(err) == codes.DeadlineExceeded && ctx.Err() == nil {
		return "/rollouts", "Rollback asked for: the touched sentinels are being deployed back; this page follows it.", nil
	}
	if err != nil {
		return "", "", err
	}
	return "/rollouts", fmt.Sprintf("Rolled back: %d sentinels are on their previous image again.", resp.GetReverted()), nil
}
