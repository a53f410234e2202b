package bench

import (
	"context"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"krane.dev/ctrl/auth"
	ctrlv1 "krane.dev/proto/krane/ctrl/v1"
)

// FleetOptions shape the fleet benchmark: N simulated clusters (each its
// own token, a Watch per kind, heartbeats, status reports) spread over
// regions, against one real ctrl, MariaDB and Restate, while operators
// write at Rate through the deploy API; once per design and fleet size.
type FleetOptions struct {
	// Clusters are the fleet sizes, measured in order.
	Clusters []int
	// Regions the clusters are spread over (cluster i is in region i mod
	// Regions); every cluster of a region follows all of its changes.
	Regions int
	// Rate is operator writes per second (ScaleDeployment), round robin
	// over the regions; RateAt overrides it for a fleet size.
	Rate   float64
	RateAt map[int]float64
	// Window is how long each arm is measured, after a warm-up of a tenth
	// of it (at least 5 s) with the same load.
	Window time.Duration
	// DeploymentsPerRegion are scaled round robin; enough that a
	// deployment is written again only long after the last write of it
	// reached every cluster, so every write is delivered as itself.
	DeploymentsPerRegion int
	// Arms are the designs measured for each size: streaming, polling,
	// streaming-unshared (streams reading for themselves, as before the
	// shared feeds) and streaming-per-report (every report call in a
	// transaction of its own, the reference platform's report path);
	// ArmsAt adds designs at a fleet size.
	Arms   []string
	ArmsAt map[int][]string
	// Seed makes the jitter of a run repeatable.
	Seed uint64
	// StormAt are the fleet sizes whose streaming arm ends with a
	// reconnect storm: ctrl restarts under the whole fleet and operators'
	// writes (FleetRow.Storm).
	StormAt []int
	// ProfileAt are the fleet sizes whose streaming arm runs ctrl with
	// http.pprof and records its CPU, mutex, block and goroutine profiles
	// over the window (into $KRANE_BENCH_PROFILES, or a temporary
	// directory), printing the top of each.
	ProfileAt []int
}

// DefaultFleetOptions are what `make bench-fleet` measures: the growth
// curve of the streaming design up to 10,000 clusters (30,000 streams),
// and at 1,000 clusters both designs with the same report path, plus the
// reference platform's one-transaction-per-report path. The 1,000 row
// runs 20 changes/s, the larger ones 5. A size this machine cannot hold
// is replaced by the largest that fits (see FleetRow.Wanted).
func DefaultFleetOptions() FleetOptions {
	return FleetOptions{Clusters: []int{100, 300, 1000, 3000, 10000}, Regions: 20, Rate: 20, RateAt: map[int]float64{3000: 5, 10000: 5},
		Window: 30 * time.Second, DeploymentsPerRegion: 20, Arms: []string{"streaming"},
		ArmsAt: map[int][]string{1000: {"polling", "streaming-per-report"}}, Seed: 1, StormAt: []int{10000}, ProfileAt: []int{10000}}
}

// rate is the write rate at fleet size n.
func (o FleetOptions) rate(n int) float64 {
	if r, ok := o.RateAt[n]; ok {
		return r
	}
	return o.Rate
}

