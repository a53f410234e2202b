package controller_test

// Acceptance tests against a real kube-apiserver, controller-manager and
// scheduler with kwok nodes. The plugin runs behind the real gRPC boundary
// (plugintest.New) with the identity of its ServiceAccount, bound only by
// the plugin's rbac.yaml.

import (
	"bytes"
	"context"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/protobuf/types/known/anypb"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"krane.dev/internal/testenv"
	"krane.dev/internal/testenv/kubeenv"
	"krane.dev/plugins/sentinel/controller"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
	"krane.dev/sdk"
	"krane.dev/sdk/kube"
	"krane.dev/sdk/plugintest"
	"krane.dev/shared/kinds"
)

func TestMain(m *testing.M) { testenv.Main(m) }

const ns = controller.DefaultNamespace

// ---- harness ----

// logBuffer collects the controller's log lines (and echoes them to
// stderr) so tests can assert what an operator would read.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	os.Stderr.Write(p)
	return b.buf.Write(p)
}

func (b *logBuffer) count(substr string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.Count(b.buf.String(), substr)
}

type harness struct {
	t       *testing.T
	cluster *kubeenv.Cluster
	ctl     sdk.Plugin
	calls   *kube.CallCounter
	logs    *logBuffer
	reports *reports
}

var rbacOnce sync.Map // *kubeenv.Cluster -> kubeconfig path

// sharedCluster is the package's cluster.
func sharedCluster(t *testing.T) *kubeenv.Cluster { return kubeenv.Shared(t) }

