// Package stack starts the whole system on one machine, from real parts
// and real binaries: a private MySQL, a Restate server, one simulated
// Kubernetes cluster per region (kubeenv), `ctrl serve`, and one `krane run`
// per region with every plugin, each krane authenticated with its own
// cluster token and reaching its API server through the ServiceAccount and
// RBAC of deploy/. The demo, the end-to-end suite, the benchmarks and the
// chaos run use it.
package stack

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"krane.dev/ctrl/restateendpoint"
	"krane.dev/ctrl/vault"
	"krane.dev/host/config"
	"krane.dev/internal/testenv"
	"krane.dev/internal/testenv/kubeenv"
)

// Options shape a stack.
type Options struct {
	// Regions get one cluster and one krane each; default local-a, local-b.
	Regions []string
	// BinDir holds ctrl, krane and the built-in krane-plugin-* binaries
	// that KraneConfig enables (make build puts them in bin/); empty means
	// build them now.
	BinDir string
	// KraneConfig is the krane.hcl every krane runs, with per-region
	// overrides through KRANE_* variables; default: the repository's.
	KraneConfig string
	// KraneEnv adds KRANE_* overrides per region (e.g. disable a controller).
	KraneEnv map[string][]string
	// CtrlEnv adds CTRL_* settings to ctrl serve.
	CtrlEnv []string
	// Progress receives one line per step; nil discards.
	Progress io.Writer
	// Kube shapes each cluster (zones, node pools).
	Kube kubeenv.Options
	// Traffic readies the stack for real requests through sentinels
	// (internal/sentineltest): its clusters run without their EndpointSlice
	// controller, which the test plays for the simulated pods, and it finds
	// krane-sentinel (Bin) with the other binaries.
	Traffic bool
	// ProxyCtrl routes each krane's connection to ctrl through a loopback
	// proxy that tests can cut or stall (Proxy(region)).
	ProxyCtrl bool
	// ReplicableMySQL gives MySQL a binary log (server id 1), so that a
	// replica can follow it (testenv.StartReplicableMySQLServer).
	ReplicableMySQL bool
	// CtrlOnly starts MySQL, Restate and ctrl, and no cluster or krane
	// (Regions are then ignored): for clients that play the clusters, like
	// the fleet benchmark.
	CtrlOnly bool
	// RepoDir is the tree krane.hcl and the manifests krane is installed
	// with are read from; default: this repository. The upgrade suite
	// points it at the baseline release's tree, with BinDir at that
	// release's binaries, to run the previous release as it was shipped.
	RepoDir string
}

// Stack is a running system.
type Stack struct {
	opts    Options
	dir     string
	bin     map[string]string
	MySQL   *testenv.MySQL
	Restate *testenv.Restate
	DSN     string

	Clusters map[string]*kubeenv.Cluster

	CtrlAddr   string // gRPC host:port
	CtrlHTTP   string // http://host:port (health, metrics)
	ConsoleURL string // http://host:port of ctrl's web console
	// CtrlEndpoint is the URL Restate calls ctrl's services at: the
	// endpoint's address and the path of ctrl's line.
	CtrlEndpoint  string
	OperatorToken string
	ClusterTokens map[string]string
	KraneHTTP     map[string]string // region -> http://host:port (health, metrics)

	mu        sync.Mutex
	ctrl      *testenv.Process
	replicas  []*CtrlReplica
	kranes    map[string]*testenv.Process
	kraneEnvs map[string][]string
	proxies   map[string]*testenv.Proxy
	ctrlPorts [4]int
	// manifestTrees: per region, the tree of krane's manifests when not
	// RepoDir's (ApplyKraneManifests).
	manifestTrees map[string]string
}

// Binaries the stack runs.
var binaries = map[string]string{
	"ctrl":                    "krane.dev/cmd/ctrl",
	"krane":                   "krane.dev/cmd/krane",
	"krane-plugin-deployment": "krane.dev/plugins/deployment",
	"krane-plugin-sentinel":   "krane.dev/plugins/sentinel",
	"krane-plugin-cilium":     "krane.dev/plugins/cilium",
	"krane-sentinel":          "krane.dev/cmd/krane-sentinel",
}