// arms are the designs measured at fleet size n.
func (o FleetOptions) arms(n int) []string {
	out := slices.Clone(o.Arms)
	for _, a := range o.ArmsAt[n] {
		if !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	return out
}

// FleetRow is one measured arm.
type FleetRow struct {
	Arm      string `json:"arm"`
	Clusters int    `json:"clusters"`
	// Wanted is the size this row stands in for when the machine could not
	// hold it (RanOut says what ran out); 0 otherwise.
	Wanted int    `json:"wanted_clusters,omitempty"`
	RanOut string `json:"ran_out,omitempty"`
	// Rate is the operators' writes per second.
	Rate float64 `json:"changes_per_s"`
	// Writes in the window, deliveries expected (each write times the
	// clusters of its region) and missing after the drain.
	Writes     int `json:"writes"`
	Deliveries int `json:"deliveries"`
	Missing    int `json:"missing"`
	// FailedWrites timed out (30 s) or failed in the deploy API.
	FailedWrites int `json:"failed_writes"`
	// Commit -> delivery at each cluster, ms (from the operator's call,
	// which commits before it returns: an upper bound).
	P50 float64 `json:"p50_ms"`
	P99 float64 `json:"p99_ms"`
	Max float64 `json:"max_ms"`
	// P99Acked is from the call's answer instead (a lower bound).
	P99Acked float64 `json:"p99_from_answer_ms"`
	// API is the ScaleDeployment call itself.
	API    float64 `json:"api_p50_ms"`
	APIp99 float64 `json:"api_p99_ms"`
	CPU    float64 `json:"ctrl_cpu_cores"`
	RSS    float64 `json:"ctrl_rss_mib"` // the most sampled in the window
	DBQ    float64 `json:"db_statements_per_s"`
	// DBByCommand splits them by command (select, insert, update, delete,
	// begin, commit, set_option ...), per second.
	DBByCommand map[string]float64 `json:"db_statements_by_command_per_s"`
	Read        float64            `json:"ctrl_reads_per_s"` // change queries and head polls
	// Streams is the mean number of open desired-state streams.
	Streams      float64 `json:"open_streams"`
	Polls        int64   `json:"polls,omitempty"`
	Reports      int64   `json:"reports"`
	StreamErrors int64   `json:"stream_errors"`
	ReportErrors int64   `json:"report_errors"`
	// Throttled are report calls ctrl refused with RESOURCE_EXHAUSTED (sent
	// again after its hint); Heartbeats those sent in the window.
	Throttled  int64 `json:"reports_throttled"`
	Heartbeats int64 `json:"heartbeats"`
	// HeartbeatErrors are heartbeats in the window that failed (refused
	// or timed out): heartbeats decide which clusters are live.
	HeartbeatErrors int64     `json:"heartbeat_errors"`
	Load            Load      `json:"load"`
	Storm           *StormRow `json:"storm,omitempty"`
	Inside          Inside    `json:"inside_ctrl"`
}

// Inside is what ctrl's own metrics said over the window.
type Inside struct {
	// Goroutines and the queues' depths, the most sampled.
	Goroutines     float64 `json:"goroutines_max"`
	ReportQueue    float64 `json:"report_queue_max"`
	HeartbeatQueue float64 `json:"heartbeat_queue_max"`
	// DBWaits are queries per second that waited for a pool connection,
	// DBWaitSeconds the seconds per second they waited.
	DBWaits       float64 `json:"db_pool_waits_per_s"`
	DBWaitSeconds float64 `json:"db_pool_wait_s_per_s"`
}

// windowInside gathers Inside from scrapes of ctrl's /metrics.
type windowInside struct {
	first, last map[string]float64
	max         Inside
}

func (w *windowInside) observe(m map[string]float64) {
	if w.first == nil {
		w.first = m
	}
	w.last = m
	w.max.Goroutines = max(w.max.Goroutines, sum(m, "go_goroutines"))
	w.max.ReportQueue = max(w.max.ReportQueue, sum(m, "krane_ctrl_ingest_queue_depth", `what="reports"`))
	w.max.HeartbeatQueue = max(w.max.HeartbeatQueue, sum(m, "krane_ctrl_ingest_queue_depth", `what="heartbeats"`))
}

func (w *windowInside) result(d time.Duration) Inside {
	out := w.max
	if w.first != nil && d > 0 {
		out.DBWaits = (sum(w.last, "go_sql_wait_count_total", `db_name="ctrl"`) - sum(w.first, "go_sql_wait_count_total", `db_name="ctrl"`)) / d.Seconds()
		out.DBWaitSeconds = (sum(w.last, "go_sql_wait_duration_seconds_total", `db_name="ctrl"`) - sum(w.first, "go_sql_wait_duration_seconds_total", `db_name="ctrl"`)) / d.Seconds()
	}
	return out
}

// StormRow is the reconnect storm: ctrl restarted under every stream.
type StormRow struct {
	// Seconds from the restart until every stream was back and caught up
	// (its resume announced it had everything up to the head).
	Seconds float64 `json:"seconds"`
	Streams int     `json:"streams"`
	// APIp99 is the operators' ScaleDeployment calls sent meanwhile, ms;
	// FailedWrites those that failed.
	APIp99       float64 `json:"api_p99_ms"`
	Writes       int     `json:"writes"`
	FailedWrites int     `json:"failed_writes"`
	// Rebootstraps are streams that read from cursor 0 again (a resume
	// needs none).
	Rebootstraps int64 `json:"rebootstraps"`
	// NotReady says why ctrl's restart was not ready in time, if it was not.
	NotReady string `json:"not_ready,omitempty"`
}

// Load is what else used the machine while an arm was measured: the
// figures of a loaded machine are not comparable with a quiet one's.
type Load struct {
	LoadAvg1 float64 `json:"loadavg_1m"`
	// Busy is the whole machine's CPU in use (/proc/stat, every process
	// in every container), OtherCores what of it is not ctrl, MariaDB,
	// Restate or the benchmark.
	Busy       float64 `json:"machine_busy_cores"`
	MariaDB    float64 `json:"mariadb_cores"`
	Restate    float64 `json:"restate_cores"`
	Bench      float64 `json:"bench_cores"`
	OtherCores float64 `json:"other_processes_cores"`
	// CtrlWaiting and BenchWaiting are the seconds per second ctrl's and
	// the simulator's threads were runnable but not running (summed
	// /proc/PID/task/*/schedstat): how much the machine, not the process,
	// set the pace.
	CtrlWaiting  float64 `json:"ctrl_runnable_waiting"`
	BenchWaiting float64 `json:"bench_runnable_waiting"`
}

// fleetArm is how each arm runs ctrl and its clusters.
var fleetArms = map[string]struct {
	design  design
	ctrlEnv []string
}{
	"streaming": {streaming, nil},
	// The reference platform's server: a query per poll, pages of 100.
	"polling":            {polling, []string{"CTRL_WATCH_SHARED_READS=false", "CTRL_WATCH_PAGE_SIZE=100"}},
	"streaming-unshared": {streaming, []string{"CTRL_WATCH_SHARED_READS=false"}},
	// The reference platform's report path: a transaction per report call.
	"streaming-per-report": {streaming, []string{"CTRL_REPORTS_BATCHED=false"}},
}

// Fleet runs the fleet benchmark. It restarts ctrl for every arm (so each
// starts with a fresh process and its memory), and returns the figures
// and the table's rows.
func Fleet(ctx context.Context, e *Env, o FleetOptions) ([]Figure, []FleetRow, error) {
	for _, n := range o.Clusters {
		for _, a := range o.arms(n) {
			if _, ok := fleetArms[a]; !ok {
				return nil, nil, fmt.Errorf("fleet: unknown arm %q (streaming, polling, streaming-unshared, streaming-per-report)", a)
			}
		}
	}
	// Each size that this machine cannot hold is replaced by the largest
	// that fits; the fleet is registered once, for the largest size run.
	sizes := make([]int, len(o.Clusters))
	ranOut := make([]string, len(o.Clusters))
	for i, n := range o.Clusters {
		sizes[i], ranOut[i] = n, ""
		if fit, why := largestFleet(n); fit < n {
			sizes[i], ranOut[i] = fit, why
			e.logf("fleet: %d clusters do not fit on this machine (%s): measuring %d instead", n, why, fit)
		}
	}
	f, err := prepareFleet(ctx, e, o, slices.Max(sizes))
	if err != nil {
		return nil, nil, err
	}
	var rows []FleetRow
	done := map[string]bool{}
	for i, want := range o.Clusters {
		n := sizes[i]
		if n <= 0 {
			e.logf("fleet: skipping %d clusters: %s", want, ranOut[i])
			continue
		}
		for _, arm := range o.arms(want) {
			if k := fmt.Sprintf("%s/%d/%g", arm, n, o.rate(want)); done[k] {
				continue // a smaller size already measured it
			} else {
				done[k] = true
			}
			row, err := f.runArm(ctx, n, arm, o.rate(want))
			if err != nil {
				return nil, rows, fmt.Errorf("fleet: %d clusters, %s: %w", n, arm, err)
			}
			if n != want {
				row.Wanted, row.RanOut = want, ranOut[i]
			}
			e.logf("fleet: %s", row.line())
			rows = append(rows, row)
		}
	}
	// Back to the stack's own ctrl settings for whatever runs next.
	e.St.SetCtrlEnv(nil)
	if err := e.St.RestartCtrl(false); err != nil {
		return nil, rows, err
	}
	return fleetFigures(rows), rows, nil
}

// fleet is the prepared fleet: registered clusters and desired state.
type fleet struct {
	e       *Env
	o       FleetOptions
	tokens  []string
	regions []string
	deps    [][]string // per region
	next    map[string]int32
	seq     uint64
}

func prepareFleet(ctx context.Context, e *Env, o FleetOptions, n int) (*fleet, error) {
	f := &fleet{e: e, o: o, next: map[string]int32{}}
	for r := range o.Regions {
		region := fmt.Sprintf("fleet-r%02d", r)
		f.regions = append(f.regions, region)
		prefix := fmt.Sprintf("fl-r%02d", r)
		if err := (bulk{e.Store.DB()}).deployments(ctx, region, "ws-fleet", prefix, o.DeploymentsPerRegion, 1); err != nil {
			return nil, err
		}
		if err := (bulk{e.Store.DB()}).sentinels(ctx, region, "fs-r"+strconv.Itoa(r), 5); err != nil {
			return nil, err
		}
		var ids []string
		for i := range o.DeploymentsPerRegion {
			id := fmt.Sprintf("%s-%05d", prefix, i)
			ids = append(ids, id)
			f.next[id] = 1 // as created: the first write scales to 2
		}
		f.deps = append(f.deps, ids)
	}
	refs := make([]auth.ClusterRef, n)
	for i := range refs {
		refs[i] = auth.ClusterRef{Region: f.regions[i%o.Regions], ClusterID: fmt.Sprintf("fleet-c%05d", i)}
	}
	begin := time.Now()
	tokens, err := auth.RegisterClusters(ctx, e.Store, refs)
	if err != nil {
		return nil, err
	}
	e.logf("fleet: registered %d clusters in %d regions in %s (one transaction)", n, o.Regions, time.Since(begin).Round(time.Millisecond))
	f.tokens = tokens
	return f, nil
}

// runArm measures one design at one fleet size and write rate.
func (f *fleet) runArm(ctx context.Context, n int, arm string, rate float64) (FleetRow, error) {
	e, o := f.e, f.o
	spec := fleetArms[arm]
	profile := spec.design == streaming && slices.Contains(o.ProfileAt, n)
	env := slices.Clone(spec.ctrlEnv)
	if profile {
		env = append(env, "CTRL_HTTP_PPROF=true")
	}
	e.St.SetCtrlEnv(env)
	if err := e.St.RestartCtrl(false); err != nil {
		return FleetRow{}, err
	}
	f.seq++
	run := &fleetRun{design: spec.design, rng: rand.New(rand.NewPCG(o.Seed, f.seq)), writes: map[writeKey]*writeRec{}}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()

	// The clusters connect and bootstrap.
	begin := time.Now()
	var wg sync.WaitGroup
	bootstrapped := make(chan struct{}, n*len(fleetKinds))
	clusters := make([]*simCluster, n)
	perRegion := make([]int, o.Regions)
	for i := range n {
		region := f.regions[i%o.Regions]
		perRegion[i%o.Regions]++
		c, err := dialCluster(e.St.CtrlAddr, clusterCreds{token: f.tokens[i], region: region, cluster: fmt.Sprintf("fleet-c%05d", i)}, run)
		if err != nil {
			return FleetRow{}, err
		}
		clusters[i] = c
		c.start(runCtx, &wg, bootstrapped)
	}
	defer func() {
		stop()
		wg.Wait()
		for _, c := range clusters {
			c.conn.Close()
		}
	}()
	want := n * len(fleetKinds)
	for got, last := 0, time.Now(); got < want; {
		select {
		case <-bootstrapped:
			got++
		case <-time.After(time.Second):
		case <-ctx.Done():
			return FleetRow{}, ctx.Err()
		}
		if time.Since(last) > 10*time.Second {
			e.logf("fleet: %s, %d clusters: %d of %d streams bootstrapped", arm, n, got, want)
			last = time.Now()
		}
		if time.Since(begin) > 15*time.Minute {
			return FleetRow{}, fmt.Errorf("only %d of %d streams bootstrapped within 15 minutes", got, want)
		}
	}
	e.logf("fleet: %s, %d clusters: %d streams bootstrapped in %s", arm, n, want, time.Since(begin).Round(100*time.Millisecond))

	// Operators write at Rate: warm-up, then the measured window.
	conn, err := grpc.NewClient(e.St.CtrlAddr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithPerRPCCredentials(bearer(e.St.OperatorToken)))
	if err != nil {
		return FleetRow{}, err
	}
	defer conn.Close()
	api := ctrlv1.NewDeploymentServiceClient(conn)
	warmup := max(5*time.Second, o.Window/10)
	var windowOn, stormOn atomic.Bool
	var apiLat, stormLat []time.Duration
	var stormWrites, stormFailed int
	var apiMu sync.Mutex
	var writeErrs []error
	var wwg sync.WaitGroup
	writerDone := make(chan struct{})
	writeCtx, stopWrites := context.WithCancel(runCtx)
	defer stopWrites()
	go func() {
		defer close(writerDone)
		tick := time.NewTicker(time.Duration(float64(time.Second) / rate))
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-writeCtx.Done():
				return
			case <-tick.C:
			}
			r := i % o.Regions
			dep := f.deps[r][(i/o.Regions)%len(f.deps[r])]
			replicas := f.next[dep]%3 + 1 // 1, 2, 3, 1, ...
			f.next[dep] = replicas
			rec := &writeRec{sent: time.Now(), region: f.regions[r], inWindow: windowOn.Load()}
			inStorm := stormOn.Load()
			run.writesMu.Lock()
			run.writes[writeKey{dep, replicas}] = rec
			run.writesMu.Unlock()
			wwg.Go(func() {
				cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
				defer cancel()
				_, err := api.ScaleDeployment(cctx, &ctrlv1.ScaleDeploymentRequest{DeploymentId: dep, Replicas: replicas})
				apiMu.Lock()
				defer apiMu.Unlock()
				if inStorm {
					stormWrites++
					if err != nil {
						stormFailed++
					} else {
						stormLat = append(stormLat, time.Since(rec.sent))
					}
				}
				if err != nil {
					writeErrs = append(writeErrs, fmt.Errorf("scale %s to %d: %w", dep, replicas, err))
					return
				}
				rec.acked.Store(time.Now().UnixNano())
				if rec.inWindow {
					apiLat = append(apiLat, time.Since(rec.sent))
				}
			})
		}
	}()
	sleepCtxBench(ctx, warmup)
	windowOn.Store(true)
	reports0, heartbeats0, hbErr0, throttled0 := run.reports.Load(), run.heartbeats.Load(), run.heartbeatErrors.Load(), run.throttled.Load()
	s0, err := f.sample(ctx)
	if err != nil {
		return FleetRow{}, err
	}
	var rss, streams []float64
	var inside windowInside
	ctrlPid := e.St.CtrlPid()
	sampleEnd := time.Now().Add(o.Window)
	var profiles <-chan string
	if profile {
		profiles = f.profileCtrl(ctx, fmt.Sprintf("%s-%d", arm, n), o.Window)
	}
	for time.Now().Before(sampleEnd) && ctx.Err() == nil {
		rss = append(rss, procRSS(ctrlPid))
		if m, err := scrape(ctx, e.St.CtrlHTTP+"/metrics"); err == nil {
			streams = append(streams, sum(m, "krane_ctrl_watch_streams_active"))
			inside.observe(m)
		}
		sleepCtxBench(ctx, min(2*time.Second, time.Until(sampleEnd)))
	}
	if profiles != nil {
		e.logf("fleet: %s, %d clusters: ctrl's profiles over the window:\n%s", arm, n, <-profiles)
	}
	s1, err := f.sample(ctx)
	if err != nil {
		return FleetRow{}, err
	}
	heartbeats1, hbErr1, throttled1 := run.heartbeats.Load(), run.heartbeatErrors.Load(), run.throttled.Load()
	windowOn.Store(false)
	var storm *StormRow
	if spec.design == streaming && slices.Contains(o.StormAt, n) {
		if storm, err = f.storm(ctx, run, clusters, &stormOn, func() ([]time.Duration, int, int) {
			apiMu.Lock()
			defer apiMu.Unlock()
			lat := slices.Clone(stormLat)
			return lat, stormWrites, stormFailed
		}); err != nil {
			return FleetRow{}, err
		}
		e.logf("fleet: %s, %d clusters: reconnect storm: every stream back and caught up in %.1f s; operator call p99 %.0f ms meanwhile (%d of %d failed); %d re-bootstraps",
			arm, n, storm.Seconds, storm.APIp99, storm.FailedWrites, storm.Writes, storm.Rebootstraps)
	}
	stopWrites()
	<-writerDone
	wwg.Wait()
	// A write that fails (ctrl overloaded: it timed out) is a result, not
	// the end of the run: it is counted, and it is never delivered.
	apiMu.Lock()
	failedWrites := len(writeErrs)
	if failedWrites > 0 {
		e.logf("fleet: %s, %d clusters: %d operator writes failed, first: %v", arm, n, failedWrites, writeErrs[0])
	}
	apiMu.Unlock()

	// Drain: every write of the window reaches every cluster of its region
	// (polling clusters need up to their 5 s interval).
	var recs []*writeRec
	run.writesMu.Lock()
	for _, w := range run.writes {
		if w.inWindow && w.acked.Load() != 0 {
			recs = append(recs, w)
		}
	}
	run.writesMu.Unlock()
	regionN := map[string]int{}
	for r, name := range f.regions {
		regionN[name] = perRegion[r]
	}
	missing := func() (int, int) {
		exp, miss := 0, 0
		for _, w := range recs {
			exp += regionN[w.region]
			miss += regionN[w.region] - int(w.delivered.Load())
		}
		return exp, miss
	}
	drainEnd := time.Now().Add(20 * time.Second)
	for {
		if _, m := missing(); m == 0 || time.Now().After(drainEnd) {
			break
		}
		sleepCtxBench(ctx, 100*time.Millisecond)
	}
	expected, miss := missing()

	row := FleetRow{Arm: arm, Clusters: n, Rate: rate, Writes: len(recs), FailedWrites: failedWrites, Deliveries: expected, Missing: miss,
		Polls: run.polls.Load(), Reports: run.reports.Load() - reports0, StreamErrors: run.streamErrors.Load(), ReportErrors: run.reportErrors.Load(),
		Throttled: throttled1 - throttled0, Heartbeats: heartbeats1 - heartbeats0, HeartbeatErrors: hbErr1 - hbErr0, Storm: storm,
		Inside: inside.result(s1.at.Sub(s0.at))}
	var lat, fromAck []time.Duration
	for _, w := range recs {
		acked := time.Unix(0, w.acked.Load())
		w.mu.Lock()
		for _, at := range w.deliveredAt {
			lat = append(lat, at.Sub(w.sent))
			fromAck = append(fromAck, max(0, at.Sub(acked)))
		}
		w.mu.Unlock()
	}
	slices.Sort(lat)
	slices.Sort(fromAck)
	row.P50, row.P99, row.Max = percentile(lat, .5), percentile(lat, .99), percentile(lat, 1)
	row.P99Acked = percentile(fromAck, .99)
	apiMu.Lock()
	slices.Sort(apiLat)
	row.API, row.APIp99 = percentile(apiLat, .5), percentile(apiLat, .99)
	apiMu.Unlock()
	secs := s1.at.Sub(s0.at).Seconds()
	row.CPU = (s1.ctrlCPU - s0.ctrlCPU) / secs
	row.RSS = slices.Max(append(rss, 0))
	row.DBQ = (s1.db["Questions"] - s0.db["Questions"]) / secs
	row.DBByCommand = map[string]float64{}
	for k, v := range s1.db {
		if name, ok := strings.CutPrefix(k, "Com_"); ok {
			row.DBByCommand[name] = (v - s0.db[k]) / secs
		}
	}
	row.Read = (s1.reads - s0.reads) / secs
	if len(streams) > 0 {
		var t float64
		for _, v := range streams {
			t += v
		}
		row.Streams = t / float64(len(streams))
	}
	row.Load = loadBetween(s0, s1)
	return row, nil
}

