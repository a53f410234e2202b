package bench

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"krane.dev/ctrl/deployspec"
	"krane.dev/ctrl/store"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
)

// Propagation measures ctrl commit -> object visible in the cluster's API
// server, observed by a watch: 500 changes at a steady 10/s (replica
// counts of 20 deployments), committed through ctrl's store with the same
// lock-ordered version stamping VersioningService uses.
func Propagation(ctx context.Context, e *Env) ([]Figure, error) {
	const deployments, rate = 20, 10
	changes := e.size(500, 40)
	ns := "ws-bench-prop"
	c := e.St.Clusters[e.Region]
	put := func(i int, replicas int32) error {
		_, err := e.Store.WriteTx(ctx, func(ctx context.Context, tx *store.Tx) error {
			id := fmt.Sprintf("prop-%02d", i)
			if err := tx.PutDeployment(ctx, store.Deployment{Spec: deployspec.Spec{ID: id, WorkspaceID: "bench", ProjectID: "p", EnvironmentID: "bench-prop", AppID: "a", K8sNamespace: ns, K8sName: id, Replicas: replicas, Workload: &clusterv1.Workload{Image: "registry.local/bench/prop:1", CpuMillicores: 100, MemoryMib: 64, EnvVars: map[string]string{}, Port: 8080, Command: []string{}}}}); err != nil {
				return err
			}
			return tx.PutTopology(ctx, store.Topology{DeploymentID: id, Region: e.Region, DesiredReplicas: replicas, DesiredStatus: "running"})
		})
		return err
	}
	for i := range deployments {
		if err := put(i, 1); err != nil {
			return nil, err
		}
	}
	// Wait for all 20 to exist.
	sel := metav1.ListOptions{LabelSelector: "unkey.com/environment.id=bench-prop"}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		list, err := c.Client.AppsV1().ReplicaSets(ns).List(ctx, sel)
		if err == nil && len(list.Items) == deployments {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("propagation setup: %d of %d deployments applied", len(list.Items), deployments)
		}
		time.Sleep(200 * time.Millisecond)
	}
	w, err := c.Client.AppsV1().ReplicaSets(ns).Watch(ctx, sel)
	if err != nil {
		return nil, err
	}
	defer w.Stop()

	type pending struct {
		replicas int32
		at       time.Time
	}
	var mu sync.Mutex
	waiting := map[string]pending{}
	var lat []time.Duration
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			rs, ok := ev.Object.(*appsv1.ReplicaSet)
			if !ok || ev.Type == watch.Deleted {
				continue
			}
			id := rs.Labels["unkey.com/deployment.id"]
			mu.Lock()
			if p, ok := waiting[id]; ok && rs.Spec.Replicas != nil && *rs.Spec.Replicas == p.replicas {
				lat = append(lat, time.Since(p.at))
				delete(waiting, id)
			}
			n := len(lat)
			mu.Unlock()
			if n == changes {
				return
			}
		}
	}()
	tick := time.NewTicker(time.Second / rate)
	defer tick.Stop()
	for i := range changes {
		<-tick.C
		d := i % deployments
		replicas := int32(2 - (i/deployments)%2) // 2, 1, 2, 1, ... per deployment
		if err := put(d, replicas); err != nil {
			return nil, err
		}
		mu.Lock()
		waiting[fmt.Sprintf("prop-%02d", d)] = pending{replicas, time.Now()}
		mu.Unlock()
	}
	select {
	case <-done:
	case <-time.After(30 * time.Second):
	}
	mu.Lock()
	defer mu.Unlock()
	if len(lat) < changes*99/100 {
		return nil, fmt.Errorf("only %d of %d changes were seen in the cluster", len(lat), changes)
	}
	slices.Sort(lat)
	e.logf("propagation: %d changes: p50 %.1fms p90 %.1fms p99 %.1fms max %.1fms", len(lat), percentile(lat, .5), percentile(lat, .9), percentile(lat, .99), percentile(lat, 1))
	deploys := e.size(10, 2)
	apiP50, err := apiPropagation(ctx, e, deploys)
	if err != nil {
		return nil, err
	}
	return []Figure{
		{Key: "p50", Name: fmt.Sprintf("ctrl commit -> visible in the API server, p50 (%d changes at %d/s)", changes, rate), Value: percentile(lat, .5), Unit: "ms"},
		{Key: "p90", Name: "... p90", Value: percentile(lat, .9), Unit: "ms"},
		{Key: "p99", Name: "... p99", Value: percentile(lat, .99), Unit: "ms", Target: Below(500), Note: "compare: the cited figures below (the reference platform's 1-5 s polling, Karmada's pull mode)"},
		{Key: "api-p50", Name: fmt.Sprintf("deploy API call -> ReplicaSet visible, p50 (%d deploys, workflow included)", deploys), Value: apiP50, Unit: "ms"},
	}, nil
}

// apiPropagation: CreateDeployment through the CLI -> ReplicaSet visible.
func apiPropagation(ctx context.Context, e *Env, n int) (float64, error) {
	c := e.St.Clusters[e.Region]
	var lat []time.Duration
	for i := range n {
		begin := time.Now()
		out, err := e.St.Ctrl(ctx, "deploy", "create", "--workspace", "bench", "--project", "p", "--app", "a", "--environment", "bench-api",
			"--image", fmt.Sprintf("registry.local/bench/api:%d", i), "--region", e.Region, "--replicas", "1")
		if err != nil {
			return 0, err
		}
		id := ""
		for _, f := range strings.Fields(string(out)) {
			if strings.HasPrefix(f, "dep_") {
				id = strings.TrimRight(f, ".,:")
			}
		}
		for {
			list, err := c.Client.AppsV1().ReplicaSets("").List(ctx, metav1.ListOptions{LabelSelector: "unkey.com/deployment.id=" + id})
			if err == nil && len(list.Items) > 0 {
				break
			}
			if time.Since(begin) > time.Minute {
				return 0, fmt.Errorf("deployment %s not visible within a minute", id)
			}
			time.Sleep(5 * time.Millisecond)
		}
		lat = append(lat, time.Since(begin))
	}
	slices.Sort(lat)
	return percentile(lat, .5), nil
}
