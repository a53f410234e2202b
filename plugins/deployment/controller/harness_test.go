package controller_test

//lint:file-ignore SA1019 legacy-workload: removed no earlier than v0.3.0 (docs/compatibility.md); this file builds or reads the deprecated top-level workload fields

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"krane.dev/internal/testenv"
	"krane.dev/internal/testenv/kubeenv"
	"krane.dev/plugins/deployment/controller"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
	"krane.dev/sdk"
	"krane.dev/sdk/kube"
	"krane.dev/sdk/plugintest"
	"krane.dev/shared/kinds"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// The plugin always runs as ServiceAccount krane/krane-plugin-deployment,
// bound by the very rbac.yaml operators apply: a missing permission fails
// these tests, an extra one is caught by TestRBACIsLeastPrivilege.
var identity struct {
	once       sync.Once
	kubeconfig string
	client     kubernetes.Interface
	err        error
}

func pluginIdentity(t *testing.T) (*kubeenv.Cluster, string, kubernetes.Interface) {
	t.Helper()
	cluster := kubeenv.Shared(t)
	identity.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		cfg, path, err := cluster.ServiceAccountConfig(ctx, "krane", "krane-plugin-deployment")
		if err != nil {
			identity.err = err
			return
		}
		manifest, err := os.ReadFile("../rbac.yaml")
		if err != nil {
			identity.err = err
			return
		}
		if identity.err = cluster.ApplyYAML(ctx, manifest); identity.err != nil {
			return
		}
		client, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			identity.err = err
			return
		}
		// The authorizer learns new bindings through a watch: wait for it.
		for {
			_, err := client.AppsV1().ReplicaSets("").List(ctx, metav1.ListOptions{Limit: 1})
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				identity.err = fmt.Errorf("the ServiceAccount never got its ClusterRole: %w", err)
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
		identity.kubeconfig, identity.client = path, client
	})
	if identity.err != nil {
		t.Fatal(identity.err)
	}
	return cluster, identity.kubeconfig, identity.client
}

// testLogger writes the plugin's log to stderr, which go test shows for a
// failing package.
func testLogger() hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{Name: "deployment", Level: hclog.Info, Output: os.Stderr})
}

type plugin struct {
	sdk.Plugin
	counter *kube.CallCounter
}

// startPlugin serves a controller in this process, reached over the real
// gRPC path, configured with config and the plugin's ServiceAccount.
func startPlugin(t *testing.T, config string) plugin {
	t.Helper()
	_, kubeconfig, _ := pluginIdentity(t)
	counter := &kube.CallCounter{}
	ctl := plugintest.New(t, controller.New(testLogger(), controller.WithCallCounter(counter)))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := ctl.Configure(ctx, &sdk.ConfigureRequest{
		Region: "local", ClusterID: "test",
		Kube:   sdk.KubeSource{Path: kubeconfig},
		Config: []byte(config),
	})
	if err != nil {
		t.Fatalf("Configure(%s): %v", config, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = ctl.Shutdown(ctx)
	})
	return plugin{ctl, counter}
}

func spec(ns, name, image string, replicas int32) *clusterv1.Deployment {
	return &clusterv1.Deployment{
		WorkspaceId: "ws_test", ProjectId: "proj_test", EnvironmentId: "env_test",
		K8SNamespace: ns, K8SName: name, Image: image,
		CpuMillicores: 250, MemoryMib: 256, Replicas: replicas,
		EnvVars: map[string]string{"GREETING": "hello"},
	}
}

func change(t *testing.T, id string, version uint64, d *clusterv1.Deployment) sdk.Change {
	t.Helper()
	s, err := sdk.SpecOf(d)
	if err != nil {
		t.Fatal(err)
	}
	return sdk.Change{Kind: kinds.Deployment, ID: id, Version: version, Spec: s}
}

func deleted(id string, version uint64) sdk.Change {
	return sdk.Change{Kind: kinds.Deployment, ID: id, Version: version, Deleted: true}
}

func apply(t *testing.T, p sdk.Controller, ch sdk.Change, want sdk.Result) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	got, err := plugintest.Apply(ctx, p, ch)
	if err != nil {
		t.Fatalf("Apply(%s v%d): %v", ch.ID, ch.Version, err)
	}
	if got != want {
		t.Fatalf("Apply(%s v%d) = %s, want %s", ch.ID, ch.Version, got, want)
	}
}

// applyUntil repeats an Apply until it returns want: the plugin's cache
// needs a moment to see its own write or someone else's edit.
func applyUntil(t *testing.T, p sdk.Controller, ch sdk.Change, want sdk.Result) {
	t.Helper()
	var got sdk.Result
	waitUntil(t, 10*time.Second, fmt.Sprintf("Apply(%s v%d) = %s", ch.ID, ch.Version, want), func() bool {
		var err error
		got, err = plugintest.Apply(context.Background(), p, ch)
		if err != nil {
			t.Fatalf("Apply(%s v%d): %v", ch.ID, ch.Version, err)
		}
		return got == want
	})
}