// storm restarts ctrl under every stream while the operators keep
// writing, and waits until every stream is back and caught up. A
// write failing or waiting meanwhile is the figure, not an error.
func (f *fleet) storm(ctx context.Context, run *fleetRun, clusters []*simCluster, on *atomic.Bool, lat func() ([]time.Duration, int, int)) (*StormRow, error) {
	e := f.e
	re0 := run.rebootstraps.Load()
	begin := time.Now()
	on.Store(true)
	defer on.Store(false)
	// ctrl may not answer /readyz within the stack's minute under the
	// whole fleet's reconnects: that is a result (NotReady), not the end
	// of the run, as long as its process runs and the streams come back.
	var notReady string
	if err := e.St.RestartCtrl(false); err != nil {
		notReady = err.Error()
		e.logf("fleet: reconnect storm: %v; waiting for the streams regardless", err)
	}
	streams := len(clusters) * len(fleetKinds)
	last := time.Now()
	for {
		back := 0
		for _, c := range clusters {
			for i := range fleetKinds {
				if c.caughtUp[i].Load() > begin.UnixNano() {
					back++
				}
			}
		}
		if back == streams {
			break
		}
		if time.Since(begin) > 10*time.Minute {
			return nil, fmt.Errorf("reconnect storm: %d of %d streams back after 10 minutes", back, streams)
		}
		if time.Since(last) > 10*time.Second {
			e.logf("fleet: reconnect storm: %d of %d streams back and caught up after %s", back, streams, time.Since(begin).Round(time.Second))
			last = time.Now()
		}
		sleepCtxBench(ctx, 200*time.Millisecond)
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
	}
	took := time.Since(begin)
	on.Store(false)
	l, writes, failed := lat()
	slices.Sort(l)
	return &StormRow{Seconds: took.Seconds(), Streams: streams, APIp99: percentile(l, .99), Writes: writes, FailedWrites: failed,
		Rebootstraps: run.rebootstraps.Load() - re0, NotReady: notReady}, nil
}