// SentinelImage is the image of the sentinels deploys create.
const SentinelImage = "registry.local/krane/sentinel:1.0.0"

// ClusterID is the cluster id of a region's cluster.
func ClusterID(region string) string { return region + "-1" }

// Start brings the whole system up. Stop it with Stop (or let the process
// exit: every child dies with it).
func Start(ctx context.Context, o Options) (*Stack, error) {
	if o.CtrlOnly {
		o.Regions = nil
	} else if len(o.Regions) == 0 {
		o.Regions = []string{"local-a", "local-b"}
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	if o.Traffic {
		o.Kube.WithoutEndpointSlices = true
	}
	// Steps run concurrently; the caller's writer need not be safe for that.
	o.Progress = &lockedWriter{w: o.Progress}
	s := &Stack{opts: o, bin: map[string]string{}, Clusters: map[string]*kubeenv.Cluster{}, ClusterTokens: map[string]string{},
		KraneHTTP: map[string]string{}, kranes: map[string]*testenv.Process{}, kraneEnvs: map[string][]string{}, proxies: map[string]*testenv.Proxy{}}
	ok := false
	defer func() {
		if !ok {
			s.Stop()
		}
	}()
	dir, err := testenv.SubDir("stack")
	if err != nil {
		return nil, err
	}
	s.dir = dir
	if s.opts.KraneConfig == "" {
		if s.opts.KraneConfig, err = s.repoFile("krane.hcl"); err != nil {
			return nil, err
		}
	}
	if err := s.step("binaries", s.findBinaries); err != nil {
		return nil, err
	}

	// MySQL, Restate and the clusters are independent: start them together.
	var wg sync.WaitGroup
	errs := make([]error, 2+len(o.Regions))
	wg.Add(2 + len(o.Regions))
	go func() {
		defer wg.Done()
		errs[0] = s.step("MySQL", func() (err error) {
			if s.opts.ReplicableMySQL {
				s.MySQL, err = testenv.StartReplicableMySQLServer(1)
				return err
			}
			s.MySQL, err = testenv.StartMySQL()
			return err
		})
	}()
	go func() {
		defer wg.Done()
		errs[1] = s.step("Restate", func() (err error) {
			s.Restate, err = testenv.StartRestate()
			return err
		})
	}()
	var cmu sync.Mutex
	for i, region := range o.Regions {
		go func() {
			defer wg.Done()
			errs[2+i] = s.step("Kubernetes cluster "+region+" (etcd, apiserver, controller-manager, scheduler, kwok nodes)", func() error {
				ko := o.Kube
				ko.Name = region
				if len(ko.Zones) == 0 {
					ko.Zones = []string{region + "-z1", region + "-z2", region + "-z3"}
				}
				c, err := kubeenv.New(ko)
				if err != nil {
					return err
				}
				cmu.Lock()
				s.Clusters[region] = c
				cmu.Unlock()
				return nil
			})
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if err := s.step("database", s.createDatabase); err != nil {
		return nil, err
	}
	if err := s.step("ctrl", s.startCtrl); err != nil {
		return nil, err
	}
	if err := s.step("cluster registrations and operator token", s.register); err != nil {
		return nil, err
	}
	for _, region := range o.Regions {
		if err := s.step("krane for "+region, func() error { return s.startKrane(ctx, region) }); err != nil {
			return nil, err
		}
	}
	ok = true
	return s, nil
}

func (s *Stack) step(what string, f func() error) error {
	begin := time.Now()
	fmt.Fprintf(s.opts.Progress, "==> %s: starting\n", what)
	if err := f(); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	fmt.Fprintf(s.opts.Progress, "==> %s: ready in %s\n", what, time.Since(begin).Round(10*time.Millisecond))
	return nil
}

// neededBinaries names the binaries a stack of o runs: ctrl; krane, unless
// o is CtrlOnly; and the built-in plugins o's krane.hcl enables in some
// region (with that region's KRANE_* overrides).
func neededBinaries(o Options) (map[string]string, error) {
	need := map[string]string{"ctrl": binaries["ctrl"]}
	if o.CtrlOnly {
		return need, nil
	}
	need["krane"] = binaries["krane"]
	if o.Traffic {
		need["krane-sentinel"] = binaries["krane-sentinel"]
	}
	for _, region := range o.Regions {
		env := append([]string{"KRANE_REGION=" + region, "KRANE_CLUSTER_ID=" + ClusterID(region), "KRANE_TOKEN=stack"}, o.KraneEnv[region]...)
		cfg, err := config.Load(o.KraneConfig, env)
		if err != nil {
			return nil, fmt.Errorf("the krane.hcl of region %s: %w", region, err)
		}
		for _, ctl := range cfg.Enabled() {
			name := filepath.Base(ctl.Path)
			if pkg, ok := binaries[name]; ok {
				need[name] = pkg
			}
		}
	}
	return need, nil
}

func (s *Stack) findBinaries() error {
	if s.opts.BinDir != "" {
		abs, err := filepath.Abs(s.opts.BinDir)
		if err != nil {
			return err
		}
		s.opts.BinDir = abs
	}
	need, err := neededBinaries(s.opts)
	if err != nil {
		return err
	}
	for name, pkg := range need {
		if s.opts.BinDir != "" {
			p := filepath.Join(s.opts.BinDir, name)
			if _, err := os.Stat(p); err != nil {
				return fmt.Errorf("%s not found in %s: run `make build`", name, s.opts.BinDir)
			}
			s.bin[name] = p
			continue
		}
		p, err := testenv.BuildBinary(pkg, name)
		if err != nil {
			return err
		}
		s.bin[name] = p
	}
	// Plugins are found next to each other: link them into one directory.
	pluginDir := s.PluginDir()
	if err := os.MkdirAll(pluginDir, 0o755); err != nil {
		return err
	}
	for name, p := range s.bin {
		if strings.HasPrefix(name, "krane-plugin-") {
			if err := os.Symlink(p, filepath.Join(pluginDir, name)); err != nil {
				return err
			}
		}
	}
	return nil
}

// Bin is the path of one of the stack's binaries.
func (s *Stack) Bin(name string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.bin[name]
}

// UseBinary makes path the stack's binary name from the next start of
// what runs it: ctrl or krane, or a plugin (krane-plugin-*, linked into
// the plugin directory; a krane's next start or reload runs it). An
// upgrade replaces a release's binaries one by one.
func (s *Stack) UseBinary(name, path string) error {
	s.mu.Lock()
	s.bin[name] = path
	s.mu.Unlock()
	if !strings.HasPrefix(name, "krane-plugin-") {
		return nil
	}
	link := filepath.Join(s.PluginDir(), name)
	if err := os.Remove(link); err != nil && !os.IsNotExist(err) {
		return err
	}
	return os.Symlink(path, link)
}

// PluginDir is the plugin_dir every krane of the stack runs with.
func (s *Stack) PluginDir() string { return filepath.Join(s.dir, "plugins") }

// Dir is the stack's work directory (configs, logs).
func (s *Stack) Dir() string { return s.dir }

func (s *Stack) createDatabase() error {
	s.DSN = s.MySQL.DSN("krane")
	return s.MySQL.CreateDatabase("krane")
}

// ctrlEnv is the environment of every ctrl command the stack runs.
func (s *Stack) ctrlEnv() []string {
	s.mu.Lock()
	dsn := s.DSN
	s.mu.Unlock()
	env := []string{
		"CTRL_DB_DSN=" + dsn,
		"CTRL_GRPC_ADDR=" + s.CtrlAddr,
		"CTRL_HTTP_ADDR=" + strings.TrimPrefix(s.CtrlHTTP, "http://"),
		"CTRL_CONSOLE_ADDR=" + strings.TrimPrefix(s.ConsoleURL, "http://"),
		"CTRL_LOG_FORMAT=text",
		"CTRL_WATCH_POLL_INTERVAL=20ms",
		"CTRL_ADDR=" + s.CtrlAddr,
		"CTRL_TOKEN=" + s.OperatorToken,
		"CTRL_VAULT_KEYRING_FILE=" + s.keyringFile(),
	}
	if s.Restate != nil {
		env = append(env,
			"CTRL_RESTATE_INGRESS_URL="+s.Restate.IngressURL(),
			"CTRL_RESTATE_ADMIN_URL="+s.Restate.AdminURL(),
			fmt.Sprintf("CTRL_RESTATE_ENDPOINT_LISTEN=127.0.0.1:%d", s.ctrlPorts[2]),
			"CTRL_RESTATE_IDENTITY_KEYS="+s.Restate.IdentityKey(),
			"CTRL_SENTINEL_DEFAULT_IMAGE="+SentinelImage,
			"CTRL_SENTINEL_DEFAULT_REPLICAS=2",
		)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return append(env, s.opts.CtrlEnv...)
}

// keyringFile is the vault keyring of the stack's ctrl, so deployments may
// have secret variables.
func (s *Stack) keyringFile() string { return filepath.Join(s.dir, "vault-keyring.yaml") }

func (s *Stack) startCtrl() error {
	if _, err := os.Stat(s.keyringFile()); os.IsNotExist(err) {
		if _, err := vault.Init(s.keyringFile(), time.Now()); err != nil {
			return err
		}
	}
	if s.ctrlPorts[0] == 0 {
		ports, err := testenv.FreePorts(len(s.ctrlPorts))
		if err != nil {
			return err
		}
		copy(s.ctrlPorts[:], ports)
	}
	s.CtrlAddr = fmt.Sprintf("127.0.0.1:%d", s.ctrlPorts[0])
	s.CtrlHTTP = fmt.Sprintf("http://127.0.0.1:%d", s.ctrlPorts[1])
	s.ConsoleURL = fmt.Sprintf("http://127.0.0.1:%d", s.ctrlPorts[3])
	out, err := exec.Command(s.Bin("ctrl"), "--version").Output()
	if err != nil {
		return fmt.Errorf("%s --version: %w", s.Bin("ctrl"), err)
	}
	s.CtrlEndpoint = fmt.Sprintf("http://127.0.0.1:%d", s.ctrlPorts[2]) + restateendpoint.Base(strings.TrimSpace(string(out)))
	p, err := testenv.StartProcess(s.dir, "ctrl", s.Bin("ctrl"), []string{"serve"}, s.ctrlEnv())
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.ctrl = p
	s.mu.Unlock()
	return p.WaitReady(60*time.Second, func(ctx context.Context) error { return HTTPOK(ctx, s.CtrlHTTP+"/readyz") })
}

// SetCtrlEnv replaces the CTRL_* settings added to ctrl serve, from its
// next (re)start on.
func (s *Stack) SetCtrlEnv(env []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.opts.CtrlEnv = env
}

// CtrlPid is the process id of the stack's ctrl.
func (s *Stack) CtrlPid() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ctrl.Pid()
}

// RestartCtrl stops ctrl (SIGTERM, or SIGKILL with kill) and starts it again
// on the same addresses.
func (s *Stack) RestartCtrl(kill bool) error {
	s.mu.Lock()
	p := s.ctrl
	s.mu.Unlock()
	if kill {
		p.Kill()
	} else {
		p.Stop(20 * time.Second)
	}
	return s.startCtrl()
}

// StopCtrl stops ctrl (SIGTERM) until StartCtrl starts it again on the
// same addresses: an operator's steps that need ctrl down (a restore of
// its database) run in between.
func (s *Stack) StopCtrl() {
	s.mu.Lock()
	p := s.ctrl
	s.mu.Unlock()
	p.Stop(20 * time.Second)
}

// StartCtrl starts ctrl again after StopCtrl.
func (s *Stack) StartCtrl() error { return s.startCtrl() }

// UseDatabase points ctrl (from its next start) and every ctrl command at
// the database dsn, as an operator does after a failover.
func (s *Stack) UseDatabase(dsn string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.DSN = dsn
}

// UseMySQL makes m the stack's MySQL server (a promoted replica): faults
// and Stop act on it from now on. The caller points ctrl at a database on
// it with UseDatabase.
func (s *Stack) UseMySQL(m *testenv.MySQL) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.MySQL = m
}

// CtrlReplica is a further `ctrl serve` against the stack's MySQL and
// Restate, as production runs several behind one address.
type CtrlReplica struct {
	Addr       string // gRPC host:port
	HTTP       string // http://host:port (health, metrics)
	ConsoleURL string // http://host:port of its web console
	p          *testenv.Process
	bin        string
	env        []string
}

// Stop stops the replica (SIGTERM).
func (r *CtrlReplica) Stop() { r.p.Stop(10 * time.Second) }

// Command prepares a command of the replica's ctrl binary aimed at the
// replica (its address, the stack's operator token and database).
func (r *CtrlReplica) Command(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, r.bin, args...)
	cmd.Env = append(os.Environ(), r.env...)
	return cmd
}

// Process is the replica's process.
func (r *CtrlReplica) Process() *testenv.Process { return r.p }

// StartCtrlReplica starts another ctrl on its own ports, its web console
// included, and waits until it is ready. It shares the database, the
// vault keyring and Restate; Restate keeps calling the endpoint registered
// by the first ctrl, so the replica does not register its own.
func (s *Stack) StartCtrlReplica(name string) (*CtrlReplica, error) {
	return s.StartCtrlReplicaWith(name, CtrlReplicaOptions{})
}

// CtrlReplicaOptions shape a further ctrl.
type CtrlReplicaOptions struct {
	// Bin is its binary (another release's ctrl); default the stack's.
	Bin string
	// Register makes it register its own Restate endpoint, as a replica
	// of a new ctrl line does in a roll.
	Register bool
}

// StartCtrlReplicaWith is StartCtrlReplica shaped by o.
func (s *Stack) StartCtrlReplicaWith(name string, o CtrlReplicaOptions) (*CtrlReplica, error) {
	ports, err := testenv.FreePorts(4)
	if err != nil {
		return nil, err
	}
	r := &CtrlReplica{Addr: fmt.Sprintf("127.0.0.1:%d", ports[0]), HTTP: fmt.Sprintf("http://127.0.0.1:%d", ports[1]),
		ConsoleURL: fmt.Sprintf("http://127.0.0.1:%d", ports[3])}
	env := append(s.ctrlEnv(),
		"CTRL_GRPC_ADDR="+r.Addr,
		"CTRL_HTTP_ADDR="+strings.TrimPrefix(r.HTTP, "http://"),
		fmt.Sprintf("CTRL_RESTATE_ENDPOINT_LISTEN=127.0.0.1:%d", ports[2]),
		fmt.Sprintf("CTRL_RESTATE_REGISTER_ON_START=%t", o.Register),
		"CTRL_CONSOLE_ADDR="+strings.TrimPrefix(r.ConsoleURL, "http://"),
		"CTRL_ADDR="+r.Addr,
	)
	r.env, r.bin = env, o.Bin
	if r.bin == "" {
		r.bin = s.Bin("ctrl")
	}
	if r.p, err = testenv.StartProcess(s.dir, name, r.bin, []string{"serve"}, env); err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.replicas = append(s.replicas, r)
	s.mu.Unlock()
	if err := r.p.WaitReady(60*time.Second, func(ctx context.Context) error { return HTTPOK(ctx, r.HTTP+"/readyz") }); err != nil {
		return nil, fmt.Errorf("ctrl replica %s: %w", name, err)
	}
	return r, nil
}

// KraneEnv returns the KRANE_* settings a region's krane was started with
// (a test starting another krane against another ctrl reuses them).
func (s *Stack) KraneEnv(region string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.opts.KraneEnv[region])
}

