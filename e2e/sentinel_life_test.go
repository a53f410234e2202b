package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	admv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"krane.dev/internal/stack"
	"krane.dev/internal/testenv/kubeenv"
	ctrlv1 "krane.dev/proto/krane/ctrl/v1"
)

// sentinelObjects lists a sentinel's objects in a cluster by kind: the
// Deployment, the two Services, the PodDisruptionBudget and the
// CiliumNetworkPolicy, found by the sentinel-id label in every namespace.
func sentinelObjects(t *testing.T, c *kubeenv.Cluster, id string) map[string]int {
	t.Helper()
	ctx := context.Background()
	sel := metav1.ListOptions{LabelSelector: "unkey.com/sentinel.id=" + id}
	out := map[string]int{}
	d, err := c.Client.AppsV1().Deployments("").List(ctx, sel)
	if err != nil {
		t.Fatal(err)
	}
	out["Deployment"] = len(d.Items)
	s, err := c.Client.CoreV1().Services("").List(ctx, sel)
	if err != nil {
		t.Fatal(err)
	}
	out["Service"] = len(s.Items)
	p, err := c.Client.PolicyV1().PodDisruptionBudgets("").List(ctx, sel)
	if err != nil {
		t.Fatal(err)
	}
	out["PodDisruptionBudget"] = len(p.Items)
	cnp, err := c.Dynamic.Resource(schema.GroupVersionResource{Group: "cilium.io", Version: "v2", Resource: "ciliumnetworkpolicies"}).Namespace("").List(ctx, sel)
	if err != nil {
		t.Fatal(err)
	}
	out["CiliumNetworkPolicy"] = len(cnp.Items)
	return out
}

func historyText(d *ctrlv1.DeploymentInfo) []string {
	var out []string
	for _, e := range d.GetHistory() {
		out = append(out, strings.TrimPrefix(e.GetStatus().String(), "DEPLOYMENT_STATUS_")+": "+e.GetMessage())
	}
	return out
}

func envSentinels(t *testing.T, api ctrlv1.SentinelServiceClient, environment string) map[string]*ctrlv1.SentinelInfo {
	t.Helper()
	resp, err := api.ListSentinels(context.Background(), &ctrlv1.ListSentinelsRequest{EnvironmentId: environment})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*ctrlv1.SentinelInfo{}
	for _, s := range resp.GetSentinels() {
		out[s.GetRegion()] = s
	}
	return out
}