// fleetSample is what is read at each end of a window.
type fleetSample struct {
	at       time.Time
	ctrlCPU  float64
	mariaCPU float64
	restCPU  float64
	selfCPU  float64
	busy     float64 // CPU s the whole machine was busy
	ctrlWait float64 // s ctrl's threads were runnable, not running
	selfWait float64
	loadavg  float64
	db       map[string]float64
	reads    float64
}

func (f *fleet) sample(ctx context.Context) (fleetSample, error) {
	e := f.e
	s := fleetSample{at: time.Now(), ctrlCPU: procCPU(e.St.CtrlPid()), mariaCPU: procCPU(e.St.MySQL.Pid()),
		restCPU: procCPU(e.St.Restate.Pid()), selfCPU: procCPU(os.Getpid()), busy: machineBusy(), db: map[string]float64{},
		ctrlWait: procRunnableWait(e.St.CtrlPid()), selfWait: procRunnableWait(os.Getpid())}
	s.loadavg = loadavg1()
	rows, err := e.Store.DB().QueryContext(ctx, "SHOW GLOBAL STATUS WHERE Variable_name IN ('Questions', "+
		"'Com_select', 'Com_insert', 'Com_update', 'Com_delete', 'Com_commit', 'Com_begin', 'Com_set_option', 'Com_rollback', 'Com_show_status')")
	if err != nil {
		return s, fmt.Errorf("read MariaDB's counters: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var name, v string
		if err := rows.Scan(&name, &v); err != nil {
			return s, err
		}
		s.db[name], _ = strconv.ParseFloat(v, 64)
	}
	m, err := scrape(ctx, e.St.CtrlHTTP+"/metrics")
	if err != nil {
		return s, err
	}
	s.reads = sum(m, "krane_ctrl_watch_query_seconds_count") + sum(m, "krane_ctrl_head_polls_total")
	return s, rows.Err()
}

func loadBetween(a, b fleetSample) Load {
	secs := b.at.Sub(a.at).Seconds()
	l := Load{LoadAvg1: (a.loadavg + b.loadavg) / 2, Busy: (b.busy - a.busy) / secs, MariaDB: (b.mariaCPU - a.mariaCPU) / secs,
		Restate: (b.restCPU - a.restCPU) / secs, Bench: (b.selfCPU - a.selfCPU) / secs,
		CtrlWaiting: (b.ctrlWait - a.ctrlWait) / secs, BenchWaiting: (b.selfWait - a.selfWait) / secs}
	ours := (b.ctrlCPU - a.ctrlCPU) + (b.mariaCPU - a.mariaCPU) + (b.restCPU - a.restCPU) + (b.selfCPU - a.selfCPU)
	l.OtherCores = max(0, (b.busy-a.busy-ours)/secs)
	return l
}

// Machine is a sample of the whole machine's use, to put next to figures
// measured between two samples.
type Machine struct {
	at      time.Time
	busy    float64
	loadavg float64
}

// SampleMachine reads the machine's CPU use and load average.
func SampleMachine() Machine {
	return Machine{at: time.Now(), busy: machineBusy(), loadavg: loadavg1()}
}

// LoadNote says how loaded the machine was between a and b.
func LoadNote(a, b Machine) string {
	return fmt.Sprintf("machine: load %.1f, %.2f of %d cores busy", (a.loadavg+b.loadavg)/2, (b.busy-a.busy)/b.at.Sub(a.at).Seconds(), cpus())
}

func loadavg1() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	v, _ := strconv.ParseFloat(strings.Fields(string(b))[0], 64)
	return v
}

