// Package sentineltest sends real traffic through Krane's sentinels in a
// test cluster whose nodes are simulated (kwok runs no container), for the
// e2e test of routing and the benchmark of the route switch.
//
// A Mirror plays the two parts a real cluster would: the kubelet (a real
// HTTP server per ready pod of a Krane deployment, on this machine's
// address, answering with the pod's name) and Kubernetes' EndpointSlice
// controller (an EndpointSlice per pod, labelled for the deployment's
// Service, pointing at that server). The cluster must run without its
// own EndpointSlice controller (kubeenv.Options.WithoutEndpointSlices),
// whose slices would point at the simulated pods' addresses.
// StartSentinels runs real krane-sentinel processes against that cluster,
// as the account plugins/sentinel/pods.yaml grants.
package sentineltest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
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

// Answer is what an instance's server says: which pod answered.
type Answer struct {
	Deployment string `json:"deployment"`
	Pod        string `json:"pod"`
}

// Mirror makes instances (a server and an EndpointSlice) for the ready pods
// of Krane's deployments.
type Mirror struct {
	cluster *kubeenv.Cluster
	ip      string
	seed    int64
	delay   time.Duration

	mu        sync.Mutex
	instances map[string]*instance // namespace/pod
	err       error
	trigger   chan struct{}
	pods      cache.Indexer
	services  cache.Indexer
	stop      func()
}

type instance struct {
	ns, pod, deployment, service string
	srv                          *http.Server
	port                         int32
	ready                        bool
}

// StartMirror starts mirroring the cluster's deployments. Instances listen
// on ip (testenv.HostIP: the API server refuses loopback endpoints) and
// answer after a random delay below maxDelay (seeded), so that requests are
// in flight when routes switch; 0 answers at once.
func StartMirror(c *kubeenv.Cluster, ip string, seed int64, maxDelay time.Duration) (*Mirror, error) {
	m := &Mirror{cluster: c, ip: ip, seed: seed, delay: maxDelay, instances: map[string]*instance{}, trigger: make(chan struct{}, 1)}
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
			return nil, err
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
					m.mu.Lock()
					m.err = errors.Join(m.err, err)
					m.mu.Unlock()
				}
			}
		}
	}()
	m.stop = func() {
		cancel()
		<-done
		f.Shutdown()
		m.mu.Lock()
		defer m.mu.Unlock()
		for _, in := range m.instances {
			_ = in.srv.Close()
		}
	}
	return m, nil
}

// Stop closes every instance's server and stops mirroring.
func (m *Mirror) Stop() { m.stop() }

// Err is what went wrong while mirroring, if anything.
func (m *Mirror) Err() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.err
}

func (m *Mirror) poke() {
	select {
	case m.trigger <- struct{}{}:
	default:
	}
}

// sync makes an instance for every ready pod whose deployment has its
// Service, and removes those of pods gone.
func (m *Mirror) sync(ctx context.Context) error {
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
		err := m.cluster.Client.DiscoveryV1().EndpointSlices(in.ns).Delete(ctx, sliceName(in.pod), metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return err
		}
		// Requests in flight finish: Shutdown waits for them.
		go func() { _ = in.srv.Shutdown(context.Background()) }()
	}
	return nil
}

func sliceName(pod string) string { return "mirror-" + pod }

func (m *Mirror) serviceOf(ns, id string) string {
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

func (m *Mirror) serve(p *corev1.Pod, id, svc string) (*instance, error) {
	l, err := net.Listen("tcp", net.JoinHostPort(m.ip, "0"))
	if err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(uint64(m.seed), uint64(len(m.instances))))
	var rngMu sync.Mutex
	body, _ := json.Marshal(Answer{Deployment: id, Pod: p.Name})
	in := &instance{ns: p.Namespace, pod: p.Name, deployment: id, service: svc, port: int32(l.Addr().(*net.TCPAddr).Port), ready: true}
	in.srv = &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if m.delay > 0 {
			rngMu.Lock()
			d := time.Duration(rng.Int64N(int64(m.delay)))
			rngMu.Unlock()
			time.Sleep(d) // the request's service time, not a wait for anything
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(body)
	})}
	go func() { _ = in.srv.Serve(l) }()
	return in, nil
}

func (m *Mirror) writeSlice(ctx context.Context, in *instance) error {
	ready := in.ready
	http, tcp := "http", corev1.ProtocolTCP
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: sliceName(in.pod), Namespace: in.ns, Labels: map[string]string{
			discoveryv1.LabelServiceName: in.service,
			discoveryv1.LabelManagedBy:   "sentineltest.krane.dev",
		}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{m.ip}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}}},
		Ports:       []discoveryv1.EndpointPort{{Name: &http, Port: &in.port, Protocol: &tcp}},
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