// Ctrl runs a ctrl command (e.g. "deploy", "create", ...) against the
// stack and returns its standard output (what scripts read; notes go to
// standard error, which an error includes).
func (s *Stack) Ctrl(ctx context.Context, args ...string) ([]byte, error) {
	cmd := s.CtrlCommand(ctx, args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("ctrl %s: %w\n%s%s", strings.Join(args, " "), err, out, stderr.String())
	}
	return out, nil
}

// CtrlCommand prepares a ctrl command with the stack's connection settings.
func (s *Stack) CtrlCommand(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, s.Bin("ctrl"), args...)
	cmd.Env = append(os.Environ(), s.ctrlEnv()...)
	return cmd
}

func (s *Stack) register() error {
	ctx := context.Background()
	out, err := s.Ctrl(ctx, "token", "create-operator", "--name", "stack-operator")
	if err != nil {
		return err
	}
	s.OperatorToken = lastLine(out)
	for _, region := range s.opts.Regions {
		out, err := s.Ctrl(ctx, "cluster", "register", "--region", region, "--cluster", ClusterID(region))
		if err != nil {
			return err
		}
		s.ClusterTokens[region] = lastLine(out)
	}
	return nil
}

func (s *Stack) startKrane(ctx context.Context, region string) error {
	p, addr, err := s.launchKrane(ctx, region, "krane-"+region)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.kranes[region] = p
	s.KraneHTTP[region] = addr
	s.mu.Unlock()
	return p.WaitReady(2*time.Minute, func(ctx context.Context) error { return HTTPOK(ctx, addr+"/readyz") })
}

