// Package envtest starts a real Kubernetes control plane for a plugin's
// tests, the way controller-runtime's envtest does for controllers: etcd,
// kube-apiserver (RBAC and token auth on), kube-controller-manager,
// kube-scheduler, and kwok simulating the nodes, so ReplicaSets get pods and
// pods become Running and Ready. Nothing is mocked: what a plugin does to
// this cluster it does to a real API server, with real RBAC
// (ServiceAccountConfig mints a ServiceAccount's token, so a plugin's
// rbac.yaml is tested for real).
//
// It is a test-only package of the sdk module: only a test binary links
// it. The binaries come from a cache outside the checkout (see KubeBinDir);
// `go run krane.dev/sdk/envtest/setup` builds them once through the Go
// module proxy. A test package shares one cluster:
//
//	func TestMain(m *testing.M) { envtest.Main(m) }
//
//	func TestMyPlugin(t *testing.T) {
//		cluster := envtest.Shared(t)
//		// cluster.Kubeconfig, cluster.Client, cluster.ServiceAccountConfig(...)
//	}
//
// Every process dies with the test binary (Pdeathsig) and logs to a file
// under the package's work directory, kept (and its path printed) when a
// test fails.
//
// Pods are simulated by kwok: they become Running and Ready moments after
// they are scheduled, except images whose name contains "kwok-fail-pull"
// (ImagePullBackOff) or "kwok-crash-loop" (CrashLoopBackOff).
package envtest

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	_ "embed"
	"encoding/pem"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

//go:embed kwok-stages.yaml
var kwokStages []byte

// Options shape a cluster.
type Options struct {
	// Name appears in log directory names; default "kube".
	Name string
	// Zones of the simulated nodes; default zone-a, zone-b, zone-c.
	Zones []string
	// NodePools are the simulated nodes; default one pool "node" of 2
	// untainted nodes per zone.
	NodePools []NodePool
	// CRDs are manifests of CustomResourceDefinitions installed once the
	// API server is up (New waits until they are served).
	CRDs [][]byte
	// DisabledControllers are kube-controller-manager controllers not run
	// (names as its --controllers flag takes them, e.g.
	// "endpointslice-controller"): a test that plays one of them itself,
	// say writing EndpointSlices that point at its own servers, turns the
	// real one off.
	DisabledControllers []string
}

// NodePool is a group of simulated nodes, PerZone of them in each zone,
// named <Name>-<zone>-<i>.
type NodePool struct {
	Name    string
	PerZone int
	Labels  map[string]string
	Taints  []corev1.Taint
}

func (o *Options) defaults() {
	if o.Name == "" {
		o.Name = "kube"
	}
	if len(o.Zones) == 0 {
		o.Zones = []string{"zone-a", "zone-b", "zone-c"}
	}
	if len(o.NodePools) == 0 {
		o.NodePools = []NodePool{{Name: "node", PerZone: 2}}
	}
}

// LabelZone is the zone label every simulated node carries.
const LabelZone = "topology.kubernetes.io/zone"

const adminToken = "krane-testenv-admin-token"

// Cluster is a running control plane.
type Cluster struct {
	Name string
	// Config is an admin (system:masters) client config.
	Config *rest.Config
	// Kubeconfig is the path of an admin kubeconfig file.
	Kubeconfig string
	Client     kubernetes.Interface
	Dynamic    dynamic.Interface

	opts     Options
	dir      string
	url      string
	certDir  string
	etcdURL  string
	etcdPeer string

	mu        sync.Mutex
	procs     map[string]*Process
	cmds      map[string][]string // binary and args of each process, for restarts
	apiArgs   []string
	stopped   bool
	startTime time.Duration
}

var shared Lazy[*Cluster]

// Shared returns the test package's cluster (default Options), starting it
// on first use; Main stops it.
func Shared(tb testing.TB) *Cluster {
	return shared.Get(tb, func() (*Cluster, error) {
		c, err := New(Options{})
		if err == nil {
			OnStop(c.Stop)
		}
		return c, err
	})
}

