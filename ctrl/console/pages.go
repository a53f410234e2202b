package console

import (
	"context"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"krane.dev/ctrl/fleetapi"
	ctrlv1 "krane.dev/proto/krane/ctrl/v1"
)

// streaming reports whether the request is a page's live stream (which
// re-reads only what its live region shows).
func streaming(r *http.Request) bool {
	return strings.Contains(r.Header.Get("Accept"), "text/event-stream")
}

type fleetPage struct {
	Regions                  []fleetRegion
	Clusters, Silent, Behind int
}

type fleetRegion struct {
	Name     string
	Clusters []fleetCluster
}

type fleetCluster struct {
	*ctrlv1.ClusterInfo
	// Heartbeat is up, silent or never.
	Heartbeat   string
	HeartbeatAt time.Time
	Behind      bool
	ApplyErrors int
}

func (c *Console) loadFleet(ctx context.Context, _ *http.Request) (any, error) {
	resp, err := fleetapi.ListAll(ctx, c.fleet, "")
	if err != nil {
		return nil, err
	}
	return fleetView(resp.GetClusters(), time.Now()), nil
}

func fleetView(clusters []*ctrlv1.ClusterInfo, now time.Time) fleetPage {
	var p fleetPage
	for _, ci := range clusters {
		fc := fleetCluster{ClusterInfo: ci, Heartbeat: "never"}
		if hb := ci.GetLastHeartbeatAt(); hb != nil {
			fc.HeartbeatAt = hb.AsTime()
			// Live is the aggregation rule's (ctrl/actual): a silent
			// cluster is one no deploy waits for.
			fc.Heartbeat = "up"
			if !ci.GetLive() {
				fc.Heartbeat = "silent"
			}
		}
		for _, k := range ci.GetKinds() {
			fc.Behind = fc.Behind || k.GetBehind()
			fc.ApplyErrors += int(k.GetApplyErrors())
		}
		if len(p.Regions) == 0 || p.Regions[len(p.Regions)-1].Name != ci.GetRegion() {
			p.Regions = append(p.Regions, fleetRegion{Name: ci.GetRegion()})
		}
		reg := &p.Regions[len(p.Regions)-1]
		reg.Clusters = append(reg.Clusters, fc)
		p.Clusters++
		if fc.Heartbeat != "up" {
			p.Silent++
		}
		if fc.Behind {
			p.Behind++
		}
	}
	return p
}

type deploymentsPage struct {
	Environments []string
	Environment  string
	Deployments  []*ctrlv1.DeploymentInfo
	// Next is the URL of the next (older) page, Newest of the first.
	Next, Newest string
	// Regions the new-deployment form offers (the fleet's), and the form's
	// idempotency key: submitting it twice creates one deployment.
	Regions        []string
	IdempotencyKey string
}

func (c *Console) loadDeployments(ctx context.Context, r *http.Request) (any, error) {
	q := r.URL.Query()
	p := deploymentsPage{Environment: strings.TrimSpace(q.Get("environment"))}
	var errs []error
	if !streaming(r) {
		p.IdempotencyKey = randomToken()
		regions, err := c.regions(ctx)
		p.Regions = regions
		errs = append(errs, err)
		envs, err := c.environments(ctx)
		if p.Environment != "" && !slices.Contains(envs, p.Environment) {
			envs = append(envs, p.Environment)
			sort.Strings(envs)
		}
		p.Environments = envs
		errs = append(errs, err)
	}
	if p.Environment != "" {
		resp, err := c.deploys.ListDeployments(ctx, &ctrlv1.ListDeploymentsRequest{EnvironmentId: p.Environment, PageToken: q.Get("page")})
		if err == nil {
			p.Deployments = resp.GetDeployments()
			if t := resp.GetNextPageToken(); t != "" {
				p.Next = "/deployments?" + url.Values{"environment": {p.Environment}, "page": {t}}.Encode()
			}
			if q.Get("page") != "" {
				p.Newest = "/deployments?" + url.Values{"environment": {p.Environment}}.Encode()
			}
		}
		errs = append(errs, err)
	}
	return p, firstError(errs...)
}

// deploymentsIndex sends /deployments without an environment to the first
// environment that has sentinels, so that the address (which the live
// stream and a reload use) names what the page shows.
func (c *Console) deploymentsIndex(page http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("environment") != "" || streaming(r) {
			page(w, r)
			return
		}
		s, err := c.sessions.get(r)
		if s == nil || err != nil {
			page(w, r) // sends the browser to sign in, or says why not
			return
		}
		ctx, cancel := c.callCtx(r.Context(), s)
		envs, err := c.environments(ctx)
		cancel()
		if err != nil || len(envs) == 0 {
			page(w, r) // shows the error, or that there is no environment yet
			return
		}
		http.Redirect(w, r, "/deployments?"+url.Values{"environment": {envs[0]}}.Encode(), http.StatusSeeOther)
	}
}