// pluginKubeconfig applies the plugin's rbac.yaml (and pods.yaml) and returns a kubeconfig
// of the ServiceAccount it binds: the plugin gets exactly those rights.
func pluginKubeconfig(t *testing.T, c *kubeenv.Cluster) string {
	t.Helper()
	if p, ok := rbacOnce.Load(c); ok {
		return p.(string)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := c.EnsureNamespace(ctx, "krane"); err != nil {
		t.Fatal(err)
	}
	// The plugin's rights, and the account its sentinel pods run as.
	for _, file := range []string{"../rbac.yaml", "../pods.yaml"} {
		manifest, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.ApplyYAML(ctx, manifest); err != nil {
			t.Fatalf("apply %s: %v", file, err)
		}
	}
	_, path, err := c.ServiceAccountConfig(ctx, "krane", "krane-plugin-sentinel")
	if err != nil {
		t.Fatal(err)
	}
	rbacOnce.Store(c, path)
	return path
}

func start(t *testing.T, c *kubeenv.Cluster, config string, opts ...controller.Option) *harness {
	t.Helper()
	return startWith(t, c, config, hclog.Info, nil, opts...)
}

// startWith is start with the plugin's log level and, when host is not
// nil, the host services the plugin calls (DecryptEnv).
func startWith(t *testing.T, c *kubeenv.Cluster, config string, level hclog.Level, host sdk.Host, opts ...controller.Option) *harness {
	t.Helper()
	h := &harness{t: t, cluster: c, calls: &kube.CallCounter{}, logs: &logBuffer{}, reports: &reports{}}
	log := hclog.New(&hclog.LoggerOptions{Name: "sentinel", Output: h.logs, Level: level})
	opts = append([]controller.Option{controller.WithCallCounter(h.calls)}, opts...)
	var popts []plugintest.Option
	if host != nil {
		popts = append(popts, plugintest.WithHost(host))
	}
	h.ctl = plugintest.New(t, controller.New(log, opts...), popts...)
	req := sdk.ConfigureRequest{Region: "local-a", ClusterID: "c1", Kube: sdk.KubeSource{Path: pluginKubeconfig(t, c)}, Config: []byte(config)}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// RBAC bindings reach the authorizer's cache a moment after they are
	// written: retry while the error is "forbidden".
	for {
		_, err := h.ctl.Configure(ctx, &req)
		if err == nil {
			break
		}
		if !strings.Contains(err.Error(), "forbidden") || ctx.Err() != nil {
			t.Fatalf("Configure: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	wctx, wcancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = h.ctl.WatchStatus(wctx, h.reports.add)
	}()
	t.Cleanup(func() { wcancel(); <-done })
	return h
}

func sentinel(id, name, env, image string, replicas int32) *clusterv1.Sentinel {
	return &clusterv1.Sentinel{Id: id, K8SName: name, WorkspaceId: "ws_1", ProjectId: "proj_1", AppId: "app_1",
		EnvironmentId: env, Image: image, Replicas: replicas, CpuMillicores: 250, MemoryMib: 256}
}

func change(t *testing.T, s *clusterv1.Sentinel, version uint64) sdk.Change {
	t.Helper()
	spec, err := sdk.SpecOf(s)
	if err != nil {
		t.Fatal(err)
	}
	return sdk.Change{Kind: kinds.Sentinel, ID: s.GetId(), Version: version, Spec: spec}
}

func (h *harness) apply(ch sdk.Change) sdk.Result {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, err := plugintest.Apply(ctx, h.ctl, ch)
	if err != nil {
		h.t.Fatalf("Apply(%s v%d): %v", ch.ID, ch.Version, err)
	}
	return r
}

func (h *harness) delete(id string, version uint64) {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if r, err := plugintest.Apply(ctx, h.ctl, sdk.Change{Kind: kinds.Sentinel, ID: id, Version: version, Deleted: true}); err != nil || r != sdk.Deleted {
		h.t.Fatalf("delete %s = %s, %v", id, r, err)
	}
}

// report is one status report as the host receives it.
type report struct {
	at      time.Time
	version uint64
	st      *clusterv1.SentinelStatus
}

type reports struct {
	mu   sync.Mutex
	all  []report
	hook func(report) // called synchronously on each report
}

func (r *reports) add(sr sdk.StatusReport) error {
	st := &clusterv1.SentinelStatus{}
	if err := sr.Status.(*anypb.Any).UnmarshalTo(st); err != nil {
		return err
	}
	rep := report{at: time.Now(), version: sr.ObservedVersion, st: st}
	r.mu.Lock()
	r.all = append(r.all, rep)
	hook := r.hook
	r.mu.Unlock()
	if hook != nil {
		hook(rep)
	}
	return nil
}

func (r *reports) of(id string, since time.Time) []report {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []report
	for _, rep := range r.all {
		if rep.st.GetSentinelId() == id && !rep.at.Before(since) {
			out = append(out, rep)
		}
	}
	return out
}

func (r *reports) setHook(f func(report)) {
	r.mu.Lock()
	r.hook = f
	r.mu.Unlock()
}

// waitReport waits for a report on id since `since` satisfying ok.
func (h *harness) waitReport(id string, since time.Time, timeout time.Duration, what string, ok func(*clusterv1.SentinelStatus) bool) report {
	h.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		for _, rep := range h.reports.of(id, since) {
			if ok(rep.st) {
				return rep
			}
		}
		if time.Now().After(deadline) {
			reps := h.reports.of(id, since)
			last := "none"
			if len(reps) > 0 {
				last = reps[len(reps)-1].st.String()
			}
			h.t.Fatalf("no report on %s %s within %s; last report: %s", id, what, timeout, last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func healthyOn(image string) func(*clusterv1.SentinelStatus) bool {
	return func(st *clusterv1.SentinelStatus) bool {
		return st.GetHealth() == clusterv1.Health_HEALTH_HEALTHY && st.GetRunningImage() == image
	}
}

func waitFor(t *testing.T, timeout time.Duration, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, err := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s (last error: %v)", timeout, what, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// objectsGone waits until none of the five objects of a sentinel exist.
func objectsGone(t *testing.T, c *kubeenv.Cluster, name string) {
	t.Helper()
	ctx := context.Background()
	waitFor(t, 30*time.Second, "the objects of "+name+" to be deleted", func() (bool, error) {
		for _, get := range []func() error{
			func() error {
				_, err := c.Client.AppsV1().Deployments(ns).Get(ctx, name, metav1.GetOptions{})
				return err
			},
			func() error { _, err := c.Client.CoreV1().Services(ns).Get(ctx, name, metav1.GetOptions{}); return err },
			func() error {
				_, err := c.Client.CoreV1().Services(ns).Get(ctx, name+"-gossip", metav1.GetOptions{})
				return err
			},
			func() error {
				_, err := c.Client.PolicyV1().PodDisruptionBudgets(ns).Get(ctx, name, metav1.GetOptions{})
				return err
			},
			func() error {
				_, err := c.Dynamic.Resource(controller.PolicyGVR).Namespace(ns).Get(ctx, name+"-gossip", metav1.GetOptions{})
				return err
			},
		} {
			if err := get(); !apierrors.IsNotFound(err) {
				return false, err
			}
		}
		return true, nil
	})
}

// cpuTime is the CPU time (user + system) this test process has used: the
// host side and the plugin side of the gRPC boundary, not the API server.
func cpuTime(t *testing.T) time.Duration {
	t.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// ---- conformance ----

func TestConformance(t *testing.T) {
	c := sharedCluster(t)
	h := start(t, c, `{}`)
	bad := func(id string, mutate func(*clusterv1.Sentinel)) sdk.Change {
		s := sentinel(id, "bad-"+strings.ReplaceAll(id, "_", "-"), "env_bad", "registry.example/sentinel:v1", 1)
		mutate(s)
		return change(t, s, 50)
	}
	plugintest.Conformance(t, h.ctl, plugintest.Suite{
		Configure: sdk.ConfigureRequest{Region: "local-a", ClusterID: "c1", Kube: sdk.KubeSource{Path: pluginKubeconfig(t, c)},
			Config: []byte(`{"env_from_secrets":[{"name":"database"},{"name":"redis","optional":true}],"status_resync_interval":"30s"}`)},
		BadConfigs: []plugintest.BadConfig{
			{Config: `{"namespaces":"sentinel"}`, Key: "namespaces"},
			{Config: `{"port":"8040"}`, Key: "port"},
			{Config: `{"gossip_port":8040}`, Key: "gossip_port"},
			{Config: `{"namespace":"Bad_NS"}`, Key: "namespace"},
			{Config: `{"env_from_secrets":["database"]}`, Key: "env_from_secrets"},
			{Config: `{"status_resync_interval":"often"}`, Key: "status_resync_interval"},
			{Config: `{"liveness_path":"health"}`, Key: "liveness_path"},
		},
		Objects: []sdk.Change{
			change(t, sentinel("snt_conf_1", "conf-one", "env_conf_1", "registry.example/sentinel:v1", 1), 10),
			change(t, sentinel("snt_conf_2", "conf-two", "env_conf_2", "registry.example/sentinel:v1", 2), 11),
		},
		Invalid: []plugintest.InvalidChange{
			{Change: bad("bad_name", func(s *clusterv1.Sentinel) { s.K8SName = "Not_A_Name" }), Field: "k8s_name"},
			{Change: bad("bad_env", func(s *clusterv1.Sentinel) { s.EnvironmentId = "env with spaces" }), Field: "environment_id"},
			{Change: bad("bad_image", func(s *clusterv1.Sentinel) { s.Image = "registry.example/Sentinel:v1 latest" }), Field: "image"},
			{Change: bad("bad_replicas", func(s *clusterv1.Sentinel) { s.Replicas = -1 }), Field: "replicas"},
			{Change: bad("too_many", func(s *clusterv1.Sentinel) { s.Replicas = 5000 }), Field: "replicas"},
			{Change: bad("no_cpu", func(s *clusterv1.Sentinel) { s.CpuMillicores = 0 }), Field: "cpu_millicores"},
			{Change: bad("no_memory", func(s *clusterv1.Sentinel) { s.MemoryMib = 0 }), Field: "memory_mib"},
			{Change: sdk.Change{Kind: kinds.Sentinel, ID: "bad id!", Version: 51, Spec: change(t, sentinel("x", "x", "e", "i", 1), 1).Spec}, Field: "id"},
			{Change: sdk.Change{Kind: kinds.Sentinel, ID: "wrong_type", Version: 52, Spec: sdk.Spec{TypeURL: "type.googleapis.com/krane.cluster.v1.Deployment"}}},
			{Change: sdk.Change{Kind: kinds.Sentinel, ID: "garbage", Version: 53, Spec: sdk.Spec{TypeURL: "type.googleapis.com/krane.cluster.v1.Sentinel", Value: []byte{0xff, 0x01}}}},
		},
	})
	objectsGone(t, c, "conf-one")
	objectsGone(t, c, "conf-two")
	// Invalid desired states never reached the cluster.
	deps, err := c.Client.AppsV1().Deployments(ns).List(context.Background(), metav1.ListOptions{LabelSelector: "unkey.com/environment.id=env_bad"})
	if err != nil || len(deps.Items) != 0 {
		t.Errorf("invalid sentinels reached the cluster: %d, %v", len(deps.Items), err)
	}
}