// Start starts an extra cluster that is stopped when tb's test ends (e.g. one
// per region in a multi-region test).
func Start(tb testing.TB, opts Options) *Cluster {
	tb.Helper()
	c, err := New(opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(c.Stop)
	return c
}

// New starts a cluster. Call Stop when done.
func New(opts Options) (*Cluster, error) {
	opts.defaults()
	begin := time.Now()
	bins := map[string]string{}
	for _, b := range []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok"} {
		p, err := KubeBinary(b)
		if err != nil {
			return nil, err
		}
		bins[b] = p
	}
	dir, err := SubDir(opts.Name)
	if err != nil {
		return nil, err
	}
	c := &Cluster{Name: opts.Name, opts: opts, dir: dir, procs: map[string]*Process{}, cmds: map[string][]string{}}
	ok := false
	defer func() {
		if !ok {
			c.Stop()
		}
	}()
	if err := c.startEtcd(bins["etcd"]); err != nil {
		return nil, err
	}
	if err := c.startAPIServer(bins["kube-apiserver"]); err != nil {
		return nil, err
	}
	if err := c.writeKubeconfig(); err != nil {
		return nil, err
	}
	// The rest start in parallel; each only needs the API server.
	kcmArgs := []string{
		"--kubeconfig", c.Kubeconfig,
		"--service-account-private-key-file", filepath.Join(dir, "sa.key"),
		"--root-ca-file", filepath.Join(c.certDir, "apiserver.crt"),
		"--controllers", controllers(c.opts.DisabledControllers),
		"--leader-elect=false",
		"--bind-address", "127.0.0.1",
		"--secure-port", "0",
		"--kube-api-qps", "500",
		"--kube-api-burst", "1000",
		"--concurrent-replicaset-syncs", "20",
		"--concurrent-deployment-syncs", "20",
		// Simulated nodes never fail unless a test makes them: a late kwok
		// heartbeat must not mark every node NotReady (and its pods with it;
		// kwok would not make them Ready again).
		"--node-monitor-grace-period", "10m",
	}
	if err := c.start("kube-controller-manager", bins["kube-controller-manager"], kcmArgs); err != nil {
		return nil, err
	}
	schedArgs := []string{"--kubeconfig", c.Kubeconfig, "--leader-elect=false", "--bind-address", "127.0.0.1", "--secure-port", "0", "--kube-api-qps", "500", "--kube-api-burst", "1000"}
	if err := c.start("kube-scheduler", bins["kube-scheduler"], schedArgs); err != nil {
		return nil, err
	}
	stages := filepath.Join(dir, "kwok-stages.yaml")
	if err := os.WriteFile(stages, kwokStages, 0o644); err != nil {
		return nil, err
	}
	// Node heartbeats are Lease renewals (as the kubelet's), every 10s.
	kwokArgs := []string{"--kubeconfig", c.Kubeconfig, "--manage-all-nodes=true", "--server-address", "127.0.0.1:0", "--cidr", "10.244.0.1/16", "--config", stages, "--node-lease-duration-seconds", "40"}
	if err := c.start("kwok", bins["kwok"], kwokArgs); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := c.createNodes(ctx); err != nil {
		return nil, err
	}
	for _, crd := range opts.CRDs {
		if err := c.InstallCRDs(ctx, crd); err != nil {
			return nil, err
		}
	}
	if err := c.waitNodesReady(ctx); err != nil {
		return nil, err
	}
	// A component that refused its flags exits at once, and the cluster
	// would look up while nothing creates pods: wait until the
	// controller-manager has done some work (the default namespace's
	// ServiceAccount is its), or say that it exited.
	if err := c.waitControllerManager(ctx); err != nil {
		return nil, err
	}
	for _, name := range []string{"kube-scheduler", "kwok"} {
		if p := c.proc(name); p != nil && p.Exited() {
			return nil, fmt.Errorf("envtest: %s exited while the cluster started:\n%s", name, p.Tail(20))
		}
	}
	c.startTime = time.Since(begin)
	ok = true
	return c, nil
}

// StartupTime is how long New took.
func (c *Cluster) StartupTime() time.Duration { return c.startTime }

// Dir is the cluster's work directory (data and logs).
func (c *Cluster) Dir() string { return c.dir }

// Host is the API server URL.
func (c *Cluster) Host() string { return c.url }

func (c *Cluster) start(name, bin string, args []string) error {
	p, err := StartProcess(c.dir, name, bin, args, nil)
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.procs[name] = p
	c.cmds[name] = append([]string{bin}, args...)
	c.mu.Unlock()
	return nil
}

// StopComponent stops one of kube-controller-manager, kube-scheduler or
// kwok (e.g. so a benchmark measures API writes without pods being made).
func (c *Cluster) StopComponent(name string) {
	if p := c.proc(name); p != nil {
		p.Stop(10 * time.Second)
	}
}

// StartComponent starts a component stopped with StopComponent again.
func (c *Cluster) StartComponent(name string) error {
	c.mu.Lock()
	cmd := c.cmds[name]
	c.mu.Unlock()
	if p := c.proc(name); p != nil && !p.Exited() {
		return nil
	}
	if len(cmd) == 0 {
		return fmt.Errorf("no component %q", name)
	}
	return c.start(name, cmd[0], cmd[1:])
}

