package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"

	"krane.dev/internal/stack"
	"krane.dev/internal/testenv"
	"krane.dev/internal/testenv/kubeenv"
	deployment "krane.dev/plugins/deployment/controller"
	sentinel "krane.dev/plugins/sentinel/controller"
	"krane.dev/sentinel/routes"
)

// TestSentinelRoutesRealRequests sends real HTTP requests through real
// krane-sentinel processes to real backend servers, on a stack whose
// deploys, promotes and rollbacks go through ctrl and krane as an
// operator's would. Simulated nodes run nothing, so the test plays the
// part of the kubelet and of Kubernetes' EndpointSlice controller (which
// the cluster runs without): for every ready pod of a deployment it starts
// an HTTP server that answers with the pod's name, and lists it in an
// EndpointSlice of the deployment's Service. The sentinels run as the
// account pods.yaml grants, so the test also proves those rights suffice.
//
// Under a constant, bounded request loop: a promote and a rollback move
// every later request to the new live deployment with no failed request;
// an instance whose health check fails gets no request once the sentinels
// saw it leave; an instance that dies unannounced costs no request either.
func TestSentinelRoutesRealRequests(t *testing.T) {
	st := trafficStack(t)
	cluster := st.Clusters["local-a"]
	seed := time.Now().UnixNano()
	t.Logf("seed %d (backend delays)", seed)
	mirror := startEndpointMirror(t, cluster, seed)

	const env, host = "e2e-traffic", "app.e2e.test"
	a := trafficDeploy(t, st, env, "registry.local/e2e/traffic:1")
	if code, out, errOut := ctrlRun(t, st, "", "environment", "hosts", env, "--host", host); code != 0 {
		t.Fatalf("environment hosts: exit %d\n%s%s", code, out, errOut)
	}
	sentinels := startSentinels(t, cluster, a, host)
	load := startLoad(t, sentinels, host)

	// A promote: every request a sentinel starts after it first answered
	// from b is answered from b.
	b := trafficDeploy(t, st, env, "registry.local/e2e/traffic:2")
	load.expect(t, a)
	promoted := time.Now()
	if code, out, errOut := ctrlRun(t, st, "", "deploy", "promote", b); code != 0 {
		t.Fatalf("promote: exit %d\n%s%s", code, out, errOut)
	}
	switched := load.switchTo(t, b)
	t.Logf("promote: ctrl deploy promote returned to the last sentinel serving %s: %s", b, switched.Sub(promoted).Round(time.Millisecond))

	// A rollback: a new live deployment with a's configuration.
	rb := ctrlJSON(t, st, "", "deploy", "rollback", "--environment", env, "--wait")
	c, _ := rb["id"].(string)
	if c == "" || rb["live"] != true {
		t.Fatalf("rollback: %v", rb)
	}
	load.switchTo(t, c)

	// An instance fails its health check: Kubernetes would mark it not
	// ready in the slice. Once every sentinel counts one ready instance
	// fewer, none routes a request to it, although it still answers.
	pods := mirror.podsOf(c)
	if len(pods) != 2 {
		t.Fatalf("deployment %s has instances %v, want 2", c, pods)
	}
	unhealthy := pods[0]
	mirror.setReady(t, unhealthy, false)
	seen := waitInstancesReady(t, sentinels, c, 1)
	load.noneAfter(t, unhealthy, seen)

	// The other dies without notice: its connections are refused while
	// the slice still lists it. No request fails meanwhile: a refused
	// connect ejects the instance and the request moves to the healthy
	// one (checked with every other request at the end).
	mirror.setReady(t, unhealthy, true)
	waitInstancesReady(t, sentinels, c, 2)
	mirror.kill(t, pods[1])
	load.waitPast(t, time.Now())

	failures := load.stop()
	t.Logf("%d requests through %d sentinels, %d failed", load.total(), len(sentinels), len(failures))
	for i, f := range failures {
		if i == 10 {
			t.Errorf("... %d more", len(failures)-10)
			break
		}
		t.Errorf("failed request: %s", f)
	}
}

