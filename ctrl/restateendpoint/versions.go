package restateendpoint

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	restate "github.com/restatedev/sdk-go"
	"golang.org/x/mod/semver"
)

// Releases of ctrl meet in Restate as deployments (docs/compatibility.md,
// "Workflows across an upgrade"). Restate pins every invocation to the
// deployment it started on and sends its retries and resumptions there
// only, so a journal is only ever replayed by the code that wrote it. Each
// minor line of ctrl therefore registers a deployment of its own: it
// serves its services under the path of its line (Base, "/v0.2") at
// restate.endpoint.url, and registering it leaves the deployments of other
// lines alone. A newer line takes new invocations over from an older one
// (Register); the older one keeps running what it started until it is
// drained (Deployments: nothing pinned to it runs any more), and only then
// is it removed (RemoveDrained, `ctrl restate drain`) and its replicas
// stopped. Patch releases of a line share its deployment and upgrade it in
// place, so they must not change a handler's steps.

// Base is the path under which a ctrl of version v serves its Restate
// services: "/" and its minor line ("/v0.2"). A build with no version
// ("dev") serves at the root, as releases before versioned deployments
// (v0.1) did.
func Base(v string) string {
	if !semver.IsValid(v) {
		return ""
	}
	return "/" + semver.MajorMinor(v)
}

// LineOf is the ctrl line a deployment's URI names ("v0.2"), or "" for a
// deployment served at a root (v0.1, or a build with no version).
func LineOf(uri string) string {
	u, err := url.Parse(strings.TrimSpace(uri))
	if err != nil {
		return ""
	}
	last := u.Path[strings.LastIndex(strings.TrimRight(u.Path, "/"), "/")+1:]
	last = strings.TrimRight(last, "/")
	if semver.IsValid(last) && semver.MajorMinor(last) == last {
		return last
	}
	return ""
}

// newerLine reports whether line a is newer than line b; a line beats no
// line (a root deployment predates versioned ones).
func newerLine(a, b string) bool {
	switch {
	case a == "":
		return false
	case b == "":
		return true
	}
	return semver.Compare(a, b) > 0
}

// mount serves h under base: requests for base/... reach h with the base
// cut from their path (the SDK routes on the request URI, and Restate's
// request identity names the path below the deployment's URI, so the
// signature still checks). A request for another base (a deployment of
// another line that Restate reached through a Service shared across
// lines) is refused, never run on this line's code, and reported.
func mount(base string, h http.Handler, misrouted func(got string)) http.Handler {
	if base == "" {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rest, ok := strings.CutPrefix(r.RequestURI, base)
		if ok && (rest == "" || rest[0] == '/' || rest[0] == '?') {
			r2 := r.Clone(r.Context())
			r2.RequestURI = rest
			r2.URL.Path = strings.TrimPrefix(r.URL.Path, base)
			r2.URL.RawPath = ""
			h.ServeHTTP(w, r2)
			return
		}
		if r.RequestURI == "/health" {
			h.ServeHTTP(w, r)
			return
		}
		got := r.RequestURI
		if i := strings.Index(got[1:], "/"); i >= 0 {
			got = got[:i+1]
		}
		if misrouted != nil {
			misrouted(got)
		}
		http.Error(w, fmt.Sprintf("this ctrl serves the Restate deployment at %s, not %s: Restate reached a replica of another ctrl line; keep that line's replicas, behind a Service of their own, until `ctrl restate drain` says its deployment is drained (docs/compatibility.md)", base, got), http.StatusNotFound)
	})
}

// Deployment is a Restate deployment serving some of ctrl's services.
type Deployment struct {
	ID, URI string
	// Line is the ctrl line its URI names ("" for a root deployment).
	Line string
	// Latest are the services whose new invocations Restate sends to it.
	Latest []string
	// Pinned counts the invocations pinned to it that have not completed
	// (running, suspended, backing off, paused); Running names up to ten
	// of them (service/key/handler) for the operator.
	Pinned  int
	Running []string
}

// Drained reports whether nothing runs on the deployment and no new
// invocation would start there: it may be removed, and its replicas
// stopped.
func (d Deployment) Drained() bool { return d.Pinned == 0 && len(d.Latest) == 0 }

