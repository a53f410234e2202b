package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"krane.dev/ctrl/auth"
	"krane.dev/ctrl/deployspec"
	"krane.dev/ctrl/rules"
	"krane.dev/ctrl/serve"
	"krane.dev/ctrl/store"
	"krane.dev/host/agent"
	"krane.dev/host/config"
	"krane.dev/internal/testenv"
	"krane.dev/internal/testenv/kubeenv"
	ctrlv1 "krane.dev/proto/krane/ctrl/v1"
)

const (
	sentinelV1 = "registry.example/unkey/sentinel:v1"
	sentinelV2 = "registry.example/unkey/sentinel:v2"
	// sentinelNamespace is where the plugin puts sentinels in this test.
	sentinelNamespace = "sentinel-e2e"
)

// startCtrlWithRestate runs a real ctrl with its Restate side on the
// package's Restate server.
func startCtrlWithRestate(t *testing.T) *serve.Server {
	t.Helper()
	r := testenv.SharedRestate(t)
	cfg, err := serve.LoadConfig(nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg.DB.DSN = testenv.SharedMySQL(t).Database(t, t.Name())
	cfg.GRPC.Addr, cfg.HTTP.Addr = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Watch.PollInterval = 20 * time.Millisecond
	cfg.Log.Level, cfg.Log.Format = "warn", "text"
	cfg.Restate.IngressURL, cfg.Restate.AdminURL, cfg.Restate.IdentityKeys = r.IngressURL(), r.AdminURL(), r.IdentityKey()
	cfg.Restate.Endpoint.Listen = "127.0.0.1:0"
	cfg.Sentinel.DefaultImage = sentinelV1
	ctx, cancel := context.WithCancel(context.Background())
	srv, err := serve.Start(ctx, cfg, hclog.NewNullLogger(), serve.Deps{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); _ = srv.Wait() })
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	if err := srv.WaitRestateRegistered(wctx); err != nil {
		t.Fatal(err)
	}
	return srv
}

