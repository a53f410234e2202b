package syncer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"

	"krane.dev/internal/clustertest"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
	"krane.dev/sdk"
)

// This file is the scripted world Loop tests run in: ctrl is the real
// ClusterService test server (internal/clustertest) over real gRPC, and
// the plugin is fakePlugin, whose "cluster" survives plugin restarts and
// whose Apply outcomes a test scripts per change.

const (
	testKind   = "thing.test.krane.dev"
	testRegion = "r1"
	testToken  = "tok"
)

type bearer struct{}

func (bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + testToken}, nil
}
func (bearer) RequireTransportSecurity() bool { return false }

// dial connects to srv as a krane host does; the connection closes when
// the test ends.
func dial(t testing.TB, srv *clustertest.Server) (clusterv1.ClusterServiceClient, *grpc.ClientConn) {
	t.Helper()
	conn, err := grpc.NewClient(strings.TrimPrefix(srv.URL(), "http://"), grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithPerRPCCredentials(bearer{}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return clusterv1.NewClusterServiceClient(conn), conn
}

// spec is the JSON desired state of one test object.
func spec(v string) map[string]any { return map[string]any{"v": v} }

// fakeCluster is what the plugin made of the cluster: it outlives plugin
// instances, as a real cluster outlives a plugin process.
type fakeCluster struct {
	mu      sync.Mutex
	objects map[string]sdk.Change // id -> the change last applied
	// stale records applies of a version older than the one the object
	// already had (invariant 2 forbids them; repairs of the same version
	// are fine).
	stale   []string
	applies int
}

func (c *fakeCluster) state() map[string]string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]string{}
	for id, ch := range c.objects {
		out[id] = string(ch.Spec.Value)
	}
	return out
}

func (c *fakeCluster) has(id string, version uint64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch, ok := c.objects[id]
	return ok && ch.Version == version
}

// fakePlugin is a PluginSource whose instances apply into a fakeCluster.
// fail scripts outcomes: it sees every change before it is applied and
// returns the error to answer (nil applies it). gate, when set, is called
// first and may block (an apply in flight).
type fakePlugin struct {
	cluster *fakeCluster

	mu       sync.Mutex
	cur      *fakeInstance
	changed  chan struct{}
	fail     func(sdk.Change) error
	gate     func(ctx context.Context, ch sdk.Change)
	started  int
	inFlight int
	// held, when set, keeps Acquire from handing out the next instance
	// until it is closed (a plugin slow to restart).
	held chan struct{}
}

func newFakePlugin() *fakePlugin {
	p := &fakePlugin{cluster: &fakeCluster{objects: map[string]sdk.Change{}}, changed: make(chan struct{})}
	p.cur = p.newInstance()
	return p
}

func (p *fakePlugin) newInstance() *fakeInstance {
	p.started++
	return &fakeInstance{p: p, stopped: make(chan struct{}), n: p.started}
}

// script sets the outcome function (nil: every apply succeeds).
func (p *fakePlugin) script(fail func(sdk.Change) error) {
	p.mu.Lock()
	p.fail = fail
	p.mu.Unlock()
}

func (p *fakePlugin) setGate(gate func(ctx context.Context, ch sdk.Change)) {
	p.mu.Lock()
	p.gate = gate
	p.mu.Unlock()
}

// Restart stops the running instance and starts a new one, as the
// supervisor does after a crash or a reload.
func (p *fakePlugin) Restart() {
	// Holding the cluster's lock: an apply of the old instance either
	// lands before it stops or not at all, as with a killed process.
	p.cluster.mu.Lock()
	defer p.cluster.mu.Unlock()
	p.mu.Lock()
	defer p.mu.Unlock()
	close(p.cur.stopped)
	p.cur = p.newInstance()
	close(p.changed)
	p.changed = make(chan struct{})
}

// Instances counts instances started so far.
func (p *fakePlugin) Instances() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.started
}

// hold makes Acquire wait until the returned func is called.
func (p *fakePlugin) hold() (release func()) {
	ch := make(chan struct{})
	p.mu.Lock()
	p.held = ch
	p.mu.Unlock()
	return func() { close(ch) }
}