// regions are the regions of the fleet's clusters.
func (c *Console) regions(ctx context.Context) ([]string, error) {
	resp, err := fleetapi.ListAll(ctx, c.fleet, "")
	if err != nil {
		return nil, err
	}
	var out []string
	for _, ci := range resp.GetClusters() {
		if !slices.Contains(out, ci.GetRegion()) {
			out = append(out, ci.GetRegion())
		}
	}
	return out, nil
}

// environmentScan bounds how many sentinels are read to find the
// environments (every deployed environment has a sentinel per region).
const environmentScan = 5000

// environments are the environments that have sentinels, sorted.
func (c *Console) environments(ctx context.Context) ([]string, error) {
	seen := map[string]bool{}
	token := ""
	for read := 0; read < environmentScan; {
		resp, err := c.sentinels.ListSentinels(ctx, &ctrlv1.ListSentinelsRequest{PageSize: 500, PageToken: token})
		if err != nil {
			return nil, err
		}
		for _, s := range resp.GetSentinels() {
			seen[s.GetEnvironmentId()] = true
		}
		read += len(resp.GetSentinels())
		if token = resp.GetNextPageToken(); token == "" {
			break
		}
	}
	out := make([]string, 0, len(seen))
	for e := range seen {
		out = append(out, e)
	}
	sort.Strings(out)
	return out, nil
}

type deploymentPage struct {
	D        *ctrlv1.DeploymentInfo
	Timeline []timelineEvent
	// Terminal: the deployment will not change by itself any more.
	Terminal bool
}

func (c *Console) loadDeployment(ctx context.Context, r *http.Request) (any, error) {
	d, err := c.deploys.GetDeployment(ctx, &ctrlv1.GetDeploymentRequest{DeploymentId: r.PathValue("id")})
	if err != nil {
		return nil, err
	}
	st := d.GetStatus()
	return deploymentPage{D: d, Timeline: deploymentTimeline(d), Terminal: st == ctrlv1.DeploymentStatus_DEPLOYMENT_STATUS_READY ||
		st == ctrlv1.DeploymentStatus_DEPLOYMENT_STATUS_FAILED || st == ctrlv1.DeploymentStatus_DEPLOYMENT_STATUS_STOPPED}, nil
}

// timelineEvent is one step of a deploy, with its time.
type timelineEvent struct {
	At      time.Time
	Status  string
	Message string
}

// deploymentTimeline is a deploy's recorded history (every status change
// and what the workflow noted on the way, each with its time), oldest
// first. A deployment without recorded history (rows written before
// history was kept) shows its creation and the status it is at now.
func deploymentTimeline(d *ctrlv1.DeploymentInfo) []timelineEvent {
	if h := d.GetHistory(); len(h) > 0 {
		out := make([]timelineEvent, 0, len(h))
		for _, e := range h {
			out = append(out, timelineEvent{At: e.GetAt().AsTime(), Status: statusName(e.GetStatus()), Message: e.GetMessage()})
		}
		return out
	}
	created := timelineEvent{At: d.GetCreatedAt().AsTime(), Status: "pending", Message: "created"}
	if d.GetRolledBackFrom() != "" {
		created.Message = "created by a rollback from " + d.GetRolledBackFrom()
	}
	out := []timelineEvent{created}
	if st := statusName(d.GetStatus()); st != "pending" {
		out = append(out, timelineEvent{At: d.GetUpdatedAt().AsTime(), Status: st, Message: d.GetError()})
	}
	return out
}

type sentinelsPage struct {
	Region, Environment string
	Regions             []sentinelRegion
	Count               int
	Next, First         string
}

type sentinelRegion struct {
	Name      string
	Sentinels []*ctrlv1.SentinelInfo
}

func (c *Console) loadSentinels(ctx context.Context, r *http.Request) (any, error) {
	q := r.URL.Query()
	p := sentinelsPage{Region: strings.TrimSpace(q.Get("region")), Environment: strings.TrimSpace(q.Get("environment"))}
	resp, err := c.sentinels.ListSentinels(ctx, &ctrlv1.ListSentinelsRequest{
		Region: p.Region, EnvironmentId: p.Environment, PageSize: 200, PageToken: q.Get("page"),
	})
	if err != nil {
		return p, err
	}
	p.Regions = byRegion(resp.GetSentinels())
	p.Count = len(resp.GetSentinels())
	filter := url.Values{}
	if p.Region != "" {
		filter.Set("region", p.Region)
	}
	if p.Environment != "" {
		filter.Set("environment", p.Environment)
	}
	if t := resp.GetNextPageToken(); t != "" {
		next := url.Values{"page": {t}}
		for k, v := range filter {
			next[k] = v
		}
		p.Next = "/sentinels?" + next.Encode()
	}
	if q.Get("page") != "" {
		p.First = "/sentinels?" + filter.Encode()
	}
	return p, nil
}

