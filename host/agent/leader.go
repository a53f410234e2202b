package agent

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"krane.dev/sdk"
	"krane.dev/sdk/kube"
)

// leaderState is what /readyz and /metrics say about leadership.
type leaderState struct {
	mu       sync.Mutex
	enabled  bool
	leading  bool
	observed string
	gauge    prometheus.Gauge
}

// RunElected runs the agent only while this replica holds the cluster's
// Lease (leader_election in krane.hcl). Losing the lease stops every
// controller before another replica can start them; the loop then competes
// again. A standby reports ready (it is healthy, just not leading).
func (a *Agent) RunElected(ctx context.Context) error {
	cfg := a.cfg
	le := cfg.Leader
	rc, err := kube.RESTConfig(sdk.KubeSource{InCluster: cfg.Kubernetes.Kubeconfig == "", Path: cfg.Kubernetes.Kubeconfig, Context: cfg.Kubernetes.Context})
	if err != nil {
		return fmt.Errorf("leader election needs the API server: %w", err)
	}
	client, err := kube.NewClientset(rc)
	if err != nil {
		return err
	}
	id := le.Identity
	if id == "" {
		host, _ := os.Hostname()
		id = fmt.Sprintf("%s-%d", host, os.Getpid())
	}
	a.leader.mu.Lock()
	a.leader.enabled = true
	a.leader.mu.Unlock()
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Name: le.Name, Namespace: le.Namespace},
		Client:     client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: id},
	}
	for ctx.Err() == nil {
		// The callback only hands its context over: the agent runs here, so
		// this loop knows for sure when a leadership has fully stopped
		// before it competes again.
		leading := make(chan context.Context, 1)
		elected := make(chan struct{})
		go func() {
			defer close(elected)
			leaderelection.RunOrDie(ctx, leaderelection.LeaderElectionConfig{
				Lock:            lock,
				LeaseDuration:   le.LeaseDuration,
				RenewDeadline:   le.RenewDeadline,
				RetryPeriod:     le.RetryPeriod,
				ReleaseOnCancel: true,
				Name:            le.Name,
				Callbacks: leaderelection.LeaderCallbacks{
					OnStartedLeading: func(lctx context.Context) { leading <- lctx },
					OnStoppedLeading: func() {},
					OnNewLeader: func(leader string) {
						a.setObserved(leader)
						if leader != id {
							a.log.Info("standing by", "leader", leader)
						}
					},
				},
			})
		}()
		select {
		case lctx := <-leading:
			a.setLeading(true, id)
			a.log.Info("acquired the lease: running controllers", "lease", le.Namespace+"/"+le.Name, "identity", id)
			if err := a.Run(lctx); err != nil {
				a.log.Error("agent stopped with an error", "error", err)
			}
			a.setLeading(false, "")
			<-elected
			if ctx.Err() == nil {
				a.log.Warn("lost the lease: controllers stopped; competing again", "lease", le.Namespace+"/"+le.Name)
			}
		case <-elected:
		}
		select {
		case <-ctx.Done():
		case <-time.After(le.RetryPeriod):
		}
	}
	return nil
}

func (a *Agent) setLeading(v bool, id string) {
	a.leader.mu.Lock()
	defer a.leader.mu.Unlock()
	a.leader.leading = v
	if v {
		a.leader.observed = id
		a.leader.gauge.Set(1)
	} else {
		a.leader.gauge.Set(0)
	}
}

func (a *Agent) setObserved(id string) {
	a.leader.mu.Lock()
	a.leader.observed = id
	a.leader.mu.Unlock()
}

// standby reports whether leader election runs and this replica is not the
// leader, and who is.
func (a *Agent) standby() (bool, string) {
	a.leader.mu.Lock()
	defer a.leader.mu.Unlock()
	return a.leader.enabled && !a.leader.leading, a.leader.observed
}

// Leading reports whether this replica runs the controllers.
func (a *Agent) Leading() bool {
	a.leader.mu.Lock()
	defer a.leader.mu.Unlock()
	return !a.leader.enabled || a.leader.leading
}
