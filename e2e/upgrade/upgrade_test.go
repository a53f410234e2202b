package upgrade

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"krane.dev/ctrl/restateendpoint"
	"krane.dev/ctrl/workflows"
	"krane.dev/internal/compat"
	"krane.dev/internal/stack"
	"krane.dev/internal/testenv"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
	ctrlv1 "krane.dev/proto/krane/ctrl/v1"
)

func TestMain(m *testing.M) { testenv.Main(m) }

var regions = []string{"local-a", "local-b"}

const (
	cmKind      = "configmap.example.krane.dev"
	cmNamespace = "team-upgrade"
	environment = "upgrade"
)

// newBinaries are this tree's binaries: make build's (KRANE_BIN_DIR), or
// built now.
func newBinaries(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	dir := os.Getenv("KRANE_BIN_DIR")
	for name, pkg := range map[string]string{
		"ctrl": "krane.dev/cmd/ctrl", "krane": "krane.dev/cmd/krane",
		"krane-plugin-deployment": "krane.dev/plugins/deployment", "krane-plugin-sentinel": "krane.dev/plugins/sentinel",
		"krane-plugin-cilium": "krane.dev/plugins/cilium",
	} {
		if dir != "" {
			out[name] = filepath.Join(dir, name)
			continue
		}
		out[name] = testenv.Build(t, pkg, name)
	}
	return out
}

// operator is the operator API of one ctrl, with the stack's token.
type operator struct {
	name        string
	deployments ctrlv1.DeploymentServiceClient
	sentinels   ctrlv1.SentinelServiceClient
	conn        *grpc.ClientConn
}

func dialOperator(t *testing.T, name, addr, token string) *operator {
	t.Helper()
	auth := func(ctx context.Context) context.Context {
		return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			return invoker(auth(ctx), method, req, reply, cc, opts...)
		}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &operator{name: name, conn: conn, deployments: ctrlv1.NewDeploymentServiceClient(conn), sentinels: ctrlv1.NewSentinelServiceClient(conn)}
}

// retryable are the codes on which an operator (or its CLI, withRetry)
// tries the call again, on another replica when this one is going away.
func retryable(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.ResourceExhausted, codes.Aborted, codes.DeadlineExceeded:
		return true
	}
	return false
}

// call runs f against the replicas in turn, starting with the first,
// retrying what a retry may answer, as a client behind the ctrl Service
// does; it fails only on an answer no retry would change, or when no
// replica answered for a minute.
func call[T any](ctx context.Context, replicas []*operator, f func(context.Context, *operator) (T, error)) (T, error) {
	var zero T
	deadline := time.Now().Add(time.Minute)
	var err error
	for i := 0; time.Now().Before(deadline); i++ {
		cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		var v T
		v, err = f(cctx, replicas[i%len(replicas)])
		cancel()
		if err == nil {
			return v, nil
		}
		if !retryable(err) {
			return zero, fmt.Errorf("%s: %w", replicas[i%len(replicas)].name, err)
		}
		time.Sleep(time.Duration(100+rand.IntN(200)) * time.Millisecond)
	}
	return zero, fmt.Errorf("no replica answered in a minute: %w", err)
}

func createDeployment(ctx context.Context, replicas []*operator, image string, n int32) (string, error) {
	key := fmt.Sprintf("upgrade-%d", rand.Int64())
	resp, err := call(ctx, replicas, func(ctx context.Context, o *operator) (*ctrlv1.CreateDeploymentResponse, error) {
		return o.deployments.CreateDeployment(ctx, &ctrlv1.CreateDeploymentRequest{
			WorkspaceId: "upgrade", ProjectId: "p", AppId: "a", EnvironmentId: environment,
			Workload: &clusterv1.Workload{Image: image}, Regions: regions, Replicas: n, IdempotencyKey: key,
		})
	})
	return resp.GetDeploymentId(), err
}

