package agent_test

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"krane.dev/host/agent"
	"krane.dev/host/config"
	"krane.dev/internal/testenv/kubeenv"
	"krane.dev/internal/testplugins/noop"
	"krane.dev/sdk"
	"krane.dev/sdk/plugintest"
)

// leaderBlock is a leader_election block with short timings, a Lease of
// the test's own and the given identity.
func leaderBlock(lease, identity string) string {
	return fmt.Sprintf(`leader_election {
  enabled = true
  namespace = "krane"
  name = %q
  identity = %q
  lease_duration = "3s"
  renew_deadline = "2s"
  retry_period = "500ms"
}`, lease, identity)
}

// leaseName is a Lease name unique to the test.
func leaseName(t *testing.T) string {
	return strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(t.Name()))
}

// holder is who holds the Lease now ("" when released or absent).
func holder(t *testing.T, c *kubeenv.Cluster, name string) string {
	t.Helper()
	l, err := c.Client.CoordinationV1().Leases("krane").Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		return ""
	}
	if l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

// elected runs an agent for cfg with leader election until the test ends;
// done is closed when RunElected returned, with its error in *err.
func elected(t *testing.T, cfg *config.Config, logs io.Writer, opts agent.Options) (a *agent.Agent, cancel context.CancelFunc, done <-chan struct{}, err *error) {
	t.Helper()
	a = agent.New(cfg, hclog.New(&hclog.LoggerOptions{Name: cfg.Leader.Identity, Level: hclog.Debug, Output: logs}), opts)
	ctx, cancel := context.WithCancel(context.Background())
	finished := make(chan struct{})
	err = new(error)
	go func() {
		defer close(finished)
		*err = a.RunElected(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-finished:
		case <-time.After(60 * time.Second):
			t.Errorf("%s: RunElected did not return within a minute of its context's end", cfg.Leader.Identity)
		}
	})
	return a, cancel, finished, err
}

func electedHarness(t *testing.T, identity string) (*harness, *config.Config) {
	t.Helper()
	h := newHostHarness(t, `controller "noop-a" {}`, noopPlugins(t, "noop-a"))
	h.cluster = kubeenv.Shared(t)
	if err := h.cluster.EnsureNamespace(context.Background(), "krane"); err != nil {
		t.Fatal(err)
	}
	h.writeConfig(`controller "noop-a" {}`, leaderBlock(leaseName(t), identity))
	return h, h.load()
}

// TestLeaderWhoseRunFailsLetsAnotherLead: a replica that wins the lease
// but cannot run its controllers (its ctrl CA file is missing) gives the
// lease up, so a healthy replica takes over, instead of renewing it
// forever while nothing runs.
func TestLeaderWhoseRunFailsLetsAnotherLead(t *testing.T) {
	h, good := electedHarness(t, "healthy")
	bad := h.load()
	bad.Leader.Identity = "broken"
	bad.ControlPlane.URL = "https://127.0.0.1:1"
	bad.ControlPlane.CAFile = filepath.Join(h.dir, "missing-ca.pem")
	name := good.Leader.Name

	elected(t, bad, h.logs, agent.Options{})
	eventually(t, 60*time.Second, "the broken replica leading first", func() error {
		// It holds the lease, or held it and gave it up already.
		if got := holder(t, h.cluster, name); got != "broken" && !strings.Contains(h.logs.String(), "gave the lease up") {
			return fmt.Errorf("lease held by %q", got)
		}
		return nil
	})
	a, _, _, _ := elected(t, good, h.logs, agent.Options{})
	eventually(t, 60*time.Second, "the healthy replica leading and running its controller", func() error {
		if got := holder(t, h.cluster, name); got != "healthy" {
			return fmt.Errorf("lease held by %q", got)
		}
		if !a.Leading() || a.Plugin("noop-a") == nil || !a.Plugin("noop-a").Running() {
			return fmt.Errorf("healthy replica not running its controller")
		}
		return nil
	})
}

// blockingShutdown is a controller whose Shutdown waits for the test.
type blockingShutdown struct {
	*noop.Controller
	called  chan struct{}
	release chan struct{}
}

func (b *blockingShutdown) Shutdown(ctx context.Context) error {
	close(b.called)
	select {
	case <-b.release:
	case <-ctx.Done():
	}
	return nil
}

// TestLeaseReleasedOnlyAfterControllersStop: on a graceful stop, the
// lease is released only once the controllers have stopped; released
// earlier, another replica could start acting while this one still does.
func TestLeaseReleasedOnlyAfterControllersStop(t *testing.T) {
	h := newHostHarness(t, `controller "inproc" {}`, t.TempDir())
	h.cluster = kubeenv.Shared(t)
	if err := h.cluster.EnsureNamespace(context.Background(), "krane"); err != nil {
		t.Fatal(err)
	}
	h.writeConfig(`controller "inproc" {}`, leaderBlock(leaseName(t), "only"))
	cfg := h.load()
	ctl := &blockingShutdown{Controller: noop.New("inproc"), called: make(chan struct{}), release: make(chan struct{})}
	rc := plugintest.Serve(t, sdk.Controller(ctl))
	a, cancel, done, runErr := elected(t, cfg, h.logs, agent.Options{Reattach: map[string]*plugin.ReattachConfig{"inproc": rc}})
	eventually(t, 60*time.Second, "leading with the controller running", func() error {
		if holder(t, h.cluster, cfg.Leader.Name) != "only" || a.Plugin("inproc") == nil || !a.Plugin("inproc").Running() {
			return fmt.Errorf("not leading yet")
		}
		return nil
	})
	cancel() // SIGTERM
	<-ctl.called
	// The plugin is still shutting down: the lease must stay held. A
	// wrongful release happens within milliseconds of the cancel, so a
	// second of watching is plenty to see it.
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if got := holder(t, h.cluster, cfg.Leader.Name); got != "only" {
			t.Fatalf("lease released (holder %q) while the controller was still stopping", got)
		}
	}
	close(ctl.release)
	<-done
	if *runErr != nil {
		t.Fatalf("RunElected: %v", *runErr)
	}
	if got := holder(t, h.cluster, cfg.Leader.Name); got != "" {
		t.Errorf("lease still held by %q after a graceful stop", got)
	}
}
