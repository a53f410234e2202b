// Package demo is the scripted scenario `make demo` shows and the e2e
// suite runs: deploy an app to two regions and watch it go ready, list its
// pods per cluster, send a request through its sentinel, promote and roll
// back (the request follows), roll the sentinels to a new image in waves,
// and show the final state. Every step goes through the real CLI against
// the real stack, and every step checks its outcome.
package demo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"krane.dev/internal/sentineltest"
	"krane.dev/internal/stack"
	"krane.dev/internal/testenv"
)

// Names used by the scenario.
const (
	Workspace   = "acme"
	Project     = "shop"
	App         = "web"
	Environment = "production"
	ImageV1     = "registry.local/acme/web:1.0.0"
	ImageV2     = "registry.local/acme/web:2.0.0"
	// Host is the environment's host the demo sends requests for.
	Host = "shop.example.com"
	// SentinelImageV2 is what the sentinel fleet rolls to.
	SentinelImageV2 = "registry.local/krane/sentinel:1.1.0"
)

// Scenario runs the scripted demo against a running stack, writing what it
// does (and the CLI's own output) to out. It returns an error as soon as a
// step does not have the outcome it should.
func Scenario(ctx context.Context, st *stack.Stack, out io.Writer) error {
	say := func(format string, args ...any) { fmt.Fprintf(out, "\n### "+format+"\n", args...) }
	regions := strings.Join(regionNames(st), ",")

	say("Deploy %s to %s, and follow it until every region runs it", ImageV1, regions)
	v1, err := deploy(ctx, st, out, ImageV1)
	if err != nil {
		return err
	}

	say("The pods of %s in each cluster (kwok simulates the nodes; zones spread)", v1)
	if err := showPods(ctx, st, out, v1); err != nil {
		return err
	}

	say("A sentinel was created for the environment in every region")
	if err := showSentinels(ctx, st, out); err != nil {
		return err
	}

	say("Every region got a network policy: only the environment's sentinels reach %s", v1)
	if err := showPolicies(ctx, st, out, v1, true); err != nil {
		return err
	}

	say("Route %s to the environment and send a request through its sentinel in %s", Host, regionNames(st)[0])
	fmt.Fprintln(out, "(a real krane-sentinel process; the simulated pods' instances are real servers that answer with their pod's name)")
	if err := run(ctx, st, out, "environment", "hosts", Environment, "--host", Host); err != nil {
		return err
	}
	tr, err := startTraffic(ctx, st, v1)
	if err != nil {
		return err
	}
	defer tr.stop()
	if err := tr.request(ctx, out, v1); err != nil {
		return err
	}

	say("Deploy %s and promote it (the live deployment changes only on purpose): the sentinel routes to it", ImageV2)
	v2, err := deploy(ctx, st, out, ImageV2)
	if err != nil {
		return err
	}
	if err := tr.request(ctx, out, v1); err != nil {
		return err
	}
	if err := run(ctx, st, out, "deploy", "promote", v2); err != nil {
		return err
	}
	if err := tr.request(ctx, out, v2); err != nil {
		return err
	}
	say("Roll back: a new deployment of %s goes live, and the sentinel routes to it", ImageV1)
	if err := run(ctx, st, out, "deploy", "rollback", "--environment", Environment, "--wait"); err != nil {
		return err
	}
	live, err := liveDeployment(ctx, st)
	if err != nil {
		return err
	}
	if err := tr.request(ctx, out, live.ID); err != nil {
		return err
	}
	if live.Image != ImageV1 {
		return fmt.Errorf("after the rollback the live deployment runs %s, want %s", live.Image, ImageV1)
	}
	if err := showPods(ctx, st, out, live.ID); err != nil {
		return err
	}
	say("Stop the release that was rolled back: its workloads leave both clusters")
	if err := run(ctx, st, out, "deploy", "stop", v2); err != nil {
		return err
	}
	if err := waitNoPods(ctx, st, v2); err != nil {
		return err
	}
	if err := showPolicies(ctx, st, out, v2, false); err != nil {
		return err
	}

	say("Roll the sentinels of every region to a new image, in waves (50%%, then 100%%)")
	if err := run(ctx, st, out, "sentinel", "list"); err != nil {
		return err
	}
	if err := run(ctx, st, out, "rollout", "start", "--image", SentinelImageV2, "--waves", "50,100", "--watch"); err != nil {
		return err
	}
	if err := sentinelsOn(ctx, st, SentinelImageV2); err != nil {
		return err
	}

	say("Final state")
	if err := run(ctx, st, out, "deploy", "list", "--environment", Environment); err != nil {
		return err
	}
	return run(ctx, st, out, "sentinel", "list")
}