// Pid is the process id of one of the cluster's components
// (kube-apiserver, etcd, kube-controller-manager, kube-scheduler), 0 when
// it is not running: to read what it costs, as a benchmark does.
func (c *Cluster) Pid(component string) int {
	if p := c.proc(component); p != nil && !p.Exited() {
		return p.Pid()
	}
	return 0
}

func (c *Cluster) proc(name string) *Process {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.procs[name]
}

func (c *Cluster) startEtcd(bin string) error {
	ports, err := FreePorts(2)
	if err != nil {
		return err
	}
	c.etcdURL = fmt.Sprintf("http://127.0.0.1:%d", ports[0])
	c.etcdPeer = fmt.Sprintf("http://127.0.0.1:%d", ports[1])
	args := []string{
		"--name", "default",
		"--data-dir", filepath.Join(c.dir, "etcd"),
		"--listen-client-urls", c.etcdURL,
		"--advertise-client-urls", c.etcdURL,
		"--listen-peer-urls", c.etcdPeer,
		"--initial-advertise-peer-urls", c.etcdPeer,
		"--initial-cluster", "default=" + c.etcdPeer,
		"--unsafe-no-fsync",
		"--quota-backend-bytes", "4294967296",
		"--log-level", "warn",
	}
	if err := c.start("etcd", bin, args); err != nil {
		return err
	}
	// Generous bounds: WaitReady returns at once if the process exits, so
	// they only matter for a live server slowed by a loaded machine.
	return c.proc("etcd").WaitReady(2*time.Minute, func(ctx context.Context) error {
		return Probe(ctx, http.DefaultClient, c.etcdURL+"/health", "")
	})
}

func (c *Cluster) startAPIServer(bin string) error {
	if err := writeServiceAccountKey(c.dir); err != nil {
		return err
	}
	tokens := filepath.Join(c.dir, "tokens.csv")
	if err := os.WriteFile(tokens, []byte(adminToken+",admin,admin-uid,system:masters\n"), 0o600); err != nil {
		return err
	}
	port, err := FreePort()
	if err != nil {
		return err
	}
	c.certDir = filepath.Join(c.dir, "pki")
	c.url = fmt.Sprintf("https://127.0.0.1:%d", port)
	c.apiArgs = []string{
		"--etcd-servers", c.etcdURL,
		"--secure-port", fmt.Sprint(port),
		"--bind-address", "127.0.0.1",
		"--advertise-address", "127.0.0.1",
		"--cert-dir", c.certDir,
		"--token-auth-file", tokens,
		"--authorization-mode", "RBAC",
		"--service-account-key-file", filepath.Join(c.dir, "sa.pub"),
		"--service-account-signing-key-file", filepath.Join(c.dir, "sa.key"),
		"--service-account-issuer", "https://kubernetes.default.svc",
		"--service-cluster-ip-range", "10.96.0.0/16",
		"--max-requests-inflight", "1000",
		"--max-mutating-requests-inflight", "500",
	}
	return c.runAPIServer(bin)
}

func (c *Cluster) runAPIServer(bin string) error {
	if err := c.start("kube-apiserver", bin, c.apiArgs); err != nil {
		return err
	}
	insecure := &http.Client{Transport: &http.Transport{TLSClientConfig: insecureTLS()}}
	// A restart under load took longer than 90 s to pass /readyz (make
	// chaos, apiserver-crash, with other tests running): see etcd above.
	return c.proc("kube-apiserver").WaitReady(5*time.Minute, func(ctx context.Context) error {
		return Probe(ctx, insecure, c.url+"/readyz", adminToken)
	})
}

// RestartAPIServer stops the API server (SIGTERM, or SIGKILL with kill: a
// crash) and starts it again on the same port and storage.
func (c *Cluster) RestartAPIServer(kill bool) error {
	bin, err := KubeBinary("kube-apiserver")
	if err != nil {
		return err
	}
	if kill {
		c.proc("kube-apiserver").Kill()
	} else {
		c.proc("kube-apiserver").Stop(20 * time.Second)
	}
	return c.runAPIServer(bin)
}

func (c *Cluster) writeKubeconfig() error {
	ca, err := os.ReadFile(filepath.Join(c.certDir, "apiserver.crt"))
	if err != nil {
		return fmt.Errorf("read API server certificate: %w", err)
	}
	c.Config = &rest.Config{
		Host:            c.url,
		BearerToken:     adminToken,
		TLSClientConfig: rest.TLSClientConfig{CAData: ca},
		QPS:             500,
		Burst:           1000,
		// The admin client talks to a test server; its warnings (e.g. about
		// formats in the cilium CRD's schema) would only clutter output.
		WarningHandler: rest.NoWarnings{},
	}
	c.Kubeconfig = filepath.Join(c.dir, "admin.kubeconfig")
	if err := writeKubeconfigFile(c.Kubeconfig, c.url, ca, "admin", adminToken); err != nil {
		return err
	}
	if c.Client, err = kubernetes.NewForConfig(c.Config); err != nil {
		return err
	}
	c.Dynamic, err = dynamic.NewForConfig(c.Config)
	return err
}