// Deployments lists the Restate deployments that serve any of services,
// with what is pinned to each.
func Deployments(ctx context.Context, adminURL string, services []restate.ServiceDefinition, c *http.Client) ([]Deployment, error) {
	if c == nil {
		c = &http.Client{Timeout: 10 * time.Second}
	}
	admin := strings.TrimRight(adminURL, "/")
	ours := map[string]bool{}
	for _, s := range services {
		ours[s.Name()] = true
	}
	var list struct {
		Deployments []struct {
			ID       string `json:"id"`
			URI      string `json:"uri"`
			Services []struct {
				Name string `json:"name"`
			} `json:"services"`
		} `json:"deployments"`
	}
	if err := adminJSON(ctx, c, http.MethodGet, admin+"/deployments", nil, &list); err != nil {
		return nil, err
	}
	var active struct {
		Services []struct {
			Name         string `json:"name"`
			DeploymentID string `json:"deployment_id"`
		} `json:"services"`
	}
	if err := adminJSON(ctx, c, http.MethodGet, admin+"/services", nil, &active); err != nil {
		return nil, err
	}
	latest := map[string][]string{}
	for _, s := range active.Services {
		if ours[s.Name] {
			latest[s.DeploymentID] = append(latest[s.DeploymentID], s.Name)
		}
	}
	pinned, err := pinnedInvocations(ctx, c, admin)
	if err != nil {
		return nil, err
	}
	var out []Deployment
	for _, d := range list.Deployments {
		serves := false
		for _, s := range d.Services {
			serves = serves || ours[s.Name]
		}
		if !serves {
			continue
		}
		dep := Deployment{ID: d.ID, URI: d.URI, Line: LineOf(d.URI), Latest: latest[d.ID]}
		slices.Sort(dep.Latest)
		for _, inv := range pinned[d.ID] {
			dep.Pinned++
			if len(dep.Running) < 10 {
				dep.Running = append(dep.Running, inv)
			}
		}
		out = append(out, dep)
	}
	slices.SortFunc(out, func(a, b Deployment) int { return strings.Compare(a.Line+a.ID, b.Line+b.ID) })
	return out, nil
}

// pinnedInvocations reads, per deployment, the invocations pinned to it
// (or running their first attempt there) that have not completed, from
// Restate's SQL introspection. A partition
// not yet known to the node answers an error for a moment after a
// restart: the query is tried a few times.
func pinnedInvocations(ctx context.Context, c *http.Client, admin string) (map[string][]string, error) {
	// An invocation in its first attempt may show no pinned deployment
	// yet, only the deployment that attempt runs on: it counts there.
	q := map[string]string{"query": "SELECT COALESCE(pinned_deployment_id, last_attempt_deployment_id) AS pinned_deployment_id, target, status FROM sys_invocation " +
		"WHERE status != 'completed' AND (pinned_deployment_id IS NOT NULL OR last_attempt_deployment_id IS NOT NULL)"}
	var res struct {
		Rows []struct {
			Deployment string `json:"pinned_deployment_id"`
			Target     string `json:"target"`
			Status     string `json:"status"`
		} `json:"rows"`
	}
	var err error
	for attempt := range 10 {
		if err = adminJSON(ctx, c, http.MethodPost, admin+"/query", q, &res); err == nil {
			break
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(time.Duration(attempt+1) * 200 * time.Millisecond):
		}
	}
	if err != nil {
		return nil, fmt.Errorf("count the invocations pinned to each deployment: %w", err)
	}
	out := map[string][]string{}
	for _, r := range res.Rows {
		out[r.Deployment] = append(out[r.Deployment], r.Target+" ("+r.Status+")")
	}
	return out, nil
}

// RemoveDrained removes from Restate the deployments of ctrl's services
// that are drained (Deployment.Drained) other than keepURI (this ctrl's
// own), and returns them. A deployment with invocations pinned to it, or
// that Restate still sends new invocations to, is never removed: its
// replicas must keep serving until it drains.
func RemoveDrained(ctx context.Context, adminURL, keepURI string, services []restate.ServiceDefinition, c *http.Client) (removed, remaining []Deployment, err error) {
	if c == nil {
		c = &http.Client{Timeout: 10 * time.Second}
	}
	deps, err := Deployments(ctx, adminURL, services, c)
	if err != nil {
		return nil, nil, err
	}
	admin := strings.TrimRight(adminURL, "/")
	for _, d := range deps {
		if normalizeURL(d.URI) == normalizeURL(keepURI) || !d.Drained() {
			remaining = append(remaining, d)
			continue
		}
		// Restate removes a deployment only with force; the check above is
		// what makes it safe.
		if err := adminJSON(ctx, c, http.MethodDelete, admin+"/deployments/"+url.PathEscape(d.ID)+"?force=true", nil, nil); err != nil {
			return removed, remaining, fmt.Errorf("remove drained deployment %s (%s): %w", d.ID, d.URI, err)
		}
		removed = append(removed, d)
	}
	return removed, remaining, nil
}