// kraneManifests are what deploy/README.md tells an operator to apply
// without kustomize, in that order; optional ones a tree may not have (a
// release made before they existed).
var kraneManifests = []struct {
	path     string
	optional bool
}{
	{"deploy/base/krane/namespace.yaml", false}, {"plugins/deployment/rbac.yaml", false},
	{"plugins/sentinel/rbac.yaml", false}, {"plugins/sentinel/pods.yaml", true},
	{"plugins/cilium/rbac.yaml", false}, {"deploy/base/krane/rbac.yaml", false},
}

// ApplyKraneManifests applies krane's manifests of the tree at repoDir
// (empty: this repository) to region's cluster, as an operator upgrading
// krane applies the new release's manifests before its image; krane's
// later starts in that region apply the same tree's.
func (s *Stack) ApplyKraneManifests(ctx context.Context, region, repoDir string) error {
	s.mu.Lock()
	if s.manifestTrees == nil {
		s.manifestTrees = map[string]string{}
	}
	s.manifestTrees[region] = repoDir
	s.mu.Unlock()
	return s.applyKraneManifests(ctx, region, repoDir)
}

// manifestTree is the tree whose krane manifests region's cluster runs.
func (s *Stack) manifestTree(region string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if t, ok := s.manifestTrees[region]; ok {
		return t
	}
	return s.opts.RepoDir
}