// trafficStack is a stack of one region whose cluster runs no
// EndpointSlice controller: the test writes the slices.
func trafficStack(t *testing.T) *stack.Stack {
	t.Helper()
	st, err := stack.Start(context.Background(), stack.Options{
		Regions:  []string{"local-a"},
		BinDir:   os.Getenv("KRANE_BIN_DIR"),
		Kube:     kubeenv.Options{Name: "traffic", WithoutEndpointSlices: true},
		Progress: &lineWriter{t: t},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Stop)
	return st
}

// trafficDeploy deploys two replicas to local-a and waits until ready.
func trafficDeploy(t *testing.T, st *stack.Stack, env, image string) string {
	t.Helper()
	doc := ctrlJSON(t, st, "", "deploy", "create", "--workspace", "e2e", "--project", "p", "--app", "a", "--environment", env,
		"--image", image, "--replicas", "2", "--region", "local-a", "--wait")
	if doc["status"] != "DEPLOYMENT_STATUS_READY" {
		t.Fatalf("deploy of %s: %v", image, doc)
	}
	return doc["id"].(string)
}

// endpointMirror plays the kubelet and the EndpointSlice controller for the
// deployments Krane runs: a real HTTP server per ready pod, and an
// EndpointSlice per pod naming it, labelled for the deployment's Service.
type endpointMirror struct {
	cluster *kubeenv.Cluster
	ip      string
	seed    int64

	mu        sync.Mutex
	instances map[string]*instance // namespace/pod
	trigger   chan struct{}
	pods      cache.Indexer
	services  cache.Indexer
}

type instance struct {
	ns, pod, deployment, service string
	srv                          *http.Server
	port                         int32
	ready, dead                  bool
}

// answer is what a backend server says: which pod answered.
type answer struct {
	Deployment string `json:"deployment"`
	Pod        string `json:"pod"`
}

func startEndpointMirror(t *testing.T, c *kubeenv.Cluster, seed int64) *endpointMirror {
	t.Helper()
	m := &endpointMirror{cluster: c, ip: testenv.HostIP(t), seed: seed, instances: map[string]*instance{}, trigger: make(chan struct{}, 1)}
	f := informers.NewSharedInformerFactoryWithOptions(c.Client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.LabelSelector = deployment.LabelDeployment
	}))
	podInf, svcInf := f.Core().V1().Pods().Informer(), f.Core().V1().Services().Informer()
	poke := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { m.poke() },
		UpdateFunc: func(any, any) { m.poke() },
		DeleteFunc: func(any) { m.poke() },
	}
	for _, inf := range []cache.SharedIndexInformer{podInf, svcInf} {
		if _, err := inf.AddEventHandler(poke); err != nil {
			t.Fatal(err)
		}
	}
	m.pods, m.services = podInf.GetIndexer(), svcInf.GetIndexer()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	f.Start(ctx.Done())
	f.WaitForCacheSync(ctx.Done())
	go func() {
		defer close(done)
		for {
			select {
			case <-ctx.Done():
				return
			case <-m.trigger:
				if err := m.sync(ctx); err != nil && ctx.Err() == nil {
					t.Errorf("endpoint mirror: %v", err)
				}
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		f.Shutdown()
		m.mu.Lock()
		defer m.mu.Unlock()
		for _, in := range m.instances {
			_ = in.srv.Close()
		}
	})
	return m
}

func (m *endpointMirror) poke() {
	select {
	case m.trigger <- struct{}{}:
	default:
	}
}

// sync makes an instance (server and slice) for every ready pod whose
// deployment has its Service, and removes those of pods gone.
func (m *endpointMirror) sync(ctx context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	seen := map[string]bool{}
	for _, o := range m.pods.List() {
		p := o.(*corev1.Pod)
		key := p.Namespace + "/" + p.Name
		if p.DeletionTimestamp != nil || !podIsReady(p) {
			continue
		}
		id := p.Labels[deployment.LabelDeployment]
		svc := m.serviceOf(p.Namespace, id)
		if svc == "" {
			continue // the Service comes a moment after the pods
		}
		seen[key] = true
		if m.instances[key] != nil {
			continue
		}
		in, err := m.serve(p, id, svc)
		if err != nil {
			return err
		}
		m.instances[key] = in
		if err := m.writeSlice(ctx, in); err != nil {
			return err
		}
	}
	for key, in := range m.instances {
		if seen[key] {
			continue
		}
		delete(m.instances, key)
		err := m.cluster.Client.DiscoveryV1().EndpointSlices(in.ns).Delete(ctx, "e2e-"+in.pod, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return err
		}
		// Requests in flight finish: Shutdown waits for them.
		go func() { _ = in.srv.Shutdown(context.Background()) }()
	}
	return nil
}