// machineBusy is the CPU seconds the machine has been busy (the first line
// of /proc/stat: user, nice, system, irq, softirq and steal time).
func machineBusy() float64 {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	var t float64
	for _, i := range []int{1, 2, 3, 6, 7, 8} {
		if i < len(f) {
			v, _ := strconv.ParseFloat(f[i], 64)
			t += v
		}
	}
	return t / 100 // USER_HZ
}

// memoryForClusters is a rough need of one arm: the simulated clusters
// (about 0.4 MiB each with their connection), ctrl (about 0.15 MiB per
// cluster over 200 MiB) and room for MariaDB and Restate.
func memoryForClusters(n int) float64 { return float64(n)*0.55 + 1024 }

// fdsForClusters is the file descriptors the simulator needs: one
// connection per cluster, and room for the rest (ctrl needs as many).
func fdsForClusters(n int) uint64 { return uint64(n) + 1024 }

// largestFleet is n when this machine can hold n simulated clusters and
// ctrl, else the largest size that fits (a multiple of 500; 0 when none)
// and what ran out.
func largestFleet(n int) (int, string) {
	mem := availableMiB()
	var lim syscall.Rlimit
	fds := uint64(1 << 20)
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim) == nil {
		fds = lim.Cur
	}
	fit, why := n, ""
	if need := memoryForClusters(n); need > mem {
		fit = int((mem-1024)/0.55) / 500 * 500
		why = fmt.Sprintf("memory: about %.0f MiB needed, %.0f MiB available", need, mem)
	}
	if need := fdsForClusters(n); need > fds {
		if byFds := int(fds-min(fds, 1024)) / 500 * 500; byFds < fit {
			fit = byFds
			why = fmt.Sprintf("file descriptors: %d needed (a connection per cluster), the limit is %d", need, fds)
		}
	}
	return max(fit, 0), why
}