func (s *Stack) applyKraneManifests(ctx context.Context, region, repoDir string) error {
	c := s.Clusters[region]
	for _, f := range kraneManifests {
		var p string
		var err error
		if repoDir == "" {
			p, err = repoFile(f.path)
		} else {
			p = filepath.Join(repoDir, f.path)
			_, err = os.Stat(p)
		}
		if err != nil && f.optional {
			continue
		}
		if err != nil {
			return fmt.Errorf("%s not found in the tree at %s: %w", f.path, repoDir, err)
		}
		manifest, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if err := c.ApplyYAML(ctx, manifest); err != nil {
			return fmt.Errorf("apply %s: %w", f.path, err)
		}
	}
	return nil
}

// launchKrane starts one krane process for region, named name, serving
// /healthz, /readyz and /metrics on a port of its own, and returns it with
// that address.
func (s *Stack) launchKrane(ctx context.Context, region, name string) (*testenv.Process, string, error) {
	c := s.Clusters[region]
	if err := s.applyKraneManifests(ctx, region, s.manifestTree(region)); err != nil {
		return nil, "", err
	}
	// krane reaches its API server as the ServiceAccount of deploy/, so the
	// RBAC it ships with is proven sufficient (and no broader is used).
	_, kubeconfig, err := c.ServiceAccountConfig(ctx, "krane", "krane")
	if err != nil {
		return nil, "", err
	}
	port, err := testenv.FreePort()
	if err != nil {
		return nil, "", err
	}
	addr := fmt.Sprintf("http://127.0.0.1:%d", port)
	ctrlAddr := s.CtrlAddr
	if s.opts.ProxyCtrl {
		s.mu.Lock()
		p, ok := s.proxies[region]
		s.mu.Unlock()
		if !ok {
			if p, err = testenv.NewProxy(s.CtrlAddr); err != nil {
				return nil, "", err
			}
			s.mu.Lock()
			s.proxies[region] = p
			s.mu.Unlock()
		}
		ctrlAddr = p.Addr()
	}
	env := []string{
		"KRANE_REGION=" + region,
		"KRANE_CLUSTER_ID=" + ClusterID(region),
		"KRANE_TOKEN=" + s.ClusterTokens[region],
		"KRANE_KUBERNETES__KUBECONFIG=" + kubeconfig,
		fmt.Sprintf("KRANE_SERVER__LISTEN=127.0.0.1:%d", port),
		"KRANE_PLUGIN_DIR=" + s.PluginDir(),
	}
	s.mu.Lock()
	env = append(env, s.opts.KraneEnv[region]...)
	s.kraneEnvs[region] = env
	s.mu.Unlock()
	// ctrl's address goes in the region's file rather than the
	// environment, so that an edit of control_plane (a reload) applies.
	cfg, err := s.kraneConfig(region, "http://"+ctrlAddr)
	if err != nil {
		return nil, "", err
	}
	p, err := testenv.StartProcess(s.dir, name, s.Bin("krane"), []string{"run", "-c", cfg}, env)
	if err != nil {
		return nil, "", err
	}
	return p, addr, nil
}