func (m *endpointMirror) serviceOf(ns, id string) string {
	for _, o := range m.services.List() {
		s := o.(*corev1.Service)
		if s.Namespace == ns && s.Labels[deployment.LabelDeployment] == id {
			return s.Name
		}
	}
	return ""
}

func podIsReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// serve starts the pod's server. Each answers after a random few
// milliseconds, so requests are in flight when routes switch.
func (m *endpointMirror) serve(p *corev1.Pod, id, svc string) (*instance, error) {
	l, err := net.Listen("tcp", net.JoinHostPort(m.ip, "0"))
	if err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(uint64(m.seed), uint64(len(m.instances))))
	var rngMu sync.Mutex
	body, _ := json.Marshal(answer{Deployment: id, Pod: p.Name})
	in := &instance{ns: p.Namespace, pod: p.Name, deployment: id, service: svc, port: int32(l.Addr().(*net.TCPAddr).Port), ready: true}
	in.srv = &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rngMu.Lock()
		d := time.Duration(rng.IntN(5000)) * time.Microsecond
		rngMu.Unlock()
		time.Sleep(d) // the request's service time, not a wait for anything
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(body)
	})}
	go func() { _ = in.srv.Serve(l) }()
	return in, nil
}

func (m *endpointMirror) writeSlice(ctx context.Context, in *instance) error {
	ready := in.ready
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "e2e-" + in.pod, Namespace: in.ns, Labels: map[string]string{
			discoveryv1.LabelServiceName: in.service,
			discoveryv1.LabelManagedBy:   "e2e.krane.dev",
		}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{m.ip}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}}},
		Ports:       []discoveryv1.EndpointPort{{Name: ptrTo("http"), Port: &in.port, Protocol: ptrTo(corev1.ProtocolTCP)}},
	}
	client := m.cluster.Client.DiscoveryV1().EndpointSlices(in.ns)
	cur, err := client.Get(ctx, slice.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		_, err = client.Create(ctx, slice, metav1.CreateOptions{})
	case err == nil:
		slice.ResourceVersion = cur.ResourceVersion
		_, err = client.Update(ctx, slice, metav1.UpdateOptions{})
	}
	return err
}

func ptrTo[T any](v T) *T { return &v }

// podsOf lists the pods of a deployment that have an instance, sorted.
func (m *endpointMirror) podsOf(id string) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for _, in := range m.instances {
		if in.deployment == id {
			out = append(out, in.pod)
		}
	}
	slices.Sort(out)
	return out
}

func (m *endpointMirror) find(t *testing.T, pod string) *instance {
	t.Helper()
	for _, in := range m.instances {
		if in.pod == pod {
			return in
		}
	}
	t.Fatalf("no instance for pod %s", pod)
	return nil
}

// setReady marks a pod's endpoint ready or not, as a health check would.
func (m *endpointMirror) setReady(t *testing.T, pod string, ready bool) {
	t.Helper()
	m.mu.Lock()
	defer m.mu.Unlock()
	in := m.find(t, pod)
	in.ready = ready
	if err := m.writeSlice(context.Background(), in); err != nil {
		t.Fatal(err)
	}
}

// kill closes a pod's server at once (connections refused from now on);
// its slice says nothing.
func (m *endpointMirror) kill(t *testing.T, pod string) {
	t.Helper()
	m.mu.Lock()
	defer m.mu.Unlock()
	in := m.find(t, pod)
	in.dead = true
	_ = in.srv.Close()
}

// sentinelProc is one krane-sentinel process.
type sentinelProc struct {
	url, admin string
}