func (p *fakePlugin) Acquire(ctx context.Context) (sdk.Controller, <-chan struct{}, error) {
	p.mu.Lock()
	cur, held := p.cur, p.held
	p.mu.Unlock()
	if held != nil {
		select {
		case <-held:
		case <-ctx.Done():
		}
		p.mu.Lock()
		cur = p.cur
		p.mu.Unlock()
	}
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	return cur, cur.stopped, nil
}

// fakeInstance is one plugin process.
type fakeInstance struct {
	p       *fakePlugin
	n       int
	stopped chan struct{}
}

var errStopped = errors.New("plugin instance stopped")

func (i *fakeInstance) alive() error {
	select {
	case <-i.stopped:
		return fmt.Errorf("instance %d: %w", i.n, errStopped)
	default:
		return nil
	}
}

func (i *fakeInstance) Describe(context.Context, *sdk.DescribeRequest) (*sdk.DescribeResponse, error) {
	return &sdk.DescribeResponse{Info: sdk.Info{Name: "fake", Version: "1", Kinds: []sdk.KindInfo{{Kind: testKind}}}}, nil
}

func (i *fakeInstance) Configure(context.Context, *sdk.ConfigureRequest) (*sdk.ConfigureResponse, error) {
	return &sdk.ConfigureResponse{}, nil
}

func (i *fakeInstance) Apply(ctx context.Context, req *sdk.ApplyRequest) (*sdk.ApplyResponse, error) {
	return sdk.Done(i.apply(ctx, req.Change))
}

func (i *fakeInstance) apply(ctx context.Context, ch sdk.Change) (sdk.Result, error) {
	p := i.p
	p.mu.Lock()
	gate, fail := p.gate, p.fail
	p.inFlight++
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		p.inFlight--
		p.mu.Unlock()
	}()
	if gate != nil {
		gate(ctx, ch)
	}
	if err := i.alive(); err != nil {
		return 0, err
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if fail != nil {
		if err := fail(ch); err != nil {
			return 0, err
		}
	}
	c := p.cluster
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := i.alive(); err != nil {
		return 0, err
	}
	c.applies++
	prev, had := c.objects[ch.ID]
	if had && ch.Version < prev.Version {
		c.stale = append(c.stale, fmt.Sprintf("%s: applied %d (deleted=%v, instance %d) over %d (deleted=%v)", ch.ID, ch.Version, ch.Deleted, i.n, prev.Version, prev.Deleted))
	}
	if ch.Deleted {
		delete(c.objects, ch.ID)
		return sdk.Deleted, nil
	}
	if had && prev.Version == ch.Version && string(prev.Spec.Value) == string(ch.Spec.Value) {
		return sdk.Unchanged, nil
	}
	c.objects[ch.ID] = ch
	return sdk.Applied, nil
}

func (i *fakeInstance) Inventory(ctx context.Context, req *sdk.InventoryRequest) (*sdk.InventoryResponse, error) {
	items, err := i.inventory(ctx, req.Kind)
	if err != nil {
		return nil, err
	}
	return &sdk.InventoryResponse{Items: items}, nil
}

func (i *fakeInstance) inventory(ctx context.Context, kind string) ([]sdk.InventoryItem, error) {
	if err := i.alive(); err != nil {
		return nil, err
	}
	c := i.p.cluster
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []sdk.InventoryItem
	for id, ch := range c.objects {
		out = append(out, sdk.InventoryItem{Kind: kind, ID: id, Version: ch.Version})
	}
	return out, nil
}

func (i *fakeInstance) WatchStatus(ctx context.Context, _ func(sdk.StatusReport) error) error {
	<-ctx.Done()
	return nil
}

func (i *fakeInstance) Shutdown(context.Context) error { return nil }

// reports records what the loop tells ctrl about failures.
type reports struct {
	mu        sync.Mutex
	failed    map[string]uint64 // id -> version reported parked, until recovered
	recovered map[string]uint64
}

func newReports() *reports {
	return &reports{failed: map[string]uint64{}, recovered: map[string]uint64{}}
}

func (r *reports) ApplyFailed(_, id string, version uint64, _ error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failed[id] = version
}

func (r *reports) ApplyRecovered(_, id string, version uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if v, ok := r.failed[id]; ok && version >= v {
		delete(r.failed, id)
		r.recovered[id] = version
	}
}