func waitDeployment(t *testing.T, o *operator, id string, want ctrlv1.DeploymentStatus, within time.Duration) *ctrlv1.DeploymentInfo {
	t.Helper()
	var last *ctrlv1.DeploymentInfo
	waitFor(t, within, fmt.Sprintf("deployment %s %s", id, want), func() error {
		d, err := o.deployments.GetDeployment(context.Background(), &ctrlv1.GetDeploymentRequest{DeploymentId: id})
		if err != nil {
			return err
		}
		last = d
		if d.GetStatus() == ctrlv1.DeploymentStatus_DEPLOYMENT_STATUS_FAILED && want != d.GetStatus() {
			t.Fatalf("deployment %s failed: %s", id, d.GetError())
		}
		if d.GetStatus() != want {
			return fmt.Errorf("status %s", d.GetStatus())
		}
		return nil
	})
	return last
}

func waitFor(t *testing.T, within time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(within)
	var err error
	for time.Now().Before(deadline) {
		if err = cond(); err == nil {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("timed out after %s waiting for %s: %v", within, what, err)
}

// pods counts a deployment's running pods of image in a region's cluster,
// and all of its pods.
func pods(t *testing.T, st *stack.Stack, region, id, image string) (running, all int) {
	t.Helper()
	list, err := st.Clusters[region].Client.CoreV1().Pods("").List(context.Background(), metav1.ListOptions{LabelSelector: "unkey.com/deployment.id=" + id})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range list.Items {
		if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil && p.Spec.Containers[0].Image == image {
			running++
		}
	}
	return running, len(list.Items)
}

// cli runs a ctrl binary with the stack's settings, aimed at addr.
func cli(t *testing.T, st *stack.Stack, bin, addr string, extraEnv []string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := st.CtrlCommand(ctx, args...)
	cmd.Path, cmd.Args[0] = bin, bin
	cmd.Env = append(cmd.Env, append([]string{"CTRL_ADDR=" + addr}, extraEnv...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s%s", filepath.Base(filepath.Dir(bin))+"/ctrl", strings.Join(args, " "), err, out, stderr.String())
	}
	return string(out)
}

// applyConfigMap publishes one resource of the example plugin's kind in
// both regions and waits until they run it.
func applyConfigMap(t *testing.T, st *stack.Stack, bin, addr, id, value string) {
	t.Helper()
	f := filepath.Join(t.TempDir(), id+".yaml")
	doc := fmt.Sprintf("kind: %s\nid: %s\nregions: [local-a, local-b]\nspec: {namespace: %s, name: %s, data: {v: %q}}\n", cmKind, id, cmNamespace, id, value)
	if err := os.WriteFile(f, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	cli(t, st, bin, addr, nil, "resource", "apply", "-f", f, "--wait", "--timeout", "3m")
}

// configMapValue is the value the example plugin wrote for id in region.
func configMapValue(t *testing.T, st *stack.Stack, region, id string) string {
	t.Helper()
	cm, err := st.Clusters[region].Client.CoreV1().ConfigMaps(cmNamespace).Get(context.Background(), id, metav1.GetOptions{})
	if err != nil {
		return "(" + err.Error() + ")"
	}
	return cm.Data["v"]
}

// scrape reads a ctrl's /metrics and sums the series whose name is metric
// and whose line holds every filter.
func scrape(t *testing.T, httpBase, metric string, filters ...string) float64 {
	t.Helper()
	resp, err := http.Get(httpBase + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	total := 0.0
	for _, line := range strings.Split(string(body), "\n") {
		if !strings.HasPrefix(line, metric+"{") && !strings.HasPrefix(line, metric+" ") {
			continue
		}
		ok := true
		for _, f := range filters {
			ok = ok && strings.Contains(line, f)
		}
		if ok {
			var v float64
			fmt.Sscanf(line[strings.LastIndex(line, " ")+1:], "%g", &v)
			total += v
		}
	}
	return total
}

// restateQuery runs a SQL query on Restate's introspection.
func restateQuery(t *testing.T, st *stack.Stack, q string) []map[string]any {
	t.Helper()
	body, _ := json.Marshal(map[string]string{"query": q})
	req, _ := http.NewRequest(http.MethodPost, st.Restate.AdminURL()+"/query", bytes.NewReader(body))
	req.Header.Set("content-type", "application/json")
	req.Header.Set("accept", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Rows []map[string]any `json:"rows"`
	}
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || json.Unmarshal(data, &out) != nil {
		t.Fatalf("Restate query %q: %s %s", q, resp.Status, data)
	}
	return out.Rows
}

// TestRollingUpgradeFromTheBaseline runs the baseline release (ctrl, krane
// and its plugins, the example plugin built with the baseline sdk,
// installed with the baseline's krane.hcl and manifests) and rolls ctrl to
// this tree's while deploys and scale writes are in flight:
//
//   - the new ctrl migrates under the old one, which keeps serving;
//   - a deploy the old ctrl started, waiting for a cluster, finishes after
//     the new ctrl took new invocations over, on the old ctrl's code (its
//     invocation stays pinned to the baseline's Restate deployment);
//   - clusters are connected to both ctrls during the roll, and every
//     operator call succeeds, retried where a retry answers it;
//   - `ctrl restate drain` removes the baseline's deployment once drained,
//     and the old ctrl stops;
//   - then every cluster runs what the database says (no lost change);
//     the baseline's hosts and plugins go on working against the new ctrl
//     (deploys, sentinels, the plugin author's kind, reports and
//     heartbeats, none refused);
//   - and a plugin built with the baseline sdk runs on the new host.
func TestRollingUpgradeFromTheBaseline(t *testing.T) {
	ctx := context.Background()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	baseBin, base, err := compat.BaselineBinaries(ctx, root)
	if err != nil {
		t.Fatal(err)
	}
	baseSrc, _, err := compat.Source(ctx, root)
	if err != nil {
		t.Fatal(err)
	}
	cur := newBinaries(t)
	t.Logf("baseline %s (%s) against this tree (%s)", base.Version, base.Commit[:12], testenv.BuildVersion())

	env := []string{"KRANE_SYNC__RESYNC_INTERVAL=5s", "KRANE_SYNC__RECONNECT_MIN=100ms", "KRANE_SYNC__RECONNECT_MAX=1s"}
	st, err := stack.Start(ctx, stack.Options{
		Regions: regions, BinDir: baseBin, RepoDir: baseSrc, ProxyCtrl: true,
		KraneEnv: map[string][]string{"local-a": env, "local-b": env},
		Progress: testWriter{t},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Stop)

	// The plugin author's kind, as the baseline's example plugin ships it.
	baseCM := filepath.Join(baseBin, "krane-plugin-configmap")
	if err := st.UseBinary("krane-plugin-configmap", baseCM); err != nil {
		t.Fatal(err)
	}
	rbac, err := os.ReadFile(filepath.Join(baseSrc, "sdk", "examples", "configmap", "rbac.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range regions {
		if err := st.Clusters[r].ApplyYAML(ctx, rbac); err != nil {
			t.Fatal(err)
		}
		if err := st.Clusters[r].EnsureNamespace(ctx, cmNamespace); err != nil {
			t.Fatal(err)
		}
		if err := st.EditKraneConfig(r, func(s string) string {
			return s + "\ncontroller \"configmap\" {\n  config { allowed_namespaces = [\"" + cmNamespace + "\"] }\n}\n"
		}); err != nil {
			t.Fatal(err)
		}
	}
	describe := filepath.Join(t.TempDir(), "describe.json")
	out, err := exec.Command(baseCM, "--describe").Output()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(describe, out, 0o644); err != nil {
		t.Fatal(err)
	}
	cli(t, st, st.Bin("ctrl"), st.CtrlAddr, nil, "kind", "register", "--describe", describe)
	applyConfigMap(t, st, st.Bin("ctrl"), st.CtrlAddr, "before-roll", "1")

	old := dialOperator(t, "ctrl "+base.Version, st.CtrlAddr, st.OperatorToken)
	d1, err := createDeployment(ctx, []*operator{old}, "registry.local/upgrade/app:1", 1)
	if err != nil {
		t.Fatal(err)
	}
	waitDeployment(t, old, d1, ctrlv1.DeploymentStatus_DEPLOYMENT_STATUS_READY, 3*time.Minute)

	// A deploy in flight across the roll: local-b is cut off from ctrl
	// (still live, its heartbeat recent), so the deploy the old ctrl
	// starts waits for it.
	st.Proxy("local-b").Cut()
	d2, err := createDeployment(ctx, []*operator{old}, "registry.local/upgrade/app:2", 1)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 2*time.Minute, "deployment "+d2+" running in local-a", func() error {
		if n, _ := pods(t, st, "local-a", d2, "registry.local/upgrade/app:2"); n != 1 {
			return fmt.Errorf("%d pods", n)
		}
		return nil
	})
	if d, err := old.deployments.GetDeployment(ctx, &ctrlv1.GetDeploymentRequest{DeploymentId: d2}); err != nil || d.GetStatus() == ctrlv1.DeploymentStatus_DEPLOYMENT_STATUS_READY || d.GetStatus() == ctrlv1.DeploymentStatus_DEPLOYMENT_STATUS_FAILED {
		t.Fatalf("deployment %s, waiting for local-b: %v %v; want it in flight", d2, d.GetStatus(), err)
	}

	// Operator writes in flight through the whole roll, on whichever
	// replica answers.
	var (
		writers  sync.WaitGroup
		mu       sync.Mutex
		replicas = []*operator{old}
		failures []string
		writes   int
		lastN    int32
	)
	stopWriting := make(chan struct{})
	writers.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stopWriting:
				return
			default:
			}
			mu.Lock()
			rs := append([]*operator(nil), replicas...)
			mu.Unlock()
			rs = append(rs[i%len(rs):], rs[:i%len(rs)]...)
			n := int32(1 + i%3)
			_, err := call(ctx, rs, func(ctx context.Context, o *operator) (*ctrlv1.ScaleDeploymentResponse, error) {
				return o.deployments.ScaleDeployment(ctx, &ctrlv1.ScaleDeploymentRequest{DeploymentId: d1, Replicas: n})
			})
			mu.Lock()
			writes++
			if err != nil {
				failures = append(failures, fmt.Sprintf("scale %s to %d: %v", d1, n, err))
			} else {
				lastN = n
			}
			mu.Unlock()
			time.Sleep(150 * time.Millisecond)
		}
	})

	// The roll: a replica of the new release starts beside the old one,
	// migrates and registers its own Restate deployment.
	next, err := st.StartCtrlReplicaWith("ctrl-new", stack.CtrlReplicaOptions{Bin: cur["ctrl"], Register: true})
	if err != nil {
		t.Fatal(err)
	}
	restateEnv := []string{"CTRL_RESTATE_ENDPOINT_URL=" + strings.TrimSuffix(restateURL(t, st, next), restateendpoint.Base(testenv.BuildVersion()))}
	fresh := dialOperator(t, "ctrl (this tree)", next.Addr, st.OperatorToken)
	mu.Lock()
	replicas = []*operator{old, fresh}
	mu.Unlock()
	waitFor(t, time.Minute, "the new ctrl's Restate deployment taking new invocations", func() error {
		deps, err := restateendpoint.Deployments(ctx, st.Restate.AdminURL(), workflows.Services(workflows.Deps{}), nil)
		if err != nil {
			return err
		}
		for _, d := range deps {
			if d.Line == restateendpoint.Base(testenv.BuildVersion())[1:] && len(d.Latest) > 0 {
				return nil
			}
		}
		return fmt.Errorf("deployments %+v", deps)
	})
	// A deploy started during the roll, on the new ctrl.
	d3, err := createDeployment(ctx, []*operator{fresh}, "registry.local/upgrade/app:3", 1)
	if err != nil {
		t.Fatal(err)
	}

	// local-b comes back, to the new ctrl; local-a stays on the old one.
	st.Proxy("local-b").Retarget(next.Addr)
	st.Proxy("local-b").Restore()
	waitDeployment(t, fresh, d2, ctrlv1.DeploymentStatus_DEPLOYMENT_STATUS_READY, 3*time.Minute)
	waitDeployment(t, fresh, d3, ctrlv1.DeploymentStatus_DEPLOYMENT_STATUS_READY, 3*time.Minute)

	// The deploy the old ctrl started ran to its end on the old ctrl's
	// code: its invocation is pinned to the baseline's deployment.
	deps, err := restateendpoint.Deployments(ctx, st.Restate.AdminURL(), workflows.Services(workflows.Deps{}), nil)
	if err != nil {
		t.Fatal(err)
	}
	baselineDeployment := ""
	for _, d := range deps {
		if d.Line == "" {
			baselineDeployment = d.ID
		}
	}
	// (Its Notify calls, made after the roll, are new invocations and ran
	// on the new line: a cross-release call the policy keeps compatible.)
	rows := restateQuery(t, st, "SELECT target, status, COALESCE(pinned_deployment_id, last_attempt_deployment_id) AS deployment FROM sys_invocation WHERE target = 'DeployWorkflow/"+d2+"/Run'")
	if len(rows) != 1 || baselineDeployment == "" {
		t.Fatalf("the deploy workflow of %s in Restate: %v (baseline deployment %q)", d2, rows, baselineDeployment)
	}
	if rows[0]["deployment"] != baselineDeployment || rows[0]["status"] != "completed" {
		t.Errorf("the deploy workflow the old ctrl started: %v; want it completed on the baseline's deployment %s", rows[0], baselineDeployment)
	}

	// Every host moves to the new ctrl; the baseline's deployment drains;
	// the old ctrl stops.
	st.Proxy("local-a").Retarget(next.Addr)
	st.Proxy("local-a").Cut()
	st.Proxy("local-a").Restore()
	drained := cli(t, st, cur["ctrl"], next.Addr, restateEnv, "restate", "drain", "--wait", "3m")
	if !strings.Contains(drained, "removed drained deployment "+baselineDeployment) {
		t.Errorf("ctrl restate drain:\n%s\nwant the baseline's deployment %s removed", drained, baselineDeployment)
	}
	mu.Lock()
	replicas = []*operator{fresh, old} // the Service still lists the old one a moment
	mu.Unlock()
	st.StopCtrl()
	mu.Lock()
	stoppedAt := writes
	mu.Unlock()
	// Some writes meet the stopped replica first and are retried on the
	// other, as behind the ctrl Service.
	waitFor(t, time.Minute, "writes after the old ctrl stopped", func() error {
		mu.Lock()
		defer mu.Unlock()
		if writes < stoppedAt+4 {
			return fmt.Errorf("%d writes since", writes-stoppedAt)
		}
		return nil
	})
	close(stopWriting)
	writers.Wait()
	if writes < 10 {
		t.Errorf("only %d scale writes ran during the roll", writes)
	}
	for _, f := range failures {
		t.Errorf("an operator call failed across the roll: %s", f)
	}
	t.Logf("%d scale writes across the roll, %d failed", writes, len(failures))

	// No lost change: every cluster runs what the database says.
	only := []*operator{fresh}
	want := map[string]string{d1: "registry.local/upgrade/app:1", d2: "registry.local/upgrade/app:2", d3: "registry.local/upgrade/app:3"}
	for id, image := range want {
		info, err := call(ctx, only, func(ctx context.Context, o *operator) (*ctrlv1.DeploymentInfo, error) {
			return o.deployments.GetDeployment(ctx, &ctrlv1.GetDeploymentRequest{DeploymentId: id})
		})
		if err != nil {
			t.Fatal(err)
		}
		if id == d1 && info.GetReplicas() != lastN {
			t.Errorf("deployment %s: the database says %d replicas, the last scale that succeeded said %d", id, info.GetReplicas(), lastN)
		}
		for _, r := range regions {
			waitFor(t, 2*time.Minute, fmt.Sprintf("%s running %d pods of %s in %s", id, info.GetReplicas(), image, r), func() error {
				if running, all := pods(t, st, r, id, image); running != int(info.GetReplicas()) || all != running {
					return fmt.Errorf("%d running of %d pods", running, all)
				}
				return nil
			})
		}
	}

	// The baseline's hosts and plugins against the new ctrl: a deploy in a
	// new environment (its sentinels too), the plugin author's kind.
	d4, err := call(ctx, only, func(ctx context.Context, o *operator) (*ctrlv1.CreateDeploymentResponse, error) {
		return o.deployments.CreateDeployment(ctx, &ctrlv1.CreateDeploymentRequest{
			WorkspaceId: "upgrade", ProjectId: "p", AppId: "b", EnvironmentId: "upgrade-after",
			Workload: &clusterv1.Workload{Image: "registry.local/upgrade/other:1"}, Regions: regions, Replicas: 2, IdempotencyKey: "upgrade-d4",
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	waitDeployment(t, fresh, d4.GetDeploymentId(), ctrlv1.DeploymentStatus_DEPLOYMENT_STATUS_READY, 3*time.Minute)
	sentinels, err := fresh.sentinels.ListSentinels(ctx, &ctrlv1.ListSentinelsRequest{EnvironmentId: "upgrade-after"})
	if err != nil {
		t.Fatal(err)
	}
	if len(sentinels.GetSentinels()) != len(regions) {
		t.Errorf("the new environment's sentinels: %v; want one per region", sentinels.GetSentinels())
	}
	for _, s := range sentinels.GetSentinels() {
		if s.GetReadyReplicas() < 1 {
			t.Errorf("sentinel %s in %s: %d ready replicas", s.GetId(), s.GetRegion(), s.GetReadyReplicas())
		}
	}
	applyConfigMap(t, st, cur["ctrl"], next.Addr, "after-roll", "2")
	for _, r := range regions {
		if v := configMapValue(t, st, r, "before-roll"); v != "1" {
			t.Errorf("%s: the ConfigMap published before the roll holds %q", r, v)
		}
	}

	var fleet ctrlv1.ListClustersResponse
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal([]byte(cli(t, st, cur["ctrl"], next.Addr, nil, "fleet", "list", "-o", "json")), &fleet); err != nil {
		t.Fatal(err)
	}
	for _, c := range fleet.GetClusters() {
		if c.GetAgentVersion() != base.Version || c.GetAgentSkew() != "in-window" || !c.GetLive() {
			t.Errorf("cluster %s as the new ctrl sees it: krane %q (%s), live %v; want %s in the window, live", c.GetId(), c.GetAgentVersion(), c.GetAgentSkew(), c.GetLive(), base.Version)
		}
	}
	if v := scrape(t, next.HTTP, "krane_ctrl_cluster_agent_info", `version="`+base.Version+`"`, `skew="in-window"`); v != float64(len(regions)) {
		t.Errorf("krane_ctrl_cluster_agent_info names %v clusters running %s in the window; want %d", v, base.Version, len(regions))
	}
	for _, m := range []struct{ metric, filter string }{
		{"krane_ctrl_requests_out_of_bounds_total", "ClusterService"},
		{"krane_ctrl_ingest_refused_total", ""},
		{"krane_ctrl_agent_skew_refused_total", ""},
	} {
		if v := scrape(t, next.HTTP, m.metric, m.filter); v != 0 {
			t.Errorf("the new ctrl refused %v calls of the baseline's hosts (%s)", v, m.metric)
		}
	}

	// The host upgrades (krane and its built-in plugins from this tree);
	// the plugin author's plugin stays the one built with the baseline sdk.
	// As the upgrade procedure says, this release's manifests first.
	for _, r := range regions {
		if err := st.ApplyKraneManifests(ctx, r, ""); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"krane", "krane-plugin-deployment", "krane-plugin-sentinel", "krane-plugin-cilium"} {
		if err := st.UseBinary(name, cur[name]); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.RestartKrane(ctx, "local-b", false); err != nil {
		t.Fatal(err)
	}
	applyConfigMap(t, st, cur["ctrl"], next.Addr, "after-host-upgrade", "3")
	for _, r := range regions {
		if v := configMapValue(t, st, r, "after-host-upgrade"); v != "3" {
			t.Errorf("%s: the ConfigMap published after local-b's host upgrade holds %q", r, v)
		}
	}
	if _, err := call(ctx, only, func(ctx context.Context, o *operator) (*ctrlv1.ScaleDeploymentResponse, error) {
		return o.deployments.ScaleDeployment(ctx, &ctrlv1.ScaleDeploymentRequest{DeploymentId: d1, Replicas: 2})
	}); err != nil {
		t.Fatal(err)
	}
	for _, r := range regions {
		waitFor(t, 2*time.Minute, "the last scale in "+r, func() error {
			if running, all := pods(t, st, r, d1, want[d1]); running != 2 || all != 2 {
				return fmt.Errorf("%d running of %d pods", running, all)
			}
			return nil
		})
	}
}

// restateURL is the URL the new ctrl registered with Restate.
func restateURL(t *testing.T, st *stack.Stack, r *stack.CtrlReplica) string {
	t.Helper()
	var url string
	waitFor(t, time.Minute, "the new ctrl's registration", func() error {
		deps, err := restateendpoint.Deployments(context.Background(), st.Restate.AdminURL(), workflows.Services(workflows.Deps{}), nil)
		if err != nil {
			return err
		}
		for _, d := range deps {
			if d.Line != "" {
				url = d.URI
				return nil
			}
		}
		return fmt.Errorf("deployments %+v", deps)
	})
	return url
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
