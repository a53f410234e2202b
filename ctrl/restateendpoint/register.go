package restateendpoint

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	restate "github.com/restatedev/sdk-go"
)

// Registration actions.
const (
	// RegisterUnchanged: Restate already routes every one of our services
	// to this URL with the same handlers; nothing was sent.
	RegisterUnchanged = "unchanged"
	// RegisterCreated: the URL was new to Restate and is now registered.
	RegisterCreated = "registered"
	// RegisterForced: the URL was known but stale (other handlers, or
	// another deployment took over a service); it was re-discovered with
	// force.
	RegisterForced = "forced"
)

// RegisterResult says what Register did and why.
type RegisterResult struct {
	Action       string
	DeploymentID string
	Reason       string
	// Newer, when set, is a deployment of a newer ctrl line that takes
	// the new invocations: this endpoint keeps serving only what is pinned
	// to it, until it is drained.
	Newer string
}

// RegisterOptions tune Register.
type RegisterOptions struct {
	// Force re-discovers the endpoint even when nothing looks different.
	Force bool
	// HTTPClient talks to the admin API; default: 10 s timeout.
	HTTPClient *http.Client
}

// Register makes Restate (admin API at adminURL) route services to the
// endpoint at endpointURL, idempotently:
//
//   - a URL Restate does not know is registered (no force);
//   - a known URL whose services and handlers match ours, and which is the
//     deployment Restate uses for each of our services, is left alone;
//   - a known URL whose services Restate sends to a deployment of a newer
//     ctrl line (LineOf) is left alone: during a roll the older line only
//     finishes what is pinned to it;
//   - otherwise the URL is registered again with force. Restate keeps a
//     known URL's old schema when it is registered without force (new
//     handlers would answer 404), and a URL registered before another
//     deployment of the same services (of an older line, or of none)
//     stays in the shadow of the newer one; force fixes both.
//
// A new URL never touches the deployments of other URLs: invocations
// pinned to them finish on their code (versions.go). Force re-discovers in
// place: invocations already running on this URL continue on the new
// code, so only backward-compatible handler changes (a patch release of
// the line) belong in an in-place upgrade.
func Register(ctx context.Context, adminURL, endpointURL string, services []restate.ServiceDefinition, o RegisterOptions) (RegisterResult, error) {
	c := o.HTTPClient
	if c == nil {
		c = &http.Client{Timeout: 10 * time.Second}
	}
	admin := strings.TrimRight(adminURL, "/")
	want := normalizeURL(endpointURL)

	var list struct {
		Deployments []struct {
			ID  string `json:"id"`
			URI string `json:"uri"`
		} `json:"deployments"`
	}
	if err := adminJSON(ctx, c, http.MethodGet, admin+"/deployments", nil, &list); err != nil {
		return RegisterResult{}, err
	}
	id := ""
	uris := map[string]string{}
	for _, d := range list.Deployments {
		uris[d.ID] = d.URI
		if normalizeURL(d.URI) == want {
			id = d.ID
		}
	}
	if id == "" {
		got, err := post(ctx, c, admin, endpointURL, false)
		return RegisterResult{Action: RegisterCreated, DeploymentID: got, Reason: "Restate did not know this endpoint"}, err
	}

	reason, newer, err := staleness(ctx, c, admin, id, want, uris, services)
	if err != nil {
		return RegisterResult{}, err
	}
	if (newer != "" || reason == "") && !o.Force {
		return RegisterResult{Action: RegisterUnchanged, DeploymentID: id, Newer: newer}, nil
	}
	switch {
	case newer != "":
		reason = "forced by the caller over the newer line's deployment " + newer + " (a rollback): new invocations come here again"
	case reason == "":
		reason = "forced by the caller"
	}
	got, err := post(ctx, c, admin, endpointURL, true)
	return RegisterResult{Action: RegisterForced, DeploymentID: got, Reason: reason}, err
}