func (r *reports) Failing(string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var ids []string
	for id := range r.failed {
		ids = append(ids, id)
	}
	return ids
}

func (r *reports) parked() map[string]uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]uint64{}
	for k, v := range r.failed {
		out[k] = v
	}
	return out
}

// world is one loop under test with its ctrl and plugin.
type world struct {
	t       testing.TB
	ctrl    *clustertest.Server
	conn    *grpc.ClientConn
	plugin  *fakePlugin
	reports *reports
	metrics *Metrics
	loop    *Loop
	cancel  context.CancelFunc
	done    chan struct{}
}

// testOptions are fast tunables: quick retries, parked changes retried
// only on demand (a long park backoff), manual resyncs.
func testOptions() Options {
	return Options{
		Workers: 4, ResyncInterval: time.Hour, ReconnectMin: 5 * time.Millisecond, ReconnectMax: 20 * time.Millisecond,
		ApplyTimeout: 20 * time.Second, MaxPending: 1000, StreamTimeout: time.Minute,
		Retry: Backoff{Min: time.Millisecond, Max: 5 * time.Millisecond}, MaxAttempts: 3,
		Park: Backoff{Min: time.Hour, Max: time.Hour},
		GC:   GCOptions{MaxDeleteFraction: 1, MinDeletes: 1000},
	}
}

func newWorld(t testing.TB, opts Options) *world {
	t.Helper()
	srv := clustertest.Start(t, testRegion, testToken)
	srv.KeepAlive = 50 * time.Millisecond
	client, conn := dial(t, srv)
	w := &world{t: t, ctrl: srv, conn: conn, plugin: newFakePlugin(), reports: newReports(), metrics: NewMetrics(prometheus.NewRegistry())}
	log := hclog.New(&hclog.LoggerOptions{Level: hclog.Warn, Output: io.Discard})
	if testing.Verbose() {
		log = hclog.New(&hclog.LoggerOptions{Level: hclog.Debug, Output: testLogWriter{t}})
	}
	w.loop = NewLoop(testKind, testRegion, client, w.plugin, w.reports, log, w.metrics, opts)
	return w
}

type testLogWriter struct{ t testing.TB }

