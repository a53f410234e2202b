package agent

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
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
// Lease (leader_election in krane.hcl); a standby reports ready (it is
// healthy, just not leading). The order of events is what keeps two
// replicas from acting at once:
//
//   - Losing the lease (a renewal failed) stops every controller; the
//     other replicas wait out the lease, renew_deadline shorter than
//     lease_duration being the margin client-go relies on.
//   - Stopping (ctx ends) stops every controller first and only then
//     releases the lease, so that another replica starts at once but never
//     while this one still acts. client-go's own ReleaseOnCancel releases
//     as the context ends, before the teardown: it is not used.
//   - A leader that cannot run its controllers (Run fails) stops renewing
//     and releases the lease, so a healthy replica can take over, then
//     waits (lease_duration, doubling to two minutes) before competing
//     again.
func (a *Agent) RunElected(ctx context.Context) error {
	cfg := a.cfg
	le := cfg.Leader
	rc, err := kube.RESTConfig(sdk.KubeSource{InCluster: cfg.Kubernetes.Kubeconfig == "", Path: cfg.Kubernetes.Kubeconfig, Context: cfg.Kubernetes.Context})
	if err != nil {
		return fmt.Errorf("leader election needs the API server: %w", err)
	}
	// client-go's lease lock takes its typed coordination client.
	client, err := kubernetes.NewForConfig(rc)
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
	lease := le.Namespace + "/" + le.Name
	failures := 0
	for ctx.Err() == nil {
		// The election runs on a context of its own, ended only once the
		// controllers stopped: then it stops renewing.
		leading := make(chan context.Context, 1)
		elector, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock:          lock,
			LeaseDuration: le.LeaseDuration,
			RenewDeadline: le.RenewDeadline,
			RetryPeriod:   le.RetryPeriod,
			Name:          le.Name,
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
		if err != nil {
			return fmt.Errorf("leader_election: %w", err)
		}
		ectx, stopElection := context.WithCancel(context.Background())
		elected := make(chan struct{})
		go func() {
			defer close(elected)
			elector.Run(ectx)
		}()
		var lctx context.Context
		select {
		case lctx = <-leading:
		case <-ctx.Done():
		case <-elected:
		}
		if lctx == nil {
			stopElection()
			<-elected
			continue
		}
		a.setLeading(true, id)
		a.log.Info("acquired the lease: running controllers", "lease", lease, "identity", id)
		rctx, stopRun := context.WithCancel(lctx)
		stopOnShutdown := context.AfterFunc(ctx, stopRun)
		runErr := a.Run(rctx) // returns once every controller has stopped
		stopOnShutdown()
		stopRun()
		lost := lctx.Err() != nil && ctx.Err() == nil
		stopElection()
		<-elected
		a.setLeading(false, "")
		if !lost {
			// Nothing runs any more: hand the lease over now rather than
			// make the others wait for it to expire.
			if err := releaseLease(lock, id); err != nil {
				a.log.Warn("could not release the lease; another replica takes over when it expires", "lease", lease, "error", err)
			} else {
				a.log.Info("released the lease", "lease", lease)
			}
		}
		wait := le.RetryPeriod
		switch {
		case runErr != nil:
			failures++
			wait = min(2*time.Minute, le.LeaseDuration<<min(failures-1, 8))
			a.log.Error("could not run the controllers while leading; gave the lease up so a healthy replica can lead", "error", runErr, "lease", lease, "competing_again_in", wait)
		case lost:
			failures = 0
			a.log.Warn("lost the lease: controllers stopped; competing again", "lease", lease)
		default:
			failures = 0
		}
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
	}
	return nil
}

// releaseLease gives the lease up if id still holds it, as client-go's
// ReleaseOnCancel would (an empty holder and a one-second duration), but
// at the moment the caller chooses.
func releaseLease(lock *resourcelock.LeaseLock, id string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rec, _, err := lock.Get(ctx)
	if err != nil {
		return err
	}
	if rec.HolderIdentity != id {
		return nil
	}
	now := metav1.NewTime(time.Now())
	return lock.Update(ctx, resourcelock.LeaderElectionRecord{
		LeaderTransitions: rec.LeaderTransitions, LeaseDurationSeconds: 1, RenewTime: now, AcquireTime: now,
	})
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