// staleness says why Restate's view of deployment id (at URL ours)
// differs from the services we serve ("" when it does not), and names a
// deployment of a newer line that takes our services' new invocations:
// then nothing is stale (re-registering with force would take the new
// invocations back from the newer line), whatever the handlers say.
func staleness(ctx context.Context, c *http.Client, admin, id, ours string, uris map[string]string, services []restate.ServiceDefinition) (reason, newer string, err error) {
	var active struct {
		Services []struct {
			Name         string `json:"name"`
			DeploymentID string `json:"deployment_id"`
		} `json:"services"`
	}
	if err := adminJSON(ctx, c, http.MethodGet, admin+"/services", nil, &active); err != nil {
		return "", "", err
	}
	for _, s := range services {
		for _, a := range active.Services {
			if a.Name != s.Name() || a.DeploymentID == id {
				continue
			}
			if other := uris[a.DeploymentID]; newerLine(LineOf(other), LineOf(ours)) {
				return "", a.DeploymentID + " (" + other + ")", nil
			}
			if reason == "" {
				reason = fmt.Sprintf("Restate sends new %s invocations to deployment %s, registered after this endpoint", s.Name(), a.DeploymentID)
			}
		}
	}
	if reason != "" {
		return reason, "", nil
	}

	var dep struct {
		Services []struct {
			Name     string `json:"name"`
			Ty       string `json:"ty"`
			Handlers []struct {
				Name   string `json:"name"`
				Ty     string `json:"ty"`
				Public *bool  `json:"public"`
			} `json:"handlers"`
		} `json:"services"`
	}
	if err := adminJSON(ctx, c, http.MethodGet, admin+"/deployments/"+id, nil, &dep); err != nil {
		return "", "", err
	}
	var theirs []string
	for _, s := range dep.Services {
		for _, h := range s.Handlers {
			theirs = append(theirs, handlerSig(s.Name, s.Ty, h.Name, h.Ty, h.Public != nil && !*h.Public))
		}
	}
	sig := Signature(services)
	slices.Sort(theirs)
	if !slices.Equal(sig, theirs) {
		return fmt.Sprintf("handlers differ: Restate has %v, this ctrl serves %v", theirs, sig), "", nil
	}
	return "", "", nil
}

// Signature lists services' handlers as "Service(kind).handler(kind)",
// sorted, in the admin API's spelling of kinds, lower-cased, with
// " private" for a handler Restate's ingress may not call (an upgrade that
// hides handlers must reach Restate, as one that changes them).
func Signature(services []restate.ServiceDefinition) []string {
	var out []string
	for _, s := range services {
		for name, h := range s.Handlers() {
			ty := ""
			if t := h.HandlerType(); t != nil {
				ty = string(*t)
			}
			private := s.GetOptions().IngressPrivate != nil && *s.GetOptions().IngressPrivate
			if p := h.GetOptions().IngressPrivate; p != nil {
				private = *p
			}
			out = append(out, handlerSig(s.Name(), string(s.Type()), name, ty, private))
		}
	}
	slices.Sort(out)
	return out
}

// handlerSig normalises the SDK's "VIRTUAL_OBJECT"/"EXCLUSIVE" and the
// admin API's "VirtualObject"/"Exclusive" to one spelling. Handlers of a
// plain service have no kind of their own; theirs is "" on both sides.
func handlerSig(service, serviceTy, handler, handlerTy string, private bool) string {
	norm := func(s string) string { return strings.ToLower(strings.ReplaceAll(s, "_", "")) }
	st, ht := norm(serviceTy), norm(handlerTy)
	if st == "service" {
		ht = ""
	}
	sig := fmt.Sprintf("%s(%s).%s(%s)", service, st, handler, ht)
	if private {
		sig += " private"
	}
	return sig
}

func normalizeURL(u string) string { return strings.TrimRight(strings.TrimSpace(u), "/") }

func post(ctx context.Context, c *http.Client, admin, uri string, force bool) (string, error) {
	var out struct {
		ID string `json:"id"`
	}
	body := map[string]any{"uri": uri, "force": force}
	if err := adminJSON(ctx, c, http.MethodPost, admin+"/deployments", body, &out); err != nil {
		return "", fmt.Errorf("register the Restate endpoint %s: %w", uri, err)
	}
	return out.ID, nil
}

func adminJSON(ctx context.Context, c *http.Client, method, url string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, body)
	if err != nil {
		return fmt.Errorf("the Restate admin API: %w", err)
	}
	req.Header.Set("accept", "application/json")
	if in != nil {
		req.Header.Set("content-type", "application/json")
	}
	resp, err := c.Do(req)
	if err != nil {
		return fmt.Errorf("the Restate admin API %s %s: %w (is restate.admin_url right and Restate up?)", method, url, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("the Restate admin API %s %s: %s: %s", method, url, resp.Status, bytes.TrimSpace(data))
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return fmt.Errorf("the Restate admin API %s %s: unexpected answer: %w", method, url, err)
		}
	}
	return nil
}