// startSentinelKrane runs the real host (in this process) with the real
// sentinel plugin (a plugin process) against ctrl and the shared cluster.
func startSentinelKrane(t *testing.T, srv *serve.Server, region string) {
	t.Helper()
	token, err := auth.RegisterCluster(context.Background(), srv.Store(), region, region+"-1")
	if err != nil {
		t.Fatal(err)
	}
	cluster := kubeenv.Shared(t)
	plugin := testenv.Build(t, "krane.dev/plugins/sentinel", "krane-plugin-sentinel")
	cfgPath := filepath.Join(t.TempDir(), "krane.hcl")
	hcl := fmt.Sprintf(`region = %q
cluster_id = "%s-1"
control_plane {
  url = "http://%s"
  token = %q
}
kubernetes {
  kubeconfig = %q
  # The test's admin credentials serve the plugins too.
  plugin_identities { enabled = false }
}
sync {
  reconnect_min = "50ms"
  reconnect_max = "200ms"
}
plugin_dir = %q
controller "sentinel" {
  config { namespace = %q }
}`, region, region, srv.GRPCAddr(), token, cluster.Kubeconfig, filepath.Dir(plugin), sentinelNamespace)
	if err := os.WriteFile(cfgPath, []byte(hcl), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(cfgPath, []string{})
	if err != nil {
		t.Fatal(err)
	}
	a := agent.New(cfg, hclog.New(&hclog.LoggerOptions{Level: hclog.Warn, Output: os.Stderr}), agent.Options{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = a.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	waitReady(t, a)
}

func operatorConn(t *testing.T, srv *serve.Server) *grpc.ClientConn {
	t.Helper()
	tok, err := auth.CreateOperatorToken(context.Background(), srv.Store(), "e2e")
	if err != nil {
		t.Fatal(err)
	}
	return operatorClient(t, srv.GRPCAddr(), tok)
}

// timeline records when each event was first seen.
type timeline struct {
	mu     sync.Mutex
	begin  time.Time
	events []string
	seen   map[string]bool
}

func (tl *timeline) mark(what string) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	if tl.seen[what] {
		return
	}
	tl.seen[what] = true
	tl.events = append(tl.events, fmt.Sprintf("%8s  %s", time.Since(tl.begin).Round(10*time.Millisecond), what))
}

// TestSentinelRolloutOnRealCluster: one sentinel on the simulated cluster,
// run by the real krane host and the real sentinel plugin, rolls to a new
// image through a fleet rollout: SentinelRolloutService deploys it with
// SentinelService, the plugin rolls the Deployment and reports, ctrl's
// Notifier wakes the deploy. At the end deploy_status is ready and every
// pod of the sentinel runs the new image.
func TestSentinelRolloutOnRealCluster(t *testing.T) {
	srv := startCtrlWithRestate(t)
	st := srv.Store()
	ctx := context.Background()
	const id = "sen_e2e_rollout"
	if _, err := st.WriteTx(ctx, func(ctx context.Context, tx *store.Tx) error {
		return tx.PutSentinel(ctx, store.Sentinel{ID: id, Region: "eu", WorkspaceID: "ws1", ProjectID: "p1", AppID: "a1", EnvironmentID: "env-e2e",
			K8sName: deployspec.K8sName(id), Image: sentinelV1, Replicas: 2, CPUMillicores: 100, MemoryMiB: 128})
	}); err != nil {
		t.Fatal(err)
	}
	startSentinelKrane(t, srv, "eu")
	waitFor(t, 2*time.Minute, "the sentinel healthy on v1", func() error {
		r, err := st.GetSentinel(ctx, id)
		if err != nil {
			return err
		}
		if !rules.SentinelConverged(r) {
			return fmt.Errorf("health %s (%s), running %q, version %d reported %d", r.Health, r.HealthReason, r.RunningImage, r.Version, r.ReportObservedVersion)
		}
		return nil
	})

	rollouts := ctrlv1.NewRolloutServiceClient(operatorConn(t, srv))
	// The package's Restate is shared: another test's rollout may be there.
	if cur, err := rollouts.GetRolloutStatus(ctx, &ctrlv1.GetRolloutStatusRequest{}); err != nil {
		t.Fatal(err)
	} else if s := cur.GetState(); s != "idle" && s != "completed" && s != "cancelled" {
		t.Fatalf("a rollout is already %s on this Restate", s)
	}
	cluster := kubeenv.Shared(t)
	name := deployspec.K8sName(id)
	tl := &timeline{begin: time.Now(), seen: map[string]bool{}}
	watchCtx, stopWatch := context.WithCancel(ctx)
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for watchCtx.Err() == nil {
			if d, err := cluster.Client.AppsV1().Deployments(sentinelNamespace).Get(watchCtx, name, metav1.GetOptions{}); err == nil {
				if d.Spec.Template.Spec.Containers[0].Image == sentinelV2 {
					tl.mark("Deployment spec on v2 (applied by the plugin)")
				}
			}
			if pods, err := sentinelPods(watchCtx, cluster, id); err == nil {
				for _, p := range pods {
					if p.Spec.Containers[0].Image == sentinelV2 && podReady(p) {
						tl.mark("first v2 pod ready")
					}
				}
			}
			if r, err := st.GetSentinel(watchCtx, id); err == nil {
				if r.DeployStatus == "progressing" {
					tl.mark("deploy_status progressing (new version written)")
				}
				if r.Health == "unhealthy" {
					tl.mark("reported unhealthy: " + r.HealthReason)
				}
				if r.RunningImage == sentinelV2 && r.Health == "healthy" {
					tl.mark("reported healthy on v2")
				}
			}
			time.Sleep(25 * time.Millisecond)
		}
	}()

	tl.mark("rollout started")
	rs, err := rollouts.StartRollout(ctx, &ctrlv1.StartRolloutRequest{Image: sentinelV2, DeployTimeoutSeconds: 180})
	if err != nil {
		t.Fatal(err)
	}
	if rs.GetTotal() != 1 || len(rs.GetWaves()) != 1 {
		t.Fatalf("rollout of one sentinel: %v", rs)
	}
	deadline := time.Now().Add(3 * time.Minute)
	for rs.GetState() == "in_progress" && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
		if rs, err = rollouts.GetRolloutStatus(ctx, &ctrlv1.GetRolloutStatusRequest{}); err != nil {
			t.Fatal(err)
		}
	}
	tl.mark("rollout " + rs.GetState())
	stopWatch()
	<-watched
	if rs.GetState() != "completed" || rs.GetSucceeded() != 1 {
		t.Fatalf("rollout: %v", rs)
	}

	r, err := st.GetSentinel(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if r.DeployStatus != "ready" || r.Image != sentinelV2 || r.RunningImage != sentinelV2 || r.Health != "healthy" || r.ReportObservedVersion < r.Version {
		t.Fatalf("sentinel after the rollout: %+v", r)
	}
	pods, err := sentinelPods(ctx, cluster, id)
	if err != nil {
		t.Fatal(err)
	}
	var images []string
	for _, p := range pods {
		if p.DeletionTimestamp != nil {
			t.Errorf("pod %s still terminating after the rollout", p.Name)
		}
		images = append(images, p.Spec.Containers[0].Image)
		if p.Spec.Containers[0].Image != sentinelV2 || !podReady(p) {
			t.Errorf("pod %s: %s, ready %v", p.Name, p.Spec.Containers[0].Image, podReady(p))
		}
	}
	if len(pods) != 2 {
		t.Errorf("%d pods (%s), want the 2 replicas", len(pods), strings.Join(images, ", "))
	}
	t.Logf("rollout of one real sentinel (2 replicas, minReadySeconds 5):\n  %s", strings.Join(tl.events, "\n  "))

	// And back to v1 through the SentinelService API, waiting.
	begin := time.Now()
	resp, err := ctrlv1.NewSentinelServiceClient(operatorConn(t, srv)).DeploySentinel(ctx, &ctrlv1.DeploySentinelRequest{SentinelId: id, Image: sentinelV1, Wait: true})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetResult() != "ready" || resp.GetSentinel().GetRunningImage() != sentinelV1 || resp.GetSentinel().GetDeployStatus() != "ready" {
		t.Fatalf("DeploySentinel back to v1: %v", resp)
	}
	waitFor(t, 30*time.Second, "every pod on v1", func() error {
		pods, err := sentinelPods(ctx, cluster, id)
		if err != nil {
			return err
		}
		for _, p := range pods {
			if p.Spec.Containers[0].Image != sentinelV1 {
				return fmt.Errorf("pod %s on %s", p.Name, p.Spec.Containers[0].Image)
			}
		}
		return nil
	})
	t.Logf("DeploySentinel back to v1 with wait: ready after %s", time.Since(begin).Round(10*time.Millisecond))
}

func sentinelPods(ctx context.Context, c *kubeenv.Cluster, id string) ([]corev1.Pod, error) {
	list, err := c.Client.CoreV1().Pods(sentinelNamespace).List(ctx, metav1.ListOptions{LabelSelector: "unkey.com/sentinel.id=" + id})
	if err != nil {
		return nil, err
	}
	return list.Items, nil
}

func podReady(p corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