// sentinelsOn checks that every sentinel Deployment in every cluster runs image.
func sentinelsOn(ctx context.Context, st *stack.Stack, image string) error {
	for _, region := range regionNames(st) {
		list, err := st.Clusters[region].Client.AppsV1().Deployments("sentinel").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=sentinel"})
		if err != nil {
			return err
		}
		for _, d := range list.Items {
			if got := d.Spec.Template.Spec.Containers[0].Image; got != image {
				return fmt.Errorf("sentinel %s in %s runs %s after the rollout, want %s", d.Name, region, got, image)
			}
		}
	}
	return nil
}

func regionNames(st *stack.Stack) []string {
	var rs []string
	for r := range st.Clusters {
		rs = append(rs, r)
	}
	sort.Strings(rs)
	return rs
}

// deploy creates a deployment with the CLI, follows it to ready and
// returns its id.
func deploy(ctx context.Context, st *stack.Stack, out io.Writer, image string) (string, error) {
	args := []string{"deploy", "create", "--workspace", Workspace, "--project", Project, "--app", App, "--environment", Environment,
		"--image", image, "--replicas", "2", "--region", strings.Join(regionNames(st), ","),
		"--healthcheck-path", "/healthz", "--env", "LOG_LEVEL=info", "--wait"}
	var buf strings.Builder
	if err := runTo(ctx, st, io.MultiWriter(out, &buf), args...); err != nil {
		return "", err
	}
	// The CLI prints the new deployment's id first.
	for _, f := range strings.Fields(buf.String()) {
		if strings.HasPrefix(f, "dep_") {
			return strings.TrimRight(f, ":,."), nil
		}
	}
	return "", fmt.Errorf("no deployment id in the CLI's output:\n%s", buf.String())
}

func run(ctx context.Context, st *stack.Stack, out io.Writer, args ...string) error {
	return runTo(ctx, st, out, args...)
}

func runTo(ctx context.Context, st *stack.Stack, out io.Writer, args ...string) error {
	fmt.Fprintf(out, "$ ctrl %s\n", strings.Join(args, " "))
	cmd := st.CtrlCommand(ctx, args...)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Run(); err != nil {
		var ee *exec.ExitError
		if ok := asExit(err, &ee); ok {
			return fmt.Errorf("ctrl %s exited with %d", strings.Join(args, " "), ee.ExitCode())
		}
		return err
	}
	return nil
}

func asExit(err error, target **exec.ExitError) bool {
	ee, ok := err.(*exec.ExitError)
	if ok {
		*target = ee
	}
	return ok
}

type deployment struct {
	ID     string `json:"id"`
	Image  string `json:"image"`
	Status string `json:"status"`
	Live   bool   `json:"live"`
}

func liveDeployment(ctx context.Context, st *stack.Stack) (deployment, error) {
	out, err := st.Ctrl(ctx, "deploy", "list", "--environment", Environment, "-o", "json")
	if err != nil {
		return deployment{}, err
	}
	var list struct {
		Deployments []deployment `json:"deployments"`
	}
	if err := json.Unmarshal(out, &list); err != nil {
		return deployment{}, fmt.Errorf("deploy list -o json: %w\n%s", err, out)
	}
	for _, d := range list.Deployments {
		if d.Live {
			return d, nil
		}
	}
	return deployment{}, fmt.Errorf("no live deployment in %s:\n%s", Environment, out)
}

// showPods prints the deployment's pods per cluster and checks that each
// region runs the expected replicas.
func showPods(ctx context.Context, st *stack.Stack, out io.Writer, deploymentID string) error {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "REGION\tPOD\tNODE\tSTATUS\tIP")
	for _, region := range regionNames(st) {
		c := st.Clusters[region]
		var pods []corev1.Pod
		deadline := time.Now().Add(30 * time.Second)
		for {
			list, err := c.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{LabelSelector: "unkey.com/deployment.id=" + deploymentID})
			if err != nil {
				return err
			}
			pods = running(list.Items)
			if len(pods) >= 2 || time.Now().After(deadline) {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		if len(pods) < 2 {
			return fmt.Errorf("region %s runs %d pods of %s, want 2", region, len(pods), deploymentID)
		}
		for _, p := range pods {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", region, p.Name, p.Spec.NodeName, p.Status.Phase, p.Status.PodIP)
		}
	}
	return tw.Flush()
}

// waitNoPods waits until no cluster runs a pod of the deployment.
func waitNoPods(ctx context.Context, st *stack.Stack, deploymentID string) error {
	deadline := time.Now().Add(60 * time.Second)
	for {
		left := 0
		for _, c := range st.Clusters {
			list, err := c.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{LabelSelector: "unkey.com/deployment.id=" + deploymentID})
			if err != nil {
				return err
			}
			left += len(list.Items)
		}
		if left == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d pods of stopped deployment %s still exist after 60s", left, deploymentID)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func running(pods []corev1.Pod) []corev1.Pod {
	var out []corev1.Pod
	for _, p := range pods {
		if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
			out = append(out, p)
		}
	}
	return out
}