// availableMiB is MemAvailable.
func availableMiB() float64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "MemAvailable:"); ok {
			kb, _ := strconv.ParseFloat(strings.Fields(v)[0], 64)
			return kb / 1024
		}
	}
	return 0
}

func (r FleetRow) line() string {
	var by []string
	for _, k := range slices.Sorted(maps.Keys(r.DBByCommand)) {
		by = append(by, fmt.Sprintf("%s %.0f", k, r.DBByCommand[k]))
	}
	return fmt.Sprintf("(statements/s by command: %s) ", strings.Join(by, ", ")) + fmt.Sprintf("%s, %d clusters: delivery p50 %.1f p99 %.1f max %.1f ms, p99 from the answer %.1f ms, API call p50 %.1f p99 %.1f ms (%d of %d missing); ctrl %.2f cores, %.0f MiB; MariaDB %.0f statements/s; ctrl reads %.1f/s; %.0f streams open; load %.1f, machine busy %.2f cores, others %.2f",
		r.Arm, r.Clusters, r.P50, r.P99, r.Max, r.P99Acked, r.API, r.APIp99, r.Missing, r.Deliveries, r.CPU, r.RSS, r.DBQ, r.Read, r.Streams, r.Load.LoadAvg1, r.Load.Busy, r.Load.OtherCores)
}