// KraneProcessEnv is every KRANE_* setting a region's krane runs with, so
// a test runs a krane command (krane validate) as that krane would.
func (s *Stack) KraneProcessEnv(region string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.kraneEnvs[region])
}

// KraneConfigPath is a region's own krane.hcl.
func (s *Stack) KraneConfigPath(region string) (string, error) { return s.kraneConfig(region, "") }

// KraneReplica is a further krane of a region's cluster, standing by while
// the region's krane holds the leader election Lease (the stack's kranes
// must run with leader_election enabled, through KraneEnv).
type KraneReplica struct {
	P    *testenv.Process
	HTTP string // http://host:port (health, metrics)
}

// StartKraneReplica starts another krane for region and waits until it
// answers /readyz (a standby does, with "standby").
func (s *Stack) StartKraneReplica(ctx context.Context, region, name string) (*KraneReplica, error) {
	p, addr, err := s.launchKrane(ctx, region, name)
	if err != nil {
		return nil, err
	}
	r := &KraneReplica{P: p, HTTP: addr}
	if err := p.WaitReady(2*time.Minute, func(ctx context.Context) error { return HTTPOK(ctx, addr+"/readyz") }); err != nil {
		p.Kill()
		return nil, err
	}
	return r, nil
}

// PromoteKrane makes r the region's krane (Krane, KraneHTTP, restarts),
// as when it took over from a leader that died.
func (s *Stack) PromoteKrane(region string, r *KraneReplica) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.kranes[region] = r.P
	s.KraneHTTP[region] = r.HTTP
}