// startSentinels runs two krane-sentinel processes for the sentinel whose
// routes name deployment live, as ServiceAccount sentinel/krane-sentinel
// (pods.yaml's rights, nothing more), and waits until both serve host
// from it.
func startSentinels(t *testing.T, c *kubeenv.Cluster, live, host string) []sentinelProc {
	t.Helper()
	ctx := context.Background()
	var cm *corev1.ConfigMap
	waitFor(t, 2*time.Minute, "the routes ConfigMap naming "+live+" and "+host, func() error {
		list, err := c.Client.CoreV1().ConfigMaps(sentinel.DefaultNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=sentinel"})
		if err != nil {
			return err
		}
		for i := range list.Items {
			r, err := routes.Parse([]byte(list.Items[i].Data[routes.Key]))
			if err == nil && r.Backend != nil && r.Backend.DeploymentID == live && len(r.Hosts) == 1 && r.Hosts[0] == host {
				cm = &list.Items[i]
				return nil
			}
		}
		return fmt.Errorf("none among %d", len(list.Items))
	})
	r, _ := routes.Parse([]byte(cm.Data[routes.Key]))
	_, kubeconfig, err := c.ServiceAccountConfig(ctx, sentinel.DefaultNamespace, sentinel.DefaultServiceAccount)
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(os.Getenv("KRANE_BIN_DIR"), "krane-sentinel")
	if os.Getenv("KRANE_BIN_DIR") == "" {
		bin = testenv.Build(t, "krane.dev/cmd/krane-sentinel", "krane-sentinel")
	}
	dir := t.TempDir()
	var out []sentinelProc
	for i := range 2 {
		ports, err := testenv.FreePorts(2)
		if err != nil {
			t.Fatal(err)
		}
		p, err := testenv.StartProcess(dir, fmt.Sprintf("krane-sentinel-%d", i), bin, nil, []string{
			"UNKEY_SENTINEL_ID=" + r.SentinelID, "UNKEY_ENVIRONMENT_ID=" + r.EnvironmentID, "UNKEY_REGION=local-a",
			"UNKEY_HTTP_PORT=" + strconv.Itoa(ports[0]),
			"KRANE_SENTINEL_ROUTES=" + cm.Namespace + "/" + cm.Name,
			"KRANE_SENTINEL_ADMIN_ADDR=127.0.0.1:" + strconv.Itoa(ports[1]),
			"KUBECONFIG=" + kubeconfig,
			"KRANE_SENTINEL_ACCESS_LOG=false",
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			p.Stop(30 * time.Second)
			if t.Failed() {
				t.Logf("krane-sentinel-%d:\n%s", i, p.Tail(40))
			}
		})
		s := sentinelProc{url: fmt.Sprintf("http://127.0.0.1:%d", ports[0]), admin: fmt.Sprintf("http://127.0.0.1:%d", ports[1])}
		if err := p.WaitReady(time.Minute, func(ctx context.Context) error { return httpOK(ctx, s.url+"/_krane/sentinel/ready") }); err != nil {
			t.Fatalf("krane-sentinel-%d never became ready: %v\n%s", i, err, p.Tail(40))
		}
		out = append(out, s)
	}
	return out
}

func httpOK(ctx context.Context, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %d %s", url, resp.StatusCode, strings.TrimSpace(string(b)))
	}
	return nil
}