// PrintFleet prints the side-by-side table, the ratios of each size
// against streaming, how each cost grows with the fleet, and the targets.
func PrintFleet(w io.Writer, rows []FleetRow) {
	if len(rows) == 0 {
		return
	}
	fmt.Fprintln(w, "\nFleet: simulated clusters against one ctrl")
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "design\tclusters\tdelivery p50 / p99 / max ms\tmissing\tAPI p50 / p99 ms\tfailed writes\tctrl CPU cores\tctrl waiting s/s\tctrl RSS MiB\tMariaDB stmts/s\tctrl reads/s\topen streams\treports / refused calls\theartbeats failed\tsim cores\tload 1m\tother procs cores\t")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%d\t%.0f / %.0f / %.0f\t%d/%d\t%.0f / %.0f\t%d\t%.2f\t%.2f\t%.0f\t%.0f\t%.1f\t%.0f\t%d / %d\t%d/%d\t%.2f\t%.1f\t%.2f\t\n", r.Arm, r.Clusters, r.P50, r.P99, r.Max,
			r.Missing, r.Deliveries, r.API, r.APIp99, r.FailedWrites, r.CPU, r.Load.CtrlWaiting, r.RSS, r.DBQ, r.Read, r.Streams,
			r.Reports, r.Throttled, r.HeartbeatErrors, r.Heartbeats, r.Load.Bench, r.Load.LoadAvg1, r.Load.OtherCores)
	}
	tw.Flush()
	for _, r := range rows {
		if st := r.Storm; st != nil {
			fmt.Fprintf(w, "reconnect storm, %s, %d clusters: ctrl restarted; all %d streams back and caught up in %.1f s; operator call p99 %.0f ms meanwhile (%d of %d failed); %d re-bootstraps\n",
				r.Arm, r.Clusters, st.Streams, st.Seconds, st.APIp99, st.FailedWrites, st.Writes, st.Rebootstraps)
		}
	}

	byKey := map[string]FleetRow{}
	var sizes []int
	for _, r := range rows {
		byKey[fmt.Sprintf("%s/%d", r.Arm, r.Clusters)] = r
		if !slices.Contains(sizes, r.Clusters) {
			sizes = append(sizes, r.Clusters)
		}
	}
	fmt.Fprintln(w, "\nRatios, other design / streaming (same size, same run):")
	for _, n := range sizes {
		s, ok := byKey[fmt.Sprintf("streaming/%d", n)]
		if !ok {
			continue
		}
		for _, arm := range []string{"polling", "streaming-unshared"} {
			o, ok := byKey[fmt.Sprintf("%s/%d", arm, n)]
			if !ok {
				continue
			}
			fmt.Fprintf(w, "  %5d clusters, %s: delivery p99 x%s, ctrl CPU x%s, ctrl RSS x%s, MariaDB statements x%s, ctrl reads x%s\n", n, arm,
				ratio(o.P99, s.P99), ratio(o.CPU, s.CPU), ratio(o.RSS, s.RSS), ratio(o.DBQ, s.DBQ), ratio(o.Read, s.Read))
		}
	}
	fmt.Fprintln(w, "\nGrowth with the fleet (each size against the previous; clusters grow by the first factor):")
	for _, arm := range []string{"streaming", "polling", "streaming-unshared"} {
		prev, ok := FleetRow{}, false
		for _, n := range sizes {
			r, have := byKey[fmt.Sprintf("%s/%d", arm, n)]
			if !have {
				continue
			}
			if ok {
				fmt.Fprintf(w, "  %-18s %5d -> %5d clusters (x%s): p99 x%s, CPU x%s, RSS x%s, MariaDB statements x%s, ctrl reads x%s\n", arm, prev.Clusters, n,
					ratio(float64(n), float64(prev.Clusters)), ratio(r.P99, prev.P99), ratio(r.CPU, prev.CPU), ratio(r.RSS, prev.RSS), ratio(r.DBQ, prev.DBQ), ratio(r.Read, prev.Read))
			}
			prev, ok = r, true
		}
	}
	if len(rows) > 0 {
		fmt.Fprintln(w, "\nTargets:")
		for _, t := range fleetTargets(rows) {
			fmt.Fprintf(w, "  %s: %s %s %s %s: %s\n", t.row, t.name, num(t.value), t.op, num(t.limit), holds(t.holds))
		}
	}
	s, sok := byKey["streaming/1000"]
	if p, ok := byKey["streaming-per-report/1000"]; ok && sok {
		fmt.Fprintf(w, "\nThe reference platform's report path (a transaction per report call) at 1,000 clusters: %.0f MariaDB statements/s against %.0f batched (x%s), API call p99 %.0f against %.0f ms, ctrl %.2f against %.2f cores\n",
			p.DBQ, s.DBQ, ratio(p.DBQ, s.DBQ), p.APIp99, s.APIp99, p.CPU, s.CPU)
	}
	for _, r := range rows {
		if r.Wanted > 0 {
			fmt.Fprintf(w, "\n%d clusters did not fit on this machine (%s): the %s row is the largest that did, %d clusters.\n", r.Wanted, r.RanOut, r.Arm, r.Clusters)
		}
	}
}

// fleetTarget is one target of a fleet row and whether it holds.
type fleetTarget struct {
	row, name, op string
	value, limit  float64
	holds         bool
	// figure is the fleetFigures key suffix of the figure it is about.
	figure string
}

// fleetTargets are the targets of the rows that have them: streaming at
// 1,000 clusters and 20 changes/s (against polling's delivery reads in the
// same run), and streaming at 10,000 clusters and 5 changes/s (or the
// largest size that fit, standing in for it).
func fleetTargets(rows []FleetRow) []fleetTarget {
	var out []fleetTarget
	check := func(r FleetRow, name, figure string, v float64, op string, limit float64) {
		ok := v < limit
		if op == "<=" {
			ok = v <= limit
		}
		if op == "==" {
			ok = v == limit
		}
		row := fmt.Sprintf("%s, %d clusters, %g changes/s", r.Arm, r.Clusters, r.Rate)
		if r.Wanted > 0 {
			row += fmt.Sprintf(" (for %d)", r.Wanted)
		}
		out = append(out, fleetTarget{row: row, name: name, op: op, value: v, limit: limit, holds: ok, figure: figure})
	}
	var polling *FleetRow
	for i, r := range rows {
		if r.Arm == "polling" && r.Clusters == 1000 {
			polling = &rows[i]
		}
	}
	for _, r := range rows {
		if r.Arm != "streaming" {
			continue
		}
		switch {
		case r.Clusters == 1000 && r.Wanted == 0:
			check(r, "delivery p99 ms", "p99", r.P99, "<", 100)
			check(r, "operator API call p99 ms", "api-p99", r.APIp99, "<", 100)
			check(r, "ctrl CPU cores", "cpu", r.CPU, "<", 0.5)
			check(r, "MariaDB statements/s", "statements", r.DBQ, "<=", 400)
			if polling != nil {
				check(r, fmt.Sprintf("delivery reads/s (polling: %.0f/s, a tenth)", polling.Read), "reads", r.Read, "<=", polling.Read/10)
			}
		case r.Clusters == 10000 || r.Wanted == 10000:
			check(r, "deliveries missing", "missing", float64(r.Missing), "==", 0)
			check(r, "delivery p99 ms", "p99", r.P99, "<", 1000)
			check(r, "operator API call p99 ms", "api-p99", r.APIp99, "<", 100)
			check(r, "ctrl CPU cores", "cpu", r.CPU, "<=", 1.5)
			// The HA overlay's limit before the sizing table (1 GiB).
			check(r, "ctrl RSS MiB", "rss", r.RSS, "<=", 1024)
			check(r, "MariaDB statements/s", "statements", r.DBQ, "<=", 4000)
			check(r, "report calls refused", "refused", float64(r.Throttled), "==", 0)
			check(r, "heartbeats failed", "hb-failed", float64(r.HeartbeatErrors), "==", 0)
			if st := r.Storm; st != nil {
				check(r, "reconnect storm: every stream back and caught up, s", "storm-s", st.Seconds, "<=", 60)
				check(r, "reconnect storm: operator API call p99 ms", "storm-api-p99", st.APIp99, "<", 1000)
				check(r, "reconnect storm: re-bootstraps", "storm-rebootstraps", float64(st.Rebootstraps), "==", 0)
			}
		}
	}
	return out
}