// TestDeployWaitsForItsSentinelThenStop: the first deploy of an
// environment creates a sentinel in each region and waits for both to run
// healthy before the deployment is ready (its history shows the wait);
// `ctrl sentinel stop` then removes a sentinel's five objects from its
// cluster, and a deploy of the sentinel starts it again.
func TestDeployWaitsForItsSentinelThenStop(t *testing.T) {
	st := sharedStack(t)
	const environment = "e2e-sentinel-wait"
	conn := operatorClient(t, st.CtrlAddr, st.OperatorToken)
	deploys, sentinels := ctrlv1.NewDeploymentServiceClient(conn), ctrlv1.NewSentinelServiceClient(conn)

	begin := time.Now()
	id := deployReady(t, st, "", environment, "registry.local/e2e/sentinel-wait:1", 1)
	took := time.Since(begin)
	d, err := deploys.GetDeployment(context.Background(), &ctrlv1.GetDeploymentRequest{DeploymentId: id})
	if err != nil {
		t.Fatal(err)
	}
	sens := envSentinels(t, sentinels, environment)
	if len(sens) != 2 {
		t.Fatalf("sentinels of %s: %v, want one per region", environment, sens)
	}
	hist := historyText(d)
	iNetwork := slices.IndexFunc(hist, func(h string) bool { return strings.HasPrefix(h, "NETWORK:") })
	for region, s := range sens {
		if s.GetDeployStatus() != "ready" || s.GetRunningImage() != stack.SentinelImage || s.GetDesiredState() != "running" {
			t.Fatalf("sentinel %s in %s after the deploy: %v", s.GetId(), region, s)
		}
		iWait := slices.Index(hist, "DEPLOYING: waiting for sentinel "+s.GetId()+" in region "+region)
		iReady := slices.Index(hist, "DEPLOYING: sentinel "+s.GetId()+" ready in region "+region)
		if iWait < 0 || iReady < iWait || iNetwork < iReady {
			t.Fatalf("history %q: want the wait for %s, then it ready, before network", hist, s.GetId())
		}
	}
	t.Logf("first deploy of an environment (2 new sentinels waited for) ready in %s; history:\n  %s", took.Round(100*time.Millisecond), strings.Join(hist, "\n  "))

	// Stop the sentinel of local-b: its five objects go from that cluster.
	s := sens["local-b"]
	c := st.Clusters["local-b"]
	if got := sentinelObjects(t, c, s.GetId()); got["Deployment"] != 1 || got["Service"] != 2 || got["PodDisruptionBudget"] != 1 || got["CiliumNetworkPolicy"] != 1 {
		t.Fatalf("objects of running sentinel %s: %v, want its five", s.GetId(), got)
	}
	begin = time.Now()
	code, out, errOut := ctrlRun(t, st, "", "sentinel", "stop", s.GetId())
	if code != 0 || !strings.Contains(out, "sentinel "+s.GetId()+" stopped at version") {
		t.Fatalf("sentinel stop: exit %d\n%s%s", code, out, errOut)
	}
	waitFor(t, 90*time.Second, "the stopped sentinel's objects to be deleted", func() error {
		got := sentinelObjects(t, c, s.GetId())
		for _, n := range got {
			if n != 0 {
				return fmt.Errorf("%v left", got)
			}
		}
		return nil
	})
	t.Logf("sentinel stop: its five objects deleted %s later", time.Since(begin).Round(100*time.Millisecond))
	if other := sentinelObjects(t, st.Clusters["local-a"], sens["local-a"].GetId()); other["Deployment"] != 1 {
		t.Fatalf("the other region's sentinel lost objects: %v", other)
	}

	// A deploy of the stopped sentinel starts it again.
	code, out, errOut = ctrlRun(t, st, "", "sentinel", "deploy", s.GetId(), "--wait")
	if code != 0 || !strings.Contains(out, "is ready") {
		t.Fatalf("sentinel deploy of a stopped sentinel: exit %d\n%s%s", code, out, errOut)
	}
	if got := sentinelObjects(t, c, s.GetId()); got["Deployment"] != 1 || got["Service"] != 2 {
		t.Fatalf("objects of the restarted sentinel: %v", got)
	}
}

// denySentinels makes the cluster's API server refuse the sentinel
// Deployments of environment (a ValidatingAdmissionPolicy: an Invalid
// answer, which the sentinel plugin reports as a permanent apply error),
// and waits until the policy is in force. It is removed when the test ends.
func denySentinels(t *testing.T, c *kubeenv.Cluster, environment, message string) {
	t.Helper()
	ctx := context.Background()
	name := "e2e-deny-sentinels-" + environment
	labels := map[string]string{"unkey.com/environment.id": environment, "app.kubernetes.io/component": "sentinel"}
	fail := admv1.Fail
	pol := &admv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: &fail,
			MatchConstraints: &admv1.MatchResources{
				ObjectSelector: &metav1.LabelSelector{MatchLabels: labels},
				ResourceRules: []admv1.NamedRuleWithOperations{{RuleWithOperations: admv1.RuleWithOperations{
					Operations: []admv1.OperationType{admv1.Create, admv1.Update},
					Rule:       admv1.Rule{APIGroups: []string{"apps"}, APIVersions: []string{"v1"}, Resources: []string{"deployments"}},
				}}},
			},
			Validations: []admv1.Validation{{Expression: "false", Message: message}},
		},
	}
	if _, err := c.Client.AdmissionregistrationV1().ValidatingAdmissionPolicies().Create(ctx, pol, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding := &admv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       admv1.ValidatingAdmissionPolicyBindingSpec{PolicyName: name, ValidationActions: []admv1.ValidationAction{admv1.Deny}},
	}
	if _, err := c.Client.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.Client.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Delete(ctx, name, metav1.DeleteOptions{})
		_ = c.Client.AdmissionregistrationV1().ValidatingAdmissionPolicies().Delete(ctx, name, metav1.DeleteOptions{})
	})
	sel := map[string]string{"e2e": "probe"}
	probe := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "e2e-policy-probe", Namespace: "default", Labels: labels},
		Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: sel},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: sel},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "registry.local/e2e/probe:1"}}}},
		},
	}
	waitFor(t, 60*time.Second, "the admission policy to be in force", func() error {
		_, err := c.Client.AppsV1().Deployments("default").Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if apierrors.IsInvalid(err) && strings.Contains(err.Error(), message) {
			return nil
		}
		return fmt.Errorf("a dry-run create of a matching Deployment answered %v", err)
	})
}