// SignalCtrl sends sig to ctrl (SIGSTOP and SIGCONT: a ctrl that is alive
// but answers nothing).
func (s *Stack) SignalCtrl(sig os.Signal) error {
	s.mu.Lock()
	p := s.ctrl
	s.mu.Unlock()
	return p.Signal(sig)
}

// kraneConfig is the region's own copy of krane.hcl (made on first use,
// with control_plane.url set to ctrlURL), so a test can edit one region's
// configuration and reload it.
func (s *Stack) kraneConfig(region, ctrlURL string) (string, error) {
	p := filepath.Join(s.dir, "krane-"+region+".hcl")
	if _, err := os.Stat(p); err == nil {
		return p, nil
	}
	b, err := os.ReadFile(s.opts.KraneConfig)
	if err != nil {
		return "", err
	}
	loc := urlRE.FindSubmatchIndex(b)
	if loc == nil {
		return "", fmt.Errorf("%s: no control_plane url line to set", s.opts.KraneConfig)
	}
	out := append(append(append([]byte{}, b[:loc[2]]...), fmt.Sprintf("%q", ctrlURL)...), b[loc[3]:]...)
	return p, os.WriteFile(p, out, 0o600)
}

// urlRE finds the value of control_plane's url in krane.hcl.
var urlRE = regexp.MustCompile(`(?s)control_plane\s*\{.*?\burl\s*=\s*("[^"]*")`)

