package controller_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/anypb"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"krane.dev/internal/testenv/kubeenv"
	"krane.dev/plugins/cilium/controller"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
	"krane.dev/sdk"
	"krane.dev/sdk/plugintest"
	"krane.dev/shared/kinds"
)

// rejectMe makes the API server refuse, in namespace team-b, every policy
// whose description is "reject-me": a rejection only the cluster can make,
// as an admission policy (Kyverno, Gatekeeper, a VAP) does in real clusters.
const rejectMe = `
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: krane-test-reject-me}
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
    - apiGroups: ["cilium.io"]
      apiVersions: ["v2"]
      operations: ["CREATE", "UPDATE"]
      resources: ["ciliumnetworkpolicies"]
  validations:
  - expression: "!has(object.spec) || !has(object.spec.description) || object.spec.description != 'reject-me'"
    message: "policies described as reject-me are refused by this cluster"
    reason: Invalid
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: krane-test-reject-me}
spec:
  policyName: krane-test-reject-me
  validationActions: [Deny]
  matchResources:
    namespaceSelector:
      matchLabels: {kubernetes.io/metadata.name: team-b}
`

func installRejectMe(t *testing.T, c *kubeenv.Cluster) {
	t.Helper()
	ctx := context.Background()
	if err := c.ApplyYAML(ctx, []byte(rejectMe)); err != nil {
		t.Fatal(err)
	}
	// The API server loads admission policies asynchronously: wait until
	// a dry-run create is refused.
	probe := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "cilium.io/v2", "kind": "CiliumNetworkPolicy",
		"metadata": map[string]any{"name": "probe", "namespace": "team-b"},
		"spec":     map[string]any{"description": "reject-me", "endpointSelector": map[string]any{}, "ingress": []any{map[string]any{}}},
	}}
	eventually(t, "admission policy in force", func() error {
		_, err := cnps(c, "team-b").Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err == nil {
			return errors.New("dry-run create still allowed")
		}
		return nil
	})
}

type statusStream struct {
	t       *testing.T
	reports chan sdk.StatusReport
}

func watchStatus(t *testing.T, ctl sdk.Plugin) *statusStream {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	s := &statusStream{t: t, reports: make(chan sdk.StatusReport, 1000)}
	go func() {
		_ = ctl.WatchStatus(ctx, func(r sdk.StatusReport) error {
			s.reports <- r
			return nil
		})
	}()
	return s
}

// next waits for the next report about id and returns it decoded.
func (s *statusStream) next(id string) (*clusterv1.CiliumNetworkPolicyStatus, uint64) {
	s.t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case r := <-s.reports:
			if r.ID != id {
				continue
			}
			if r.Kind != kinds.CiliumNetworkPolicy {
				s.t.Fatalf("status of kind %q", r.Kind)
			}
			st := &clusterv1.CiliumNetworkPolicyStatus{}
			a, ok := r.Status.(*anypb.Any)
			if !ok || a.UnmarshalTo(st) != nil {
				s.t.Fatalf("status %T is not a CiliumNetworkPolicyStatus", r.Status)
			}
			return st, r.ObservedVersion
		case <-timeout:
			s.t.Fatalf("no status report for %s within 10s", id)
			return nil, 0
		}
	}
}

// quiet asserts that no report about id arrives for a while.
func (s *statusStream) quiet(id string, d time.Duration) {
	s.t.Helper()
	timeout := time.After(d)
	for {
		select {
		case r := <-s.reports:
			if r.ID == id {
				s.t.Errorf("unexpected report for %s: %v", id, r.Status)
			}
		case <-timeout:
			return
		}
	}
}