func stormNote(st *StormRow) string {
	note := fmt.Sprintf("%d streams", st.Streams)
	if st.NotReady != "" {
		note += "; ctrl's /readyz did not answer within a minute of the restart"
	}
	return note
}

// perStream is RSS (MiB) over the open streams, in KiB.
func perStream(rssMiB, streams float64) float64 {
	if streams < 1 {
		return 0
	}
	return rssMiB * 1024 / streams
}

func num(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }

func ratio(a, b float64) string {
	if b == 0 {
		return "-"
	}
	return strconv.FormatFloat(a/b, 'f', 2, 64)
}

func holds(ok bool) string {
	if ok {
		return "holds"
	}
	return "MISSED"
}

// fleetFigures are the rows as figures, keyed ARM/CLUSTERS/COLUMN (the
// documentation shows them as a grid), with the targets of fleetTargets.
func fleetFigures(rows []FleetRow) []Figure {
	targets := map[string]fleetTarget{}
	for _, t := range fleetTargets(rows) {
		targets[t.row+"/"+t.figure] = t
	}
	var out []Figure
	for _, r := range rows {
		name := fmt.Sprintf("%s, %d clusters, %g changes/s", r.Arm, r.Clusters, r.Rate)
		row := name
		if r.Wanted > 0 {
			row += fmt.Sprintf(" (for %d)", r.Wanted)
			name += fmt.Sprintf(" (the largest that fit for %d: %s ran out)", r.Wanted, strings.SplitN(r.RanOut, ":", 2)[0])
		}
		key := fmt.Sprintf("%s/%d/", r.Arm, r.Clusters)
		note := fmt.Sprintf("load %.1f, other processes %.2f cores", r.Load.LoadAvg1, r.Load.OtherCores)
		fig := func(col, label string, v float64, unit, note string) Figure {
			f := Figure{Key: key + col, Name: name + ": " + label, Value: v, Unit: unit, Note: note}
			if t, ok := targets[row+"/"+col]; ok {
				switch t.op {
				case "<":
					f.Target = Below(t.limit)
				case "<=":
					f.Target = AtMost(t.limit)
				default:
					f.Target = Exactly(t.limit)
				}
			}
			return f
		}
		out = append(out,
			fig("p50", "delivery p50", r.P50, "ms", ""),
			fig("p99", "delivery p99", r.P99, "ms", ""),
			fig("missing", "deliveries missing", float64(r.Missing), "", fmt.Sprintf("of %d", r.Deliveries)),
			fig("api-p50", "API call p50", r.API, "ms", ""),
			fig("api-p99", "API call p99", r.APIp99, "ms", ""),
			fig("cpu", "ctrl CPU", r.CPU, "cores", note),
			fig("rss", "ctrl RSS", r.RSS, "MiB", ""),
			fig("reads", "ctrl delivery reads", r.Read, "/s", ""),
			fig("statements", "MariaDB statements", r.DBQ, "/s", ""),
			fig("streams", "open streams", r.Streams, "", ""),
			fig("other-cores", "other processes' CPU", r.Load.OtherCores, "cores", fmt.Sprintf("load %.1f", r.Load.LoadAvg1)),
			fig("sim-cores", "the simulated clusters' CPU", r.Load.Bench, "cores", ""),
			fig("kib-per-stream", "ctrl RSS per open stream", perStream(r.RSS, r.Streams), "KiB", ""),
			fig("ctrl-waiting", "ctrl runnable, not running", r.Load.CtrlWaiting, "s/s", ""),
			fig("reports", "status reports offered", float64(r.Reports), "", ""),
			fig("refused", "report calls refused (queue full)", float64(r.Throttled), "", ""),
			fig("hb-failed", "heartbeats failed", float64(r.HeartbeatErrors), "", fmt.Sprintf("of %d", r.Heartbeats)),
			fig("goroutines", "ctrl goroutines", r.Inside.Goroutines, "", ""),
			fig("report-queue", "reports queued, most", r.Inside.ReportQueue, "", fmt.Sprintf("heartbeats queued, most: %.0f", r.Inside.HeartbeatQueue)),
			fig("db-waits", "queries waiting for a pool connection", r.Inside.DBWaits, "/s", fmt.Sprintf("%.2f s/s waited", r.Inside.DBWaitSeconds)),
		)
		if st := r.Storm; st != nil {
			out = append(out,
				fig("storm-s", "reconnect storm: streams back and caught up", st.Seconds, "s", stormNote(st)),
				fig("storm-api-p99", "reconnect storm: API call p99", st.APIp99, "ms", fmt.Sprintf("%d of %d failed", st.FailedWrites, st.Writes)),
				fig("storm-rebootstraps", "reconnect storm: re-bootstraps", float64(st.Rebootstraps), "", ""),
			)
		}
	}
	return out
}

// FleetMeasurement is the fleet benchmark as a measurement: the sizes and
// designs of e.Fleet (a smoke run: 10 clusters in 2 regions, both
// designs, a few seconds each).
func FleetMeasurement(ctx context.Context, e *Env) ([]Figure, error) {
	o := e.Fleet
	if e.Small {
		o.Clusters, o.Regions, o.Window, o.DeploymentsPerRegion, o.Arms = []int{10}, 2, 2*time.Second, 5, []string{"streaming", "polling"}
		o.StormAt, o.ProfileAt = []int{10}, []int{10}
	}
	figs, rows, err := Fleet(ctx, e, o)
	PrintFleet(e.Out, rows)
	return figs, err
}
