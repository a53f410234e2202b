package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"

	"krane.dev/ctrl/deployspec"
	"krane.dev/ctrl/store"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
)

// churn writes desired-state changes into ctrl's database at a steady rate:
// creates, updates and deletes of deployments, sentinels and policies in
// every region. It writes through ctrl's store (the same transaction and
// version stamping the workflows use) so the changes flow through the
// ClusterService like any other.
type churn struct {
	s       *store.Store
	regions []string

	// mu serialises the churn's own steps with the faults' writes.
	mu  sync.Mutex
	rng *rand.Rand
	// written counts committed changes (a write that failed because MySQL
	// was down is retried later and counted once).
	written int
}

const (
	nDeployments = 8
	nSentinels   = 3
	nPolicies    = 4
	chaosNS      = "ws-chaos"
)

func (c *churn) step(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	var err error
	switch c.rng.IntN(3) {
	case 0:
		err = c.deployment(ctx)
	case 1:
		err = c.sentinel(ctx)
	default:
		err = c.policy(ctx)
	}
	if err == nil {
		c.written++
	}
	return err
}

// write commits one transaction of a fault's own and counts it.
func (c *churn) write(ctx context.Context, f func(context.Context, *store.Tx) error) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, err := c.s.WriteTx(ctx, f)
	if err == nil {
		c.written++
	}
	return err
}

// changes is how many changes were committed so far.
func (c *churn) changes() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.written
}

func (c *churn) deployment(ctx context.Context) error {
	i := c.rng.IntN(nDeployments)
	id := fmt.Sprintf("chaos-dep-%d", i)
	image := fmt.Sprintf("registry.local/chaos/app:%d", c.rng.IntN(1000))
	replicas := int32(1 + c.rng.IntN(2))
	status := "running"
	if c.rng.IntN(5) == 0 {
		status = "stopped"
	}
	_, err := c.s.WriteTx(ctx, func(ctx context.Context, tx *store.Tx) error {
		d := store.Deployment{Spec: deployspec.Spec{ID: id, WorkspaceID: "chaos", ProjectID: "p", EnvironmentID: "chaos-env", AppID: "a", K8sNamespace: chaosNS, K8sName: fmt.Sprintf("chaos-dep-%d", i), Replicas: replicas, Workload: &clusterv1.Workload{Image: image, CpuMillicores: 100, MemoryMib: 64, EnvVars: map[string]string{"N": fmt.Sprint(c.written)}, Port: 8080, Command: []string{}}}}
		if err := tx.PutDeployment(ctx, d); err != nil {
			return err
		}
		for _, r := range c.regions {
			if err := tx.PutTopology(ctx, store.Topology{DeploymentID: id, Region: r, DesiredReplicas: replicas, DesiredStatus: status}); err != nil {
				return err
			}
		}
		return nil
	})
	return err
}

func (c *churn) sentinel(ctx context.Context) error {
	r := c.regions[c.rng.IntN(len(c.regions))]
	j := c.rng.IntN(nSentinels)
	state := "running"
	if c.rng.IntN(6) == 0 {
		state = "stopped"
	}
	s := store.Sentinel{
		ID: fmt.Sprintf("chaos-sen-%s-%d", r, j), Region: r, WorkspaceID: "chaos", ProjectID: "p", AppID: "a",
		EnvironmentID: fmt.Sprintf("chaos-env-%d", j), K8sName: fmt.Sprintf("chaos-sen-%d", j),
		Image: fmt.Sprintf("registry.local/chaos/sentinel:%d", c.rng.IntN(1000)), Replicas: 1,
		CPUMillicores: 100, MemoryMiB: 64, DesiredState: state,
	}
	_, err := c.s.WriteTx(ctx, func(ctx context.Context, tx *store.Tx) error { return tx.PutSentinel(ctx, s) })
	return err
}

func (c *churn) policy(ctx context.Context) error {
	r := c.regions[c.rng.IntN(len(c.regions))]
	k := c.rng.IntN(nPolicies)
	port := 1024 + c.rng.IntN(1000)
	policy := fmt.Sprintf(`{"endpointSelector":{"matchLabels":{"app":"chaos-%d"}},"ingress":[{"fromEndpoints":[{"matchLabels":{"app":"client"}}],"toPorts":[{"ports":[{"port":"%d","protocol":"TCP"}]}]}]}`, k, port)
	p := store.CiliumNetworkPolicy{
		ID: fmt.Sprintf("chaos-pol-%s-%d", r, k), Region: r, K8sNamespace: chaosNS, K8sName: fmt.Sprintf("chaos-pol-%d", k),
		Policy: []byte(policy), Deleted: c.rng.IntN(5) == 0,
	}
	_, err := c.s.WriteTx(ctx, func(ctx context.Context, tx *store.Tx) error { return tx.PutCiliumNetworkPolicy(ctx, p) })
	return err
}