func TestStatus(t *testing.T) {
	cluster := kubeenv.Shared(t)
	installRejectMe(t, cluster)
	_, ctl := start(t, pluginKubeconfig(t, cluster), testConfig)
	ctx := context.Background()
	status := watchStatus(t, ctl)
	const id = "pol-status"
	good := webPolicy("web", "8080")
	rejected := `{"description":"reject-me","endpointSelector":{},"ingress":[{}]}`

	// Applied.
	if _, err := plugintest.Apply(ctx, ctl, change(t, id, 1, "team-b", "status", good)); err != nil {
		t.Fatal(err)
	}
	st, v := status.next(id)
	if !st.GetApplied() || st.GetMessage() != "" || st.GetDeleted() || st.GetId() != id || v != 1 {
		t.Errorf("after apply: %v at version %d", st, v)
	}
	// Re-applying the same thing changes nothing: no report.
	if _, err := plugintest.Apply(ctx, ctl, change(t, id, 1, "team-b", "status", good)); err != nil {
		t.Fatal(err)
	}
	status.quiet(id, time.Second)

	// Rejected by the API server: a permanent error, and its message in
	// the status.
	_, err := plugintest.Apply(ctx, ctl, change(t, id, 2, "team-b", "status", rejected))
	if !sdk.IsPermanent(err) || !strings.Contains(err.Error(), "refused by this cluster") {
		t.Fatalf("Apply of a policy the cluster refuses = %v, want a permanent error with the API server's message", err)
	}
	st, v = status.next(id)
	if st.GetApplied() || !strings.Contains(st.GetMessage(), "refused by this cluster") || v != 2 {
		t.Errorf("after rejection: %v at version %d", st, v)
	}
	// Refused by Krane itself: also reported.
	if _, err := plugintest.Apply(ctx, ctl, change(t, id, 3, "team-b", "status", `{"endpointSelector":{},"ingress":[{"fromEntities":["all"]}]}`)); !sdk.IsPermanent(err) {
		t.Fatalf("Apply of an invalid policy = %v", err)
	}
	st, v = status.next(id)
	if st.GetApplied() || !strings.Contains(st.GetMessage(), "fromEntities") || v != 3 {
		t.Errorf("after invalid policy: %v at version %d", st, v)
	}

	// Fixed.
	if _, err := plugintest.Apply(ctx, ctl, change(t, id, 4, "team-b", "status", webPolicy("web", "9090"))); err != nil {
		t.Fatal(err)
	}
	for {
		st, v = status.next(id)
		if v == 4 {
			break
		}
	}
	if !st.GetApplied() || st.GetMessage() != "" {
		t.Errorf("after fix: %v", st)
	}

	// Deleted by hand: reported as deleted, once.
	if err := cnps(cluster, "team-b").Delete(ctx, "status", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	st, _ = status.next(id)
	if !st.GetDeleted() || st.GetApplied() {
		t.Errorf("after deletion by hand: %v", st)
	}
	status.quiet(id, time.Second)

	// Re-applied, then deleted by ctrl.
	if _, err := plugintest.Apply(ctx, ctl, change(t, id, 5, "team-b", "status", good)); err != nil {
		t.Fatal(err)
	}
	if st, _ = status.next(id); !st.GetApplied() {
		t.Errorf("after re-apply: %v", st)
	}
	if _, err := plugintest.Apply(ctx, ctl, deletion(id, 6)); err != nil {
		t.Fatal(err)
	}
	if st, _ = status.next(id); !st.GetDeleted() {
		t.Errorf("after delete: %v", st)
	}
	status.quiet(id, time.Second)
}

func TestStatusStreamStartsWithTheFullPicture(t *testing.T) {
	cluster := kubeenv.Shared(t)
	_, ctl := start(t, pluginKubeconfig(t, cluster), testConfig)
	ctx := context.Background()
	if _, err := plugintest.Apply(ctx, ctl, change(t, "pol-before-stream", 1, "team-a", "before-stream", webPolicy("web", "80"))); err != nil {
		t.Fatal(err)
	}
	status := watchStatus(t, ctl)
	if st, v := status.next("pol-before-stream"); !st.GetApplied() || v != 1 {
		t.Errorf("first report: %v at %d", st, v)
	}
	if _, err := plugintest.Apply(ctx, ctl, deletion("pol-before-stream", 2)); err != nil {
		t.Fatal(err)
	}
}

func TestCRDMissing(t *testing.T) {
	c := kubeenv.Start(t, kubeenv.Options{Name: "no-cilium", Zones: []string{"z1"}, WorkerNodesPerZone: 1, SentinelNodesPerZone: 1, WithoutCiliumCRD: true})
	t.Logf("cluster without the CRD started in %s", c.StartupTime().Round(time.Millisecond))
	_, ctl := start(t, pluginKubeconfig(t, c), testConfig)
	ctx := context.Background()
	ch := change(t, "pol-nocrd", 1, "team-a", "web", webPolicy("web", "80"))

	_, err := plugintest.Apply(ctx, ctl, ch)
	if err == nil || sdk.IsPermanent(err) || !strings.Contains(err.Error(), "CRD") || !strings.Contains(err.Error(), "not installed") {
		t.Fatalf("Apply without the CRD = %v, want a retryable error saying the CRD is not installed", err)
	}
	if items, err := plugintest.Inventory(ctx, ctl, kinds.CiliumNetworkPolicy); err != nil || len(items) != 0 {
		t.Errorf("Inventory without the CRD = %v, %v; want empty", items, err)
	}
	if r, err := plugintest.Apply(ctx, ctl, deletion("pol-other", 1)); err != nil || r != sdk.Deleted {
		t.Errorf("delete without the CRD = %s, %v", r, err)
	}

	// Installing Cilium later needs no restart of the plugin.
	if err := c.InstallCiliumCRD(ctx); err != nil {
		t.Fatal(err)
	}
	if r, err := plugintest.Apply(ctx, ctl, ch); err != nil || r != sdk.Applied {
		t.Fatalf("Apply once the CRD is installed = %s, %v", r, err)
	}
	if _, err := c.Dynamic.Resource(controller.GVR).Namespace("team-a").Get(ctx, "web", metav1.GetOptions{}); err != nil {
		t.Errorf("policy not in the cluster: %v", err)
	}
	eventually(t, "inventory lists it", func() error {
		items, err := plugintest.Inventory(ctx, ctl, kinds.CiliumNetworkPolicy)
		if err != nil || len(items) != 1 || items[0].ID != "pol-nocrd" {
			return fmt.Errorf("inventory = %v, %v", items, err)
		}
		return nil
	})
}