// byRegion groups sentinels by region, regions sorted, each region's
// sentinels in the API's (id) order.
func byRegion(list []*ctrlv1.SentinelInfo) []sentinelRegion {
	idx := map[string]int{}
	var out []sentinelRegion
	for _, s := range list {
		i, ok := idx[s.GetRegion()]
		if !ok {
			i = len(out)
			idx[s.GetRegion()] = i
			out = append(out, sentinelRegion{Name: s.GetRegion()})
		}
		out[i].Sentinels = append(out[i].Sentinels, s)
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Name < out[b].Name })
	return out
}

type rolloutsPage struct {
	Status    *ctrlv1.RolloutStatus
	Waves     []waveBar
	Sentinels []rolloutSentinel
	// More: the fleet has more sentinels than the page lists.
	More                              bool
	CanResume, CanCancel, CanRollback bool
	Active                            bool
	DefaultWaves                      string
}

// waveBar is one wave's segment of the rollout bar, in percent of the
// bar's width.
type waveBar struct {
	*ctrlv1.Wave
	X, W, DoneW, FailW float64
}

// rolloutSentinel is a sentinel as the rollout sees it.
type rolloutSentinel struct {
	*ctrlv1.SentinelInfo
	// Failed in this rollout; OnImage: desired on the rollout's image.
	Failed, OnImage bool
}

// rolloutSentinelsShown bounds the sentinels the Rollouts page lists (the
// Sentinels page pages through all of them).
const rolloutSentinelsShown = 500

func (c *Console) loadRollouts(ctx context.Context, _ *http.Request) (any, error) {
	p := rolloutsPage{DefaultWaves: "1,5,25,50,100"}
	st, err := c.rollouts.GetRolloutStatus(ctx, &ctrlv1.GetRolloutStatusRequest{})
	if err != nil {
		return p, err
	}
	p.Status = st
	state := st.GetState()
	p.Active = state == "in_progress" || state == "paused" || state == "rolling_back"
	p.CanResume = state == "paused"
	p.CanCancel = state == "in_progress" || state == "paused"
	p.CanRollback = state == "paused" || state == "cancelled"
	p.Waves = waveBars(st)
	resp, err := c.sentinels.ListSentinels(ctx, &ctrlv1.ListSentinelsRequest{PageSize: rolloutSentinelsShown})
	if err != nil {
		return p, err
	}
	p.More = resp.GetNextPageToken() != ""
	failed := map[string]bool{}
	for _, id := range st.GetFailedIds() {
		failed[id] = true
	}
	for _, s := range resp.GetSentinels() {
		p.Sentinels = append(p.Sentinels, rolloutSentinel{SentinelInfo: s, Failed: failed[s.GetId()], OnImage: st.GetImage() != "" && s.GetImage() == st.GetImage()})
	}
	return p, nil
}

// waveBars lays the waves out on a bar of width 100, each as wide as its
// share of the rollout's sentinels (its percentage step when the rollout
// is empty), with the share of its sentinels done and failed.
func waveBars(st *ctrlv1.RolloutStatus) []waveBar {
	var out []waveBar
	x, prevPct := 0.0, int32(0)
	for _, w := range st.GetWaves() {
		width := float64(w.GetPercentage() - prevPct)
		if total := st.GetTotal(); total > 0 {
			width = 100 * float64(w.GetSize()) / float64(total)
		}
		prevPct = w.GetPercentage()
		b := waveBar{Wave: w, X: x, W: width}
		if size := w.GetSize(); size > 0 {
			b.DoneW = width * float64(w.GetSucceeded()) / float64(size)
			b.FailW = width * float64(w.GetFailed()) / float64(size)
		}
		out = append(out, b)
		x += width
	}
	return out
}

type resourcesPage struct {
	Kinds       []ResourceKind
	Kind        string
	Items       []Resource
	Next, First string
}

func (c *Console) loadResources(ctx context.Context, r *http.Request) (any, error) {
	p := resourcesPage{Kind: strings.TrimSpace(r.URL.Query().Get("kind"))}
	kinds, err := c.resources.Kinds(ctx)
	if err != nil {
		return p, err
	}
	p.Kinds = kinds
	if p.Kind == "" && len(kinds) > 0 {
		p.Kind = kinds[0].Name
	}
	if p.Kind == "" {
		return p, nil
	}
	page, err := c.resources.List(ctx, p.Kind, r.URL.Query().Get("page"))
	if err != nil {
		return p, err
	}
	p.Items = page.Items
	if page.NextPageToken != "" {
		p.Next = "/resources?" + url.Values{"kind": {p.Kind}, "page": {page.NextPageToken}}.Encode()
	}
	if r.URL.Query().Get("page") != "" {
		p.First = "/resources?" + url.Values{"kind": {p.Kind}}.Encode()
	}
	return p, nil
}

// firstError is the first non-nil error, preferring a refused token (which
// ends the session) over anything else.
func firstError(errs ...error) error {
	var first error
	for _, err := range errs {
		if err == nil {
			continue
		}
		if status.Code(err) == codes.Unauthenticated {
			return err
		}
		if first == nil {
			first = err
		}
	}
	return first
}