// waitInstancesReady waits until every sentinel counts n ready instances
// of deployment id (its metric), and returns when the last one did.
func waitInstancesReady(t *testing.T, ss []sentinelProc, id string, n int) time.Time {
	t.Helper()
	series := fmt.Sprintf(`krane_sentinel_instances_ready{deployment=%q`, id)
	for _, s := range ss {
		waitFor(t, time.Minute, fmt.Sprintf("%s counting %d ready instances of %s", s.admin, n, id), func() error {
			resp, err := http.Get(s.admin + "/metrics")
			if err != nil {
				return err
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			for _, line := range strings.Split(string(b), "\n") {
				if strings.HasPrefix(line, series) {
					if v := line[strings.LastIndexByte(line, ' ')+1:]; v == strconv.Itoa(n) {
						return nil
					}
					return fmt.Errorf("%s", line)
				}
			}
			return fmt.Errorf("no series %s", series)
		})
	}
	return time.Now()
}

// load sends requests through the sentinels from four workers (two per
// sentinel), each one at a time, 100 a second at most.
type load struct {
	cancel context.CancelFunc
	done   sync.WaitGroup

	mu      sync.Mutex
	results []result
}

type result struct {
	sentinel   int
	start, end time.Time
	code       int
	answer     answer
	err        error
}

func (r result) String() string {
	return fmt.Sprintf("sentinel %d at %s: code %d %+v %v", r.sentinel, r.start.Format("15:04:05.000"), r.code, r.answer, r.err)
}

func startLoad(t *testing.T, ss []sentinelProc, host string) *load {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	l := &load{cancel: cancel}
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	for w := range 4 {
		s := w % len(ss)
		l.done.Add(1)
		go func() {
			defer l.done.Done()
			tick := time.NewTicker(10 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				r := result{sentinel: s, start: time.Now()}
				req, _ := http.NewRequest(http.MethodGet, ss[s].url+"/", nil)
				req.Host = host
				resp, err := client.Do(req)
				if err == nil {
					r.code = resp.StatusCode
					b, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					if r.code == http.StatusOK {
						err = json.Unmarshal(b, &r.answer)
					} else {
						err = fmt.Errorf("%s", strings.TrimSpace(string(b)))
					}
				}
				r.err, r.end = err, time.Now()
				l.mu.Lock()
				l.results = append(l.results, r)
				l.mu.Unlock()
			}
		}()
	}
	t.Cleanup(func() { l.stop() })
	return l
}

// expect waits until each sentinel has answered from deployment id.
func (l *load) expect(t *testing.T, id string) time.Time {
	t.Helper()
	var last time.Time
	for s := range 2 {
		waitFor(t, time.Minute, fmt.Sprintf("sentinel %d serving %s", s, id), func() error {
			l.mu.Lock()
			defer l.mu.Unlock()
			for _, r := range l.results {
				if r.sentinel == s && r.answer.Deployment == id {
					if r.end.After(last) {
						last = r.end
					}
					return nil
				}
			}
			return fmt.Errorf("not yet")
		})
	}
	return last
}

// switchTo waits until each sentinel answers from id, then checks that
// every request a sentinel started after its first answer from id was
// answered from id. It returns when the last sentinel first answered.
func (l *load) switchTo(t *testing.T, id string) time.Time {
	t.Helper()
	last := l.expect(t, id)
	// Requests started until now are settled once the workers move on.
	l.waitPast(t, time.Now())
	l.mu.Lock()
	defer l.mu.Unlock()
	first := map[int]time.Time{}
	for _, r := range l.results {
		if r.answer.Deployment == id && (first[r.sentinel].IsZero() || r.end.Before(first[r.sentinel])) {
			first[r.sentinel] = r.end
		}
	}
	for _, r := range l.results {
		if f, ok := first[r.sentinel]; ok && r.start.After(f) && r.err == nil && r.answer.Deployment != id {
			t.Errorf("after sentinel %d switched to %s at %s: %s", r.sentinel, id, f.Format("15:04:05.000"), r)
		}
	}
	return last
}

// waitPast waits until every worker has recorded a request that started
// after at.
func (l *load) waitPast(t *testing.T, at time.Time) {
	t.Helper()
	waitFor(t, time.Minute, "the request loop to move past "+at.Format("15:04:05.000"), func() error {
		l.mu.Lock()
		defer l.mu.Unlock()
		n := 0
		for _, r := range l.results {
			if r.start.After(at) {
				n++
			}
		}
		if n < 8 {
			return fmt.Errorf("%d requests since", n)
		}
		return nil
	})
}

// noneAfter checks that no request started after at was answered by pod
// (once the request loop has moved past at).
func (l *load) noneAfter(t *testing.T, pod string, at time.Time) {
	t.Helper()
	l.waitPast(t, at)
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range l.results {
		if r.start.After(at) && r.answer.Pod == pod {
			t.Errorf("routed to %s after it left the ready set at %s: %s", pod, at.Format("15:04:05.000"), r)
		}
	}
}

func (l *load) stop() []result {
	l.cancel()
	l.done.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	var failed []result
	for _, r := range l.results {
		if r.err != nil || r.code != http.StatusOK {
			failed = append(failed, r)
		}
	}
	return failed
}

func (l *load) total() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.results)
}