var cnpResource = schema.GroupVersionResource{Group: "cilium.io", Version: "v2", Resource: "ciliumnetworkpolicies"}

// showPolicies waits until every cluster has (want) or no longer has the
// deployment's ingress policy, and prints what it finds.
func showPolicies(ctx context.Context, st *stack.Stack, out io.Writer, deploymentID string, want bool) error {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	if want {
		fmt.Fprintln(tw, "REGION\tPOLICY\tSELECTS\tALLOWS FROM")
	}
	for _, region := range regionNames(st) {
		c := st.Clusters[region]
		deadline := time.Now().Add(60 * time.Second)
		for {
			list, err := c.Dynamic.Resource(cnpResource).Namespace("").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=ciliumnetworkpolicy"})
			if err != nil {
				return err
			}
			var found []string
			for _, p := range list.Items {
				sel, _, _ := unstructured.NestedString(p.Object, "spec", "endpointSelector", "matchLabels", "unkey.com/deployment.id")
				if sel == deploymentID && p.GetDeletionTimestamp() == nil {
					from, _, _ := unstructured.NestedSlice(p.Object, "spec", "ingress")
					found = append(found, fmt.Sprintf("%s\t%s/%s\t%s\t%v", region, p.GetNamespace(), p.GetName(), sel, from))
				}
			}
			if want == (len(found) > 0) {
				for _, line := range found {
					fmt.Fprintln(tw, line)
				}
				break
			}
			if time.Now().After(deadline) {
				if want {
					return fmt.Errorf("region %s has no ingress policy for %s", region, deploymentID)
				}
				return fmt.Errorf("region %s still has the ingress policy of stopped deployment %s", region, deploymentID)
			}
			time.Sleep(250 * time.Millisecond)
		}
	}
	return tw.Flush()
}

// showSentinels prints the sentinel Deployments per cluster.
func showSentinels(ctx context.Context, st *stack.Stack, out io.Writer) error {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "REGION\tSENTINEL\tIMAGE\tREADY")
	for _, region := range regionNames(st) {
		c := st.Clusters[region]
		var found int
		deadline := time.Now().Add(60 * time.Second)
		for found == 0 && time.Now().Before(deadline) {
			list, err := c.Client.AppsV1().Deployments("sentinel").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=sentinel"})
			if err != nil {
				return err
			}
			for _, d := range list.Items {
				if d.Status.ReadyReplicas == 0 {
					continue
				}
				found++
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d/%d\n", region, d.Name, d.Spec.Template.Spec.Containers[0].Image, d.Status.ReadyReplicas, *d.Spec.Replicas)
			}
			if found == 0 {
				time.Sleep(500 * time.Millisecond)
			}
		}
		if found == 0 {
			return fmt.Errorf("region %s runs no ready sentinel", region)
		}
	}
	return tw.Flush()
}

// traffic is a krane-sentinel process serving the demo environment in the
// first region, and the servers standing in for the simulated pods there.
type traffic struct {
	mirror   *sentineltest.Mirror
	sentinel *sentineltest.Sentinel
	client   *http.Client
}

func startTraffic(ctx context.Context, st *stack.Stack, live string) (*traffic, error) {
	bin := st.Bin("krane-sentinel")
	if bin == "" {
		return nil, errors.New("the stack has no krane-sentinel: start it with stack.Options.Traffic")
	}
	ip, err := testenv.HostIPv4()
	if err != nil {
		return nil, err
	}
	c := st.Clusters[regionNames(st)[0]]
	m, err := sentineltest.StartMirror(c, ip, 1, 0)
	if err != nil {
		return nil, err
	}
	ss, err := sentineltest.StartSentinels(ctx, c, bin, st.Dir(), 1, live, Host)
	if err != nil {
		m.Stop()
		for _, s := range ss {
			s.Process.Stop(10 * time.Second)
		}
		return nil, err
	}
	return &traffic{mirror: m, sentinel: ss[0], client: &http.Client{Timeout: 10 * time.Second}}, nil
}

func (t *traffic) stop() {
	t.sentinel.Process.Stop(10 * time.Second)
	t.mirror.Stop()
}

// request sends one request for Host through the sentinel, shows what
// answered, and checks that it is deployment want (waiting up to 30s for
// the sentinel to follow a promote: it does within a second).
func (t *traffic) request(ctx context.Context, out io.Writer, want string) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, a, err := t.sentinel.Get(ctx, t.client, Host)
		if err == nil && code == http.StatusOK && a.Deployment == want {
			fmt.Fprintf(out, "$ curl -H 'Host: %s' %s/\n%d {\"deployment\": %q, \"pod\": %q}\n", Host, t.sentinel.URL, code, a.Deployment, a.Pod)
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("a request for %s through the sentinel: %d %+v %v; want an answer from %s", Host, code, a, err, want)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}
