package bench

import (
	"context"
	"fmt"
	"slices"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"krane.dev/ctrl/store"
)

// DriftRepair measures a hand edit of a managed ReplicaSet (its image, as
// kubectl edit would) -> the image restored, observed by a watch. The
// plugin repairs from ctrl's desired state as soon as its informer sees
// the edit (kube.Repairer, through the host's GetDesiredState), not at the
// next resync.
func DriftRepair(ctx context.Context, e *Env) ([]Figure, error) {
	const deployments, rounds = 5, 100
	const image = "registry.local/bench/repair:1"
	ns := "ws-bench-repair"
	c := e.St.Clusters[e.Region]
	for i := range deployments {
		id := fmt.Sprintf("repair-%02d", i)
		_, err := e.Store.WriteTx(ctx, func(ctx context.Context, tx *store.Tx) error {
			if err := tx.PutDeployment(ctx, store.Deployment{ID: id, WorkspaceID: "bench", ProjectID: "p", EnvironmentID: "bench-repair", AppID: "a",
				K8sNamespace: ns, K8sName: id, Image: image, CPUMillicores: 100, MemoryMiB: 64, Replicas: 1,
				EnvVars: map[string]string{}, Port: 8080, Command: []string{}}); err != nil {
				return err
			}
			return tx.PutTopology(ctx, store.Topology{DeploymentID: id, Region: e.Region, DesiredReplicas: 1, DesiredStatus: "running"})
		})
		if err != nil {
			return nil, err
		}
	}
	sel := metav1.ListOptions{LabelSelector: "unkey.com/environment.id=bench-repair"}
	var rss []appsv1.ReplicaSet
	deadline := time.Now().Add(2 * time.Minute)
	for {
		list, err := c.Client.AppsV1().ReplicaSets(ns).List(ctx, sel)
		if err == nil && len(list.Items) == deployments {
			rss = list.Items
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("drift repair setup: deployments not applied within 2 minutes")
		}
		time.Sleep(200 * time.Millisecond)
	}
	var lat []time.Duration
	for i := range rounds {
		rs := rss[i%deployments]
		w, err := c.Client.AppsV1().ReplicaSets(ns).Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + rs.Name})
		if err != nil {
			return nil, err
		}
		patch := `[{"op": "replace", "path": "/spec/template/spec/containers/0/image", "value": "registry.local/bench/edited:1"}]`
		start := time.Now()
		if _, err := c.Client.AppsV1().ReplicaSets(ns).Patch(ctx, rs.Name, types.JSONPatchType, []byte(patch), metav1.PatchOptions{FieldManager: "kubectl-edit"}); err != nil {
			w.Stop()
			return nil, err
		}
		edited, repaired := false, false
		timeout := time.After(30 * time.Second)
		for !repaired {
			select {
			case ev, ok := <-w.ResultChan():
				if !ok {
					w.Stop()
					return nil, fmt.Errorf("drift repair: watch of %s closed", rs.Name)
				}
				got, ok := ev.Object.(*appsv1.ReplicaSet)
				if !ok {
					continue
				}
				img := got.Spec.Template.Spec.Containers[0].Image
				edited = edited || img != image
				repaired = edited && img == image
			case <-timeout:
				w.Stop()
				return nil, fmt.Errorf("drift repair: %s still edited after 30 s (is on-demand repair off? the resync would take up to a minute)", rs.Name)
			}
		}
		lat = append(lat, time.Since(start))
		w.Stop()
	}
	slices.Sort(lat)
	e.logf("drift repair: %d hand edits: p50 %.1fms p90 %.1fms p99 %.1fms max %.1fms", len(lat), percentile(lat, .5), percentile(lat, .9), percentile(lat, .99), percentile(lat, 1))
	return []Figure{
		{Section: "3 resync", Name: fmt.Sprintf("hand edit of a ReplicaSet's image -> repaired, p50 (%d edits)", rounds), Value: percentile(lat, .5), Unit: "ms", Note: "on-demand repair via GetDesiredState; without it, the next resync (1 min)"},
		{Section: "3 resync", Name: "... p99", Value: percentile(lat, .99), Unit: "ms", Target: "< 1000 ms"},
		{Section: "3 resync", Name: "... max", Value: percentile(lat, 1), Unit: "ms"},
	}, nil
}
