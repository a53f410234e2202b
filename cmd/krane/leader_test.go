package main_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"krane.dev/internal/clustertest"
	"krane.dev/internal/testenv"
	"krane.dev/internal/testenv/kubeenv"
)

// TestLeaderElectionFailover: two krane replicas of one cluster; only the
// lease holder runs plugins. Kill -9 the leader: the standby takes over
// (default lease timings) and applies a change made after the kill, within
// 20 seconds.
func TestLeaderElectionFailover(t *testing.T) {
	krane := testenv.Build(t, "krane.dev/cmd/krane", "krane")
	cm := testenv.Build(t, "krane.dev/sdk/examples/configmap", "krane-plugin-configmap")
	ctrl := clustertest.Start(t, "r1", "tok")
	kube := kubeenv.Shared(t)
	ctx := context.Background()
	ns := "leader-election"
	for _, n := range []string{"krane", ns} {
		if err := kube.EnsureNamespace(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	cfg := t.TempDir() + "/krane.hcl"
	hcl := fmt.Sprintf(`region = "r1"
cluster_id = "c1"
control_plane {
  url = %q
  token = "tok"
}
kubernetes {
  kubeconfig = %q
  # The test's admin credentials serve the plugins too.
  plugin_identities { enabled = false }
}
leader_election { enabled = true }
plugin_dir = %q
controller "configmap" {
  path = "krane-plugin-configmap"
}`, ctrl.URL(), kube.Kubeconfig, strings.TrimSuffix(cm, "/krane-plugin-configmap"))
	if err := os.WriteFile(cfg, []byte(hcl), 0o600); err != nil {
		t.Fatal(err)
	}
	put := func(id, value string) {
		ctrl.PutJSON("configmap.example.krane.dev", id, map[string]any{"namespace": ns, "name": id, "data": map[string]any{"v": value}})
	}
	applied := func(id, value string) error {
		got, err := kube.Client.CoreV1().ConfigMaps(ns).Get(ctx, id, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if got.Data["v"] != value {
			return fmt.Errorf("%s = %v", id, got.Data)
		}
		return nil
	}

	type replica struct {
		cmd  *exec.Cmd
		addr string
	}
	var replicas []*replica
	for i := range 2 {
		port, err := testenv.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		r := &replica{addr: fmt.Sprintf("127.0.0.1:%d", port)}
		r.cmd = exec.Command(krane, "run", "-c", cfg)
		r.cmd.Env = append(os.Environ(), "KRANE_SERVER__LISTEN="+r.addr, fmt.Sprintf("KRANE_LEADER_ELECTION__IDENTITY=replica-%d", i))
		if err := r.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.cmd.Process.Kill(); r.cmd.Wait() })
		replicas = append(replicas, r)
	}
	put("before", "1")
	var leader, standby *replica
	eventually(t, 60*time.Second, func() error {
		if err := applied("before", "1"); err != nil {
			return err
		}
		leader, standby = nil, nil
		for _, r := range replicas {
			switch n := len(children(r.cmd.Process.Pid)); n {
			case 1:
				leader = r
			case 0:
				standby = r
			default:
				return fmt.Errorf("replica runs %d plugins", n)
			}
		}
		if leader == nil || standby == nil {
			return fmt.Errorf("want exactly one leader running the plugin")
		}
		return nil
	})
	resp, err := http.Get("http://" + standby.addr + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("standby /readyz = %s, want 200 (standby)", resp.Status)
	}

	if err := leader.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	put("after", "2")
	eventually(t, 20*time.Second, func() error {
		if len(children(standby.cmd.Process.Pid)) != 1 {
			return fmt.Errorf("standby has not taken over")
		}
		return applied("after", "2")
	})
	t.Logf("standby took over and applied a change %s after the leader was killed", time.Since(killed).Round(100*time.Millisecond))
}