func waitUntil(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// report is one status report as the host receives it.
type report struct {
	at      time.Time
	version uint64
	status  *clusterv1.DeploymentStatus
}

type reports struct {
	mu   sync.Mutex
	byID map[string][]report
}

// watchStatus collects the plugin's status reports until the test ends.
func watchStatus(t *testing.T, p sdk.Plugin) *reports {
	r := &reports{byID: map[string][]report{}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- p.WatchStatus(ctx, func(rep sdk.StatusReport) error {
			st := &clusterv1.DeploymentStatus{}
			if err := rep.Status.(*anypb.Any).UnmarshalTo(st); err != nil {
				return err
			}
			if rep.Kind != kinds.Deployment || st.DeploymentId != rep.ID {
				return fmt.Errorf("report for %s %s carries deployment %q", rep.Kind, rep.ID, st.DeploymentId)
			}
			r.mu.Lock()
			r.byID[rep.ID] = append(r.byID[rep.ID], report{time.Now(), rep.ObservedVersion, st})
			r.mu.Unlock()
			return nil
		})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && ctx.Err() == nil {
			t.Errorf("WatchStatus: %v", err)
		}
	})
	return r
}

func (r *reports) of(id string) []report {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.byID[id])
}

func (r *reports) latest(id string) (report, bool) {
	all := r.of(id)
	if len(all) == 0 {
		return report{}, false
	}
	return all[len(all)-1], true
}

// waitFor waits until the latest report of id satisfies ok.
func (r *reports) waitFor(t *testing.T, id string, timeout time.Duration, what string, ok func(*clusterv1.DeploymentStatus) bool) report {
	t.Helper()
	var last report
	deadline := time.Now().Add(timeout)
	for {
		if rep, found := r.latest(id); found {
			last = rep
			if ok(rep.status) {
				return rep
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s: %s; last report: %v", timeout, id, what, last.status)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// running(n): exactly n instances, all running with an address.
func running(n int) func(*clusterv1.DeploymentStatus) bool {
	return func(s *clusterv1.DeploymentStatus) bool {
		if len(s.Instances) != n || s.ReadyReplicas != int32(n) {
			return false
		}
		for _, in := range s.Instances {
			if in.Status != clusterv1.Instance_STATUS_RUNNING || in.Address == "" {
				return false
			}
		}
		return true
	}
}

// noStorm fails when two consecutive reports of id are identical within
// less than the resync interval: only a change or the periodic full pass
// may send a report.
func noStorm(t *testing.T, r *reports, id string, resync time.Duration) {
	t.Helper()
	all := r.of(id)
	for i := 1; i < len(all); i++ {
		a, b := all[i-1], all[i]
		if a.version == b.version && proto.Equal(a.status, b.status) && b.at.Sub(a.at) < resync-time.Second {
			t.Errorf("report %d of %s repeats report %d after %s, before the resync interval %s", i, id, i-1, b.at.Sub(a.at), resync)
		}
	}
	t.Logf("%s: %d status reports", id, len(all))
}

func podsOf(t *testing.T, c *kubeenv.Cluster, ns, id string) []corev1.Pod {
	t.Helper()
	list, err := c.Client.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{LabelSelector: controller.LabelDeployment + "=" + id})
	if err != nil {
		t.Fatal(err)
	}
	return list.Items
}

func replicaSetsOf(t *testing.T, c *kubeenv.Cluster, id string) []appsv1.ReplicaSet {
	t.Helper()
	list, err := c.Client.AppsV1().ReplicaSets("").List(context.Background(), metav1.ListOptions{LabelSelector: controller.LabelDeployment + "=" + id})
	if err != nil {
		t.Fatal(err)
	}
	return list.Items
}

func uids(pods []corev1.Pod) []string {
	var out []string
	for _, p := range pods {
		out = append(out, string(p.UID))
	}
	slices.Sort(out)
	return out
}

func namespaceGone(t *testing.T, c *kubeenv.Cluster, ns string) bool {
	t.Helper()
	_, err := c.Client.CoreV1().Namespaces().Get(context.Background(), ns, metav1.GetOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	return apierrors.IsNotFound(err)
}

// cleanupNamespace removes a test namespace whatever happened to the test.
func cleanupNamespace(t *testing.T, c *kubeenv.Cluster, ns string) {
	t.Cleanup(func() {
		err := c.Client.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("cleanup namespace %s: %v", ns, err)
		}
	})
}

func zoneOfNode(t *testing.T, c *kubeenv.Cluster, node string) string {
	t.Helper()
	n, err := c.Client.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n.Labels[kubeenv.LabelZone]
}

func isWorker(node string) bool { return strings.HasPrefix(node, "worker-") }