// PodsOf lists the pods of a deployment that have an instance, sorted.
func (m *Mirror) PodsOf(id string) []string {
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

func (m *Mirror) find(pod string) (*instance, error) {
	for _, in := range m.instances {
		if in.pod == pod {
			return in, nil
		}
	}
	return nil, fmt.Errorf("no instance for pod %s", pod)
}

// SetReady marks a pod's endpoint ready or not, as a health check would.
func (m *Mirror) SetReady(pod string, ready bool) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	in, err := m.find(pod)
	if err != nil {
		return err
	}
	in.ready = ready
	return m.writeSlice(context.Background(), in)
}

// Kill closes a pod's server at once (connections refused from now on);
// its slice says nothing.
func (m *Mirror) Kill(pod string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	in, err := m.find(pod)
	if err != nil {
		return err
	}
	return in.srv.Close()
}

// Sentinel is one krane-sentinel process.
type Sentinel struct {
	// URL is its data port, Admin its admin port (http://127.0.0.1:P).
	URL, Admin string
	Process    *testenv.Process
}

// StartSentinels runs n krane-sentinel processes (bin) for the sentinel
// whose routes name deployment live and host, as ServiceAccount
// sentinel/krane-sentinel, and returns once each is ready. Logs go to dir.
func StartSentinels(ctx context.Context, c *kubeenv.Cluster, bin, dir string, n int, live, host string) ([]*Sentinel, error) {
	var cm *corev1.ConfigMap
	err := poll(ctx, 2*time.Minute, func() error {
		list, err := c.Client.CoreV1().ConfigMaps(sentinel.DefaultNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=sentinel"})
		if err != nil {
			return err
		}
		for i := range list.Items {
			r, err := routes.Parse([]byte(list.Items[i].Data[routes.Key]))
			if err == nil && r.Backend != nil && r.Backend.DeploymentID == live && slices.Contains(r.Hosts, host) {
				cm = &list.Items[i]
				return nil
			}
		}
		return fmt.Errorf("no routes ConfigMap of %d names %s and %s", len(list.Items), live, host)
	})
	if err != nil {
		return nil, err
	}
	r, _ := routes.Parse([]byte(cm.Data[routes.Key]))
	_, kubeconfig, err := c.ServiceAccountConfig(ctx, sentinel.DefaultNamespace, sentinel.DefaultServiceAccount)
	if err != nil {
		return nil, err
	}
	var out []*Sentinel
	for i := range n {
		ports, err := testenv.FreePorts(2)
		if err != nil {
			return out, err
		}
		p, err := testenv.StartProcess(dir, fmt.Sprintf("krane-sentinel-%d", i), bin, nil, []string{
			"UNKEY_SENTINEL_ID=" + r.SentinelID, "UNKEY_ENVIRONMENT_ID=" + r.EnvironmentID, "UNKEY_REGION=test",
			"UNKEY_HTTP_PORT=" + strconv.Itoa(ports[0]),
			"KRANE_SENTINEL_ROUTES=" + cm.Namespace + "/" + cm.Name,
			"KRANE_SENTINEL_ADMIN_ADDR=127.0.0.1:" + strconv.Itoa(ports[1]),
			"KUBECONFIG=" + kubeconfig,
			"KRANE_SENTINEL_ACCESS_LOG=false",
		})
		if err != nil {
			return out, err
		}
		s := &Sentinel{URL: fmt.Sprintf("http://127.0.0.1:%d", ports[0]), Admin: fmt.Sprintf("http://127.0.0.1:%d", ports[1]), Process: p}
		out = append(out, s)
		if err := p.WaitReady(time.Minute, func(ctx context.Context) error { return stack.HTTPOK(ctx, s.URL+"/_krane/sentinel/ready") }); err != nil {
			return out, fmt.Errorf("krane-sentinel-%d never became ready: %w\n%s", i, err, p.Tail(40))
		}
	}
	return out, nil
}

// InstancesReady is the sentinel's count of ready instances of deployment
// id (its metric krane_sentinel_instances_ready).
func (s *Sentinel) InstancesReady(ctx context.Context, id string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.Admin+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return 0, err
	}
	series := fmt.Sprintf(`krane_sentinel_instances_ready{deployment=%q`, id)
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, series) {
			return strconv.Atoi(line[strings.LastIndexByte(line, ' ')+1:])
		}
	}
	return 0, fmt.Errorf("%s/metrics has no series %s", s.Admin, series)
}

// Get sends one request for host through the sentinel and returns what
// answered.
func (s *Sentinel) Get(ctx context.Context, client *http.Client, host string) (int, Answer, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.URL+"/", nil)
	if err != nil {
		return 0, Answer{}, err
	}
	req.Host = host
	resp, err := client.Do(req)
	if err != nil {
		return 0, Answer{}, err
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return resp.StatusCode, Answer{}, err
	}
	var a Answer
	if resp.StatusCode != http.StatusOK {
		return resp.StatusCode, a, fmt.Errorf("%s", strings.TrimSpace(string(b)))
	}
	return resp.StatusCode, a, json.Unmarshal(b, &a)
}

// poll runs check until it succeeds or timeout passes.
func poll(ctx context.Context, timeout time.Duration, check func() error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		err := check()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("after %s: %w", timeout, err)
		case <-t.C:
		}
	}
}
