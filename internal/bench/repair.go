package bench

import (
	"context"
	"fmt"
	"slices"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"krane.dev/ctrl/deployspec"
	"krane.dev/ctrl/store"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
)

// RepairEdits is how many hand edits DriftRepair makes per kind (cmd/bench
// -repair-edits; a smoke run makes two per object).
var RepairEdits = 100

// repairTarget is one built-in kind's object that DriftRepair edits by
// hand: where it lives, the JSON patch that edits it (as kubectl edit
// would), and the field that tells edited from repaired.
type repairTarget struct {
	kind      string
	what      string // the edit, for the figure's name
	gvr       schema.GroupVersionResource
	namespace string
	selector  string
	patch     string
	field     []string
	want      any // the field's desired value
}

// DriftRepair measures, for each built-in kind, a hand edit of a managed
// object -> the edit taken back, observed by a watch: a ReplicaSet's image
// (deployment), a sentinel Deployment's replicas, a CiliumNetworkPolicy's
// port. Each plugin repairs from ctrl's desired state as soon as its
// informer sees the edit (kube.Repairer, through the host's
// GetDesiredState), not at the next resync.
func DriftRepair(ctx context.Context, e *Env) ([]Figure, error) {
	const objects = 5
	const image = "registry.local/bench/repair:1"
	ns := "ws-bench-repair"
	_, err := e.Store.WriteTx(ctx, func(ctx context.Context, tx *store.Tx) error {
		for i := range objects {
			id := fmt.Sprintf("repair-%02d", i)
			if err := tx.PutDeployment(ctx, store.Deployment{Spec: deployspec.Spec{ID: id, WorkspaceID: "bench", ProjectID: "p", EnvironmentID: "bench-repair", AppID: "a", K8sNamespace: ns, K8sName: id, Replicas: 1, Workload: &clusterv1.Workload{Image: image, CpuMillicores: 100, MemoryMib: 64, EnvVars: map[string]string{}, Port: 8080, Command: []string{}}}}); err != nil {
				return err
			}
			if err := tx.PutTopology(ctx, store.Topology{DeploymentID: id, Region: e.Region, DesiredReplicas: 1, DesiredStatus: "running"}); err != nil {
				return err
			}
			sid := fmt.Sprintf("repair-sen-%02d", i)
			if err := tx.PutSentinel(ctx, store.Sentinel{ID: sid, Region: e.Region, WorkspaceID: "bench", ProjectID: "p", AppID: "a",
				EnvironmentID: "bench-repair-" + sid, K8sName: sid, Image: "registry.local/bench/sentinel:1", Replicas: 1, CPUMillicores: 100, MemoryMiB: 64}); err != nil {
				return err
			}
			policy := fmt.Sprintf(`{"endpointSelector":{"matchLabels":{"app":"repair-%02d"}},"ingress":[{"toPorts":[{"ports":[{"port":"8080","protocol":"TCP"}]}]}]}`, i)
			if err := tx.PutCiliumNetworkPolicy(ctx, store.CiliumNetworkPolicy{ID: fmt.Sprintf("repair-cnp-%02d", i), Region: e.Region,
				K8sNamespace: ns, K8sName: fmt.Sprintf("repair-%02d", i), Policy: []byte(policy)}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	targets := []repairTarget{
		{kind: "deployment", what: "a ReplicaSet's image", gvr: schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "replicasets"}, namespace: ns,
			selector: "unkey.com/environment.id=bench-repair",
			patch:    `[{"op": "replace", "path": "/spec/template/spec/containers/0/image", "value": "registry.local/bench/edited:1"}]`,
			field:    []string{"spec", "template", "spec", "containers"}, want: image},
		{kind: "sentinel", what: "a sentinel Deployment's replicas", gvr: schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"}, namespace: "sentinel",
			selector: "app.kubernetes.io/component=sentinel,unkey.com/environment.id in (" + sentinelEnvs(objects) + ")",
			patch:    `[{"op": "replace", "path": "/spec/replicas", "value": 3}]`,
			field:    []string{"spec", "replicas"}, want: int64(1)},
		{kind: "ciliumnetworkpolicy", what: "a CiliumNetworkPolicy's port", gvr: schema.GroupVersionResource{Group: "cilium.io", Version: "v2", Resource: "ciliumnetworkpolicies"}, namespace: ns,
			selector: "app.kubernetes.io/component=ciliumnetworkpolicy",
			patch:    `[{"op": "replace", "path": "/spec/ingress/0/toPorts/0/ports/0/port", "value": "9999"}]`,
			field:    []string{"spec", "ingress"}, want: "8080"},
	}
	var figs []Figure
	for _, t := range targets {
		lat, err := e.measureRepair(ctx, t, objects)
		if err != nil {
			return nil, err
		}
		e.logf("drift repair (%s): %d hand edits: p50 %.1fms p90 %.1fms p99 %.1fms max %.1fms", t.kind, len(lat), percentile(lat, .5), percentile(lat, .9), percentile(lat, .99), percentile(lat, 1))
		figs = append(figs,
			Figure{Key: t.kind + "/p50", Name: fmt.Sprintf("hand edit of %s -> repaired, p50 (%d edits)", t.what, len(lat)), Value: percentile(lat, .5), Unit: "ms",
				Note: "on-demand repair via GetDesiredState; without it, the next resync (sync.resync_interval, 1 min by default)"},
			Figure{Key: t.kind + "/p99", Name: "... p99", Value: percentile(lat, .99), Unit: "ms", Target: Below(1000)},
			Figure{Key: t.kind + "/max", Name: "... max", Value: percentile(lat, 1), Unit: "ms"},
		)
	}
	return figs, nil
}

func sentinelEnvs(n int) string {
	s := ""
	for i := range n {
		if i > 0 {
			s += ","
		}
		s += fmt.Sprintf("bench-repair-repair-sen-%02d", i)
	}
	return s
}

// measureRepair waits for n objects of t, then edits them RepairEdits
// times in turn and returns how long each took to be taken back.
func (e *Env) measureRepair(ctx context.Context, t repairTarget, n int) ([]time.Duration, error) {
	res := e.St.Clusters[e.Region].Dynamic.Resource(t.gvr).Namespace(t.namespace)
	var objs []unstructured.Unstructured
	deadline := time.Now().Add(2 * time.Minute)
	for {
		list, err := res.List(ctx, metav1.ListOptions{LabelSelector: t.selector})
		if err == nil && len(list.Items) == n {
			objs = list.Items
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("drift repair setup (%s): %d objects not applied within 2 minutes", t.kind, n)
		}
		time.Sleep(200 * time.Millisecond)
	}
	var lat []time.Duration
	for i := range e.size(RepairEdits, 2*n) {
		obj := objs[i%n]
		w, err := res.Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + obj.GetName()})
		if err != nil {
			return nil, err
		}
		start := time.Now()
		if _, err := res.Patch(ctx, obj.GetName(), types.JSONPatchType, []byte(t.patch), metav1.PatchOptions{FieldManager: "kubectl-edit"}); err != nil {
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
					return nil, fmt.Errorf("drift repair (%s): watch of %s closed", t.kind, obj.GetName())
				}
				got, ok := ev.Object.(*unstructured.Unstructured)
				if !ok {
					continue
				}
				desired := t.holds(got)
				edited = edited || !desired
				repaired = edited && desired
			case <-timeout:
				w.Stop()
				return nil, fmt.Errorf("drift repair (%s): %s still edited after 30 s (is on-demand repair off? the resync would take up to a minute)", t.kind, obj.GetName())
			}
		}
		lat = append(lat, time.Since(start))
		w.Stop()
	}
	slices.Sort(lat)
	return lat, nil
}

// holds reports whether obj's field has its desired value: for a list
// (containers, ingress rules) the first entry's image or first port.
func (t repairTarget) holds(obj *unstructured.Unstructured) bool {
	v, found, _ := unstructured.NestedFieldNoCopy(obj.Object, t.field...)
	if !found {
		return false
	}
	switch x := v.(type) {
	case []any:
		if len(x) == 0 {
			return false
		}
		first, _ := x[0].(map[string]any)
		if img, ok := first["image"]; ok {
			return img == t.want
		}
		ports, _, _ := unstructured.NestedSlice(first, "toPorts")
		if len(ports) == 0 {
			return false
		}
		p, _, _ := unstructured.NestedSlice(ports[0].(map[string]any), "ports")
		if len(p) == 0 {
			return false
		}
		port, _, _ := unstructured.NestedString(p[0].(map[string]any), "port")
		return port == t.want
	default:
		return v == t.want
	}
}
