package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"krane.dev/ctrl/auth"
	"krane.dev/ctrl/serve"
	"krane.dev/ctrl/store"
	"krane.dev/host/agent"
	"krane.dev/host/config"
	"krane.dev/internal/testenv"
	"krane.dev/internal/testenv/kubeenv"
	"krane.dev/sdk/kube"
)

func TestMain(m *testing.M) { testenv.Main(m) }

const cmKind = "configmap.example.krane.dev"

// cmComponent is the component label the example plugin puts on its
// ConfigMaps.
const cmComponent = "configmap-example"

// startCtrl runs a real ctrl on a fresh database.
func startCtrl(t *testing.T) *serve.Server {
	t.Helper()
	cfg, err := serve.LoadConfig(nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg.DB.DSN = testenv.SharedMySQL(t).Database(t, t.Name())
	cfg.GRPC.Addr, cfg.HTTP.Addr = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Watch.PollInterval = 20 * time.Millisecond
	cfg.Log.Level, cfg.Log.Format = "warn", "text"
	ctx, cancel := context.WithCancel(context.Background())
	srv, err := serve.Start(ctx, cfg, hclog.NewNullLogger(), serve.Deps{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); _ = srv.Wait() })
	return srv
}

// startKrane runs the real host (in this process) with the example plugin
// (a real plugin process) against ctrl and the shared cluster.
func startKrane(t *testing.T, srv *serve.Server, region, namespace string) *agent.Agent {
	t.Helper()
	ctx := context.Background()
	token, err := auth.RegisterCluster(ctx, srv.Store(), region, region+"-1")
	if err != nil {
		t.Fatal(err)
	}
	cluster := kubeenv.Shared(t)
	if err := cluster.EnsureNamespace(ctx, namespace); err != nil {
		t.Fatal(err)
	}
	// A host inventories its kind across the whole cluster, as the one
	// krane of a cluster should; on this shared API server another test's
	// host left ConfigMaps of the kind, which this host would count as its
	// own (and its garbage-collection brake would refuse to delete them).
	// Each test starts on a cluster with none and leaves none.
	clearConfigMaps := func() {
		cms := cluster.Client.CoreV1().ConfigMaps
		list, err := cms(metav1.NamespaceAll).List(ctx, metav1.ListOptions{LabelSelector: kube.ManagedSelector(cmComponent)})
		if err != nil {
			t.Fatalf("listing the example plugin's ConfigMaps on the shared cluster: %v", err)
		}
		for _, cm := range list.Items {
			if err := cms(cm.Namespace).Delete(ctx, cm.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				t.Fatalf("deleting ConfigMap %s/%s, left on the shared cluster: %v", cm.Namespace, cm.Name, err)
			}
		}
	}
	clearConfigMaps()
	t.Cleanup(clearConfigMaps) // runs after the host below has stopped
	plugin := testenv.Build(t, "krane.dev/sdk/examples/configmap", "krane-plugin-configmap")
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
controller "configmap" {
  config { allowed_namespaces = [%q] }
}`, region, region, srv.GRPCAddr(), token, cluster.Kubeconfig, filepath.Dir(plugin), namespace)
	if err := os.WriteFile(cfgPath, []byte(hcl), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(cfgPath, []string{})
	if err != nil {
		t.Fatal(err)
	}
	a := agent.New(cfg, hclog.New(&hclog.LoggerOptions{Level: hclog.Warn, Output: os.Stderr}), agent.Options{})
	actx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = a.Run(actx) }()
	t.Cleanup(func() { cancel(); <-done })
	return a
}

func putConfigMap(t *testing.T, st *store.Store, region, id, ns, name, value string, deleted bool) time.Time {
	t.Helper()
	spec, _ := json.Marshal(map[string]any{"namespace": ns, "name": name, "data": map[string]string{"v": value}})
	_, err := st.WriteTx(context.Background(), func(ctx context.Context, tx *store.Tx) error {
		return tx.PutResource(ctx, store.Resource{Kind: cmKind, Region: region, ID: id, Spec: spec, Deleted: deleted})
	})
	if err != nil {
		t.Fatal(err)
	}
	return time.Now()
}

// TestHostAgainstCtrl: a plugin author's kind flows from ctrl's generic
// resources table through the real host and plugin into the cluster, and
// status flows back into the table; no host or ctrl change was needed for
// the kind. It also measures commit -> object visible in the API server.
func TestHostAgainstCtrl(t *testing.T) {
	srv := startCtrl(t)
	st := srv.Store()
	ns := "e2e-host-ctrl"
	cluster := kubeenv.Shared(t)
	ctx := context.Background()

	for i := range 10 {
		putConfigMap(t, st, "eu", fmt.Sprintf("r%d", i), ns, fmt.Sprintf("cm-%d", i), "1", false)
	}
	putConfigMap(t, st, "us", "other-region", ns, "cm-us", "1", false) // another region's object
	a := startKrane(t, srv, "eu", ns)
	waitFor(t, 60*time.Second, "bootstrap from ctrl", func() error {
		list, err := cluster.Client.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/managed-by=krane"})
		if err != nil {
			return err
		}
		if len(list.Items) != 10 {
			return fmt.Errorf("%d ConfigMaps, want the region's 10", len(list.Items))
		}
		return nil
	})
	waitFor(t, 30*time.Second, "ready", func() error {
		if ok, why := a.Ready(); !ok {
			return fmt.Errorf("%v", why)
		}
		return nil
	})

	// Propagation: commit in ctrl -> object visible through a watch.
	w, err := cluster.Client.CoreV1().ConfigMaps(ns).Watch(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/managed-by=krane"})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	var lat []time.Duration
	for i := range 50 {
		want := fmt.Sprintf("v%d", i)
		committed := putConfigMap(t, st, "eu", "r1", ns, "cm-1", want, false)
		deadline := time.After(10 * time.Second)
	wait:
		for {
			select {
			case ev := <-w.ResultChan():
				if cm, ok := ev.Object.(*corev1.ConfigMap); ok && ev.Type == watch.Modified && cm.Data["v"] == want {
					lat = append(lat, time.Since(committed))
					break wait
				}
			case <-deadline:
				t.Fatalf("change %d not visible within 10s", i)
			}
		}
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	t.Logf("propagation ctrl commit -> API server, %d changes: p50 %s, p90 %s, max %s", len(lat),
		lat[len(lat)/2].Round(time.Millisecond), lat[len(lat)*9/10].Round(time.Millisecond), lat[len(lat)-1].Round(time.Millisecond))

	// A soft delete in ctrl removes the object; status flows back.
	putConfigMap(t, st, "eu", "r2", ns, "cm-2", "1", true)
	waitFor(t, 20*time.Second, "delete applied", func() error {
		_, err := cluster.Client.CoreV1().ConfigMaps(ns).Get(ctx, "cm-2", metav1.GetOptions{})
		if err == nil {
			return fmt.Errorf("cm-2 still exists")
		}
		return nil
	})
	waitFor(t, 20*time.Second, "status stored in ctrl", func() error {
		var status []byte
		row := st.DB().QueryRowContext(ctx, "SELECT COALESCE(MAX(status), '') FROM object_reports WHERE kind = ? AND region = 'eu' AND id = 'r3'", cmKind)
		if err := row.Scan(&status); err != nil {
			return err
		}
		var s map[string]any
		if err := json.Unmarshal(status, &s); err != nil || s["present"] != true {
			return fmt.Errorf("status = %s", status)
		}
		return nil
	})
	// A bad object is parked by the host and its reason lands in ctrl.
	putConfigMap(t, st, "eu", "bad", "kube-system", "x", "1", false)
	waitFor(t, 20*time.Second, "apply error in ctrl", func() error {
		errs, err := st.ApplyErrors(ctx, cmKind, "eu", "bad")
		if err != nil || len(errs) != 1 || errs[0].Field != "namespace" || !errs[0].Permanent {
			return fmt.Errorf("apply errors %+v, %v", errs, err)
		}
		return nil
	})
}

// waitReady waits until an in-process krane is ready: its controllers run,
// bootstrapped, and ctrl has accepted a heartbeat naming them (so a deploy
// to its region passes ctrl's fail-fast check).
func waitReady(t *testing.T, a *agent.Agent) {
	t.Helper()
	waitFor(t, 2*time.Minute, "krane ready", func() error {
		if ok, why := a.Ready(); !ok {
			return fmt.Errorf("%v", why)
		}
		return nil
	})
}

func waitFor(t *testing.T, timeout time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var err error
	for time.Now().Before(deadline) {
		if err = cond(); err == nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s: %v", what, err)
}