// Stop stops every process of the cluster.
func (c *Cluster) Stop() {
	c.mu.Lock()
	if c.stopped {
		c.mu.Unlock()
		return
	}
	c.stopped = true
	procs := c.procs
	c.mu.Unlock()
	for _, name := range []string{"kwok", "kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"} {
		if p := procs[name]; p != nil {
			p.Stop(10 * time.Second)
		}
	}
}

func (c *Cluster) createNodes(ctx context.Context) error {
	for _, zone := range c.opts.Zones {
		for _, pool := range c.opts.NodePools {
			for i := range pool.PerZone {
				if err := c.AddNode(ctx, fmt.Sprintf("%s-%s-%d", pool.Name, zone, i), zone, pool.Labels, pool.Taints...); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// AddNode creates one more simulated node in zone with labels and taints;
// kwok marks it Ready.
func (c *Cluster) AddNode(ctx context.Context, name, zone string, labels map[string]string, taints ...corev1.Taint) error {
	n := node(name, zone, labels, taints...)
	_, err := c.Client.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create node %s: %w", n.Name, err)
	}
	return nil
}

func node(name, zone string, extra map[string]string, taints ...corev1.Taint) *corev1.Node {
	capacity := corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("64"),
		corev1.ResourceMemory: resource.MustParse("256Gi"),
		corev1.ResourcePods:   resource.MustParse("500"),
	}
	labels := map[string]string{
		LabelZone:                zone,
		"kubernetes.io/hostname": name,
		"kubernetes.io/os":       "linux",
		"type":                   "kwok",
	}
	for k, v := range extra {
		labels[k] = v
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:        name,
			Labels:      labels,
			Annotations: map[string]string{"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
		},
		Spec:   corev1.NodeSpec{Taints: taints},
		Status: corev1.NodeStatus{Capacity: capacity, Allocatable: capacity},
	}
}

func (c *Cluster) waitNodesReady(ctx context.Context) error {
	want := 0
	for _, p := range c.opts.NodePools {
		want += len(c.opts.Zones) * p.PerZone
	}
	for {
		nodes, err := c.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err == nil {
			ready := 0
			for _, n := range nodes.Items {
				for _, cond := range n.Status.Conditions {
					if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
						ready++
					}
				}
			}
			if ready >= want {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("kwok did not mark %d nodes Ready (log %s):\n%s", want, c.proc("kwok").LogPath, c.proc("kwok").Tail(20))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func writeServiceAccountKey(dir string) error {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	priv := pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)})
	pubDER, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return err
	}
	pub := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER})
	if err := os.WriteFile(filepath.Join(dir, "sa.key"), priv, 0o600); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "sa.pub"), pub, 0o644)
}

func writeKubeconfigFile(path, server string, ca []byte, user, token string) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["test"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: ca}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: user}
	cfg.CurrentContext = "test"
	return clientcmd.WriteToFile(*cfg, path)
}

// Probe is a readiness check: GET url (with a bearer token when given)
// must answer 200.
func Probe(ctx context.Context, client *http.Client, url, token string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return nil
}

// controllers is the --controllers value: every controller, less disabled.
func controllers(disabled []string) string {
	v := "*"
	for _, d := range disabled {
		v += ",-" + d
	}
	return v
}

// waitControllerManager waits until kube-controller-manager created the
// ServiceAccount of namespace default (proof that it runs its
// controllers), and fails at once, with its log, if it exited instead.
func (c *Cluster) waitControllerManager(ctx context.Context) error {
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		if p := c.proc("kube-controller-manager"); p != nil && p.Exited() {
			return fmt.Errorf("envtest: kube-controller-manager exited while the cluster started:\n%s", p.Tail(20))
		}
		_, err := c.Client.CoreV1().ServiceAccounts(metav1.NamespaceDefault).Get(ctx, "default", metav1.GetOptions{})
		if err == nil {
			return nil
		}
		if !apierrors.IsNotFound(err) {
			return fmt.Errorf("envtest: wait for kube-controller-manager: %w", err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("envtest: kube-controller-manager made no ServiceAccount for namespace default: %w", ctx.Err())
		case <-t.C:
		}
	}
}