// EditKraneConfig rewrites a region's krane.hcl with edit and makes its
// krane reload it (SIGHUP).
func (s *Stack) EditKraneConfig(region string, edit func(string) string) error {
	p, err := s.kraneConfig(region, "")
	if err != nil {
		return err
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return err
	}
	if err := os.WriteFile(p, []byte(edit(string(b))), 0o600); err != nil {
		return err
	}
	return s.Krane(region).Signal(syscall.SIGHUP)
}

// SetKraneEnv replaces a region's KRANE_* overrides for its next (re)start.
func (s *Stack) SetKraneEnv(region string, env []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.opts.KraneEnv == nil {
		s.opts.KraneEnv = map[string][]string{}
	}
	s.opts.KraneEnv[region] = env
}

// StopKrane stops a region's krane (SIGTERM).
func (s *Stack) StopKrane(region string) {
	if p := s.Krane(region); p != nil {
		p.Stop(20 * time.Second)
	}
}

// StartKrane starts a region's krane (after StopKrane) and waits until it is ready.
func (s *Stack) StartKrane(ctx context.Context, region string) error {
	return s.startKrane(ctx, region)
}

// Proxy returns the proxy between a region's krane and ctrl (ProxyCtrl).
func (s *Stack) Proxy(region string) *testenv.Proxy {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.proxies[region]
}

// Krane returns a region's krane process.
func (s *Stack) Krane(region string) *testenv.Process {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.kranes[region]
}

// RestartKrane stops a region's krane (SIGKILL with kill) and starts it again.
func (s *Stack) RestartKrane(ctx context.Context, region string, kill bool) error {
	p := s.Krane(region)
	if kill {
		p.Kill()
	} else {
		p.Stop(20 * time.Second)
	}
	return s.startKrane(ctx, region)
}

// Stop stops every process of the stack.
func (s *Stack) Stop() {
	s.mu.Lock()
	kranes, ctrl, proxies, replicas := s.kranes, s.ctrl, s.proxies, s.replicas
	s.mu.Unlock()
	for _, p := range proxies {
		p.Close()
	}
	for _, p := range kranes {
		p.Stop(10 * time.Second)
	}
	for _, r := range replicas {
		r.Stop()
	}
	if ctrl != nil {
		ctrl.Stop(10 * time.Second)
	}
	for _, c := range s.Clusters {
		c.Stop()
	}
	if s.Restate != nil {
		s.Restate.Stop()
	}
	if s.MySQL != nil {
		s.MySQL.Stop()
	}
}

func lastLine(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

// HTTPOK gets url and fails unless it answers 200 (with the start of the
// body in the error).
func HTTPOK(ctx context.Context, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 2048))
		return fmt.Errorf("GET %s: %s: %s", url, resp.Status, strings.TrimSpace(string(body)))
	}
	return nil
}

// repoFile is a file of the stack's tree (Options.RepoDir), or of this
// repository.
func (s *Stack) repoFile(rel string) (string, error) {
	if s.opts.RepoDir == "" {
		return repoFile(rel)
	}
	p := filepath.Join(s.opts.RepoDir, rel)
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("%s not found in the tree at %s", rel, s.opts.RepoDir)
	}
	return p, nil
}

// repoFile finds a file of the repository from the working directory up.
func repoFile(rel string) (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			p := filepath.Join(dir, rel)
			if _, err := os.Stat(p); err != nil {
				return "", fmt.Errorf("%s not found in the repository at %s", rel, dir)
			}
			return p, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("not inside the krane repository (no go.mod above %s)", dir)
		}
		dir = parent
	}
}

// lockedWriter serializes writes from concurrent steps.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