// TestDeployFailsWhenItsSentinelCannotRun: the first deploy of an
// environment whose sentinel one cluster refuses for good (an admission
// policy: a permanent apply error) ends failed with the sentinel's reason,
// is never ready or live, and its workloads are removed.
func TestDeployFailsWhenItsSentinelCannotRun(t *testing.T) {
	st := sharedStack(t)
	const environment = "e2e-sentinel-refused"
	const reason = "sentinels of this environment are refused by the cluster's admission policy"
	denySentinels(t, st.Clusters["local-b"], environment, reason)
	conn := operatorClient(t, st.CtrlAddr, st.OperatorToken)
	deploys, sentinels := ctrlv1.NewDeploymentServiceClient(conn), ctrlv1.NewSentinelServiceClient(conn)

	doc := ctrlJSON(t, st, "", "deploy", "create", "--workspace", "e2e", "--project", "p", "--app", "a", "--environment", environment,
		"--image", "registry.local/e2e/sentinel-refused:1", "--replicas", "1", "--region", "local-a,local-b")
	id, _ := doc["deploymentId"].(string)
	if id == "" {
		t.Fatalf("deploy create: %v", doc)
	}
	begin := time.Now()
	var d *ctrlv1.DeploymentInfo
	waitFor(t, 3*time.Minute, "the deploy to end", func() error {
		var err error
		if d, err = deploys.GetDeployment(context.Background(), &ctrlv1.GetDeploymentRequest{DeploymentId: id}); err != nil {
			return err
		}
		if d.GetLive() || d.GetStatus() == ctrlv1.DeploymentStatus_DEPLOYMENT_STATUS_READY {
			t.Fatalf("the deploy went %s (live %v) with its sentinel refused", d.GetStatus(), d.GetLive())
		}
		if d.GetStatus() != ctrlv1.DeploymentStatus_DEPLOYMENT_STATUS_FAILED {
			return fmt.Errorf("status %s", d.GetStatus())
		}
		return nil
	})
	sid := envSentinels(t, sentinels, environment)["local-b"].GetId()
	want := "sentinel " + sid + " in region local-b did not become ready: sentinel " + sid + ": "
	if !strings.HasPrefix(d.GetError(), want) || !strings.Contains(d.GetError(), reason) {
		t.Fatalf("deploy error %q, want %q ... %q", d.GetError(), want, reason)
	}
	hist := historyText(d)
	for _, h := range hist {
		if strings.HasPrefix(h, "READY:") || strings.HasPrefix(h, "NETWORK:") {
			t.Fatalf("history %q: the deploy went on past its failed sentinel", hist)
		}
	}
	t.Logf("deploy with a refused sentinel failed %s after it started: %s", time.Since(begin).Round(100*time.Millisecond), d.GetError())
	waitPods(t, st, id, "registry.local/e2e/sentinel-refused:1", 0)
	// Leave the shared stack tidy: no sentinel of this environment left
	// for the next test to find.
	for region, s := range envSentinels(t, sentinels, environment) {
		if _, err := sentinels.StopSentinel(context.Background(), &ctrlv1.StopSentinelRequest{SentinelId: s.GetId()}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 90*time.Second, "the stopped sentinel's Deployment to go", func() error {
			if n := sentinelObjects(t, st.Clusters[region], s.GetId())["Deployment"]; n != 0 {
				return fmt.Errorf("%d left in %s", n, region)
			}
			return nil
		})
	}
}