func (w testLogWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// start runs the loop until stop (or the end of the test).
func (w *world) start() {
	ctx, cancel := context.WithCancel(context.Background())
	w.cancel, w.done = cancel, make(chan struct{})
	go func() {
		defer close(w.done)
		w.loop.Run(ctx)
	}()
	w.t.Cleanup(w.stop)
}

// stop ends the loop and waits until Run returned.
func (w *world) stop() {
	if w.cancel == nil {
		return
	}
	w.cancel()
	select {
	case <-w.done:
	case <-time.After(time.Minute):
		w.t.Errorf("the loop did not stop within a minute")
	}
	w.cancel = nil
}

func (w *world) put(id, v string) uint64 { return w.ctrl.PutJSON(testKind, id, spec(v)) }

// desired is ctrl's live desired state: id -> spec JSON as the plugin gets it.
func (w *world) desired(ids []string) map[string]string {
	out := map[string]string{}
	for _, id := range ids {
		c, err := w.ctrl.GetDesiredState(context.Background(), &clusterv1.GetDesiredStateRequest{Kind: testKind, Id: id})
		if err != nil || c.GetDeleted() {
			continue
		}
		out[id] = string(c.GetSpec().GetValue())
	}
	return out
}

// resyncs is how many resync passes have completed.
func (w *world) resyncs() uint64 {
	var m dto.Metric
	if err := w.metrics.ResyncSeconds.WithLabelValues(testKind).(prometheus.Histogram).Write(&m); err != nil {
		w.t.Fatal(err)
	}
	return m.GetHistogram().GetSampleCount()
}

// resync asks for one resync and waits until it completed.
func (w *world) resync() {
	w.t.Helper()
	before := w.resyncs()
	w.loop.Resync()
	waitFor(w.t, "a resync pass", func() error {
		if w.resyncs() <= before {
			return errors.New("resync not done")
		}
		return nil
	})
}

func (w *world) waitCursor(v uint64) {
	w.t.Helper()
	waitFor(w.t, fmt.Sprintf("cursor %d", v), func() error {
		if c := w.loop.Cursor(); c < v {
			return fmt.Errorf("cursor %d", c)
		}
		return nil
	})
}

func (w *world) waitBootstrapped() {
	w.t.Helper()
	waitFor(w.t, "bootstrap applied", func() error {
		if !w.loop.Bootstrapped() {
			return errors.New("not bootstrapped")
		}
		return nil
	})
}

func (w *world) waitApplied(id string, version uint64) {
	w.t.Helper()
	waitFor(w.t, fmt.Sprintf("%s@%d applied", id, version), func() error {
		if !w.plugin.cluster.has(id, version) {
			return errors.New("not applied")
		}
		return nil
	})
}

// startSettled commits one object, starts the loop and waits until it is
// bootstrapped and at ctrl's head; it returns the cursor and the number of
// Watch calls so far.
func (w *world) startSettled() (cursor uint64, watches int) {
	w.t.Helper()
	w.put("a", "1")
	w.start()
	w.waitBootstrapped()
	w.waitCursor(w.ctrl.Head())
	return w.loop.Cursor(), len(w.ctrl.Watches())
}

// checkResumed checks that the first Watch call after the first before
// ones resumed after cursor (not from 0).
func (w *world) checkResumed(before int, cursor uint64) {
	w.t.Helper()
	watches := w.ctrl.Watches()
	if len(watches) <= before {
		w.t.Fatal("no new Watch call recorded")
	}
	if got := watches[before].GetAfterVersion(); got != cursor {
		w.t.Errorf("resumed after version %d, want the committed cursor %d", got, cursor)
	}
}

// waitParked waits until id is reported parked at version (reports trail
// the queue by a moment).
func (w *world) waitParked(id string, version uint64) {
	w.t.Helper()
	waitFor(w.t, fmt.Sprintf("%s@%d reported parked", id, version), func() error {
		if got := w.reports.parked()[id]; got != version {
			return fmt.Errorf("reported parked at %d", got)
		}
		return nil
	})
}

// waitNoneParked waits until no failure is reported any more.
func (w *world) waitNoneParked(what string) {
	w.t.Helper()
	waitFor(w.t, what, func() error {
		if p := w.reports.parked(); len(p) > 0 {
			return fmt.Errorf("still reported parked: %v", p)
		}
		return nil
	})
}

// waitFor polls cond until it holds; the bound is generous because the
// machine may be loaded, never a stand-in for "soon enough".
func waitFor(t testing.TB, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(waitBound)
	var err error
	for time.Now().Before(deadline) {
		if err = cond(); err == nil {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s: %v", what, err)
}

// diff lists the differences between two id -> spec maps.
func diff(want, got map[string]string) []string {
	var out []string
	for id, w := range want {
		if g, ok := got[id]; !ok {
			out = append(out, fmt.Sprintf("%s missing (want %s)", id, w))
		} else if g != w {
			out = append(out, fmt.Sprintf("%s is %s, want %s", id, g, w))
		}
	}
	for id, g := range got {
		if _, ok := want[id]; !ok {
			out = append(out, fmt.Sprintf("%s exists (%s) but is not desired", id, g))
		}
	}
	sort.Strings(out)
	return out
}

// specValue is the spec bytes the plugin receives for spec(v).
func specValue(t testing.TB, v string) string {
	st, err := structpb.NewStruct(spec(v))
	if err != nil {
		t.Fatal(err)
	}
	a, err := anypb.New(st)
	if err != nil {
		t.Fatal(err)
	}
	return string(a.GetValue())
}

// waitBound bounds every wait; KRANE_TEST_WAIT shortens it to see a
// failing test fail sooner.
var waitBound = func() time.Duration {
	if d, err := time.ParseDuration(os.Getenv("KRANE_TEST_WAIT")); err == nil {
		return d
	}
	return 60 * time.Second
}()

// queueLen is the number of objects the current session's queue holds.
func (w *world) queueLen() int {
	w.loop.mu.Lock()
	q := w.loop.q
	w.loop.mu.Unlock()
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.objects)
}

// testutilCount reads a counter.
func testutilCount(t testing.TB, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}
