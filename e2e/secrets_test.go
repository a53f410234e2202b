package e2e

//lint:file-ignore SA1019 legacy-workload: removed no earlier than v0.3.0 (docs/compatibility.md); this file builds or reads the deprecated top-level workload fields

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"krane.dev/ctrl/auth"
	"krane.dev/ctrl/serve"
	"krane.dev/ctrl/vault"
	"krane.dev/host/agent"
	"krane.dev/host/config"
	"krane.dev/internal/testenv"
	"krane.dev/internal/testenv/kubeenv"
	ctrlv1 "krane.dev/proto/krane/ctrl/v1"
	"krane.dev/sdk"
	"krane.dev/sdk/plugintest"
)

// syncBuffer collects a component's log output.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func randomSecret() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return "s3cr3t-" + hex.EncodeToString(b)
}

// TestSecretsEndToEnd: issue 10's acceptance through the real parts: an
// operator creates a deployment with secrets on a real ctrl (MySQL,
// Restate, a vault keyring); the real krane host runs the real deployment
// plugin binary against the simulated cluster; the plugin opens the
// secrets through the host, which asks ctrl with its token. The workload
// runs with a Secret read through envFrom holding exactly the values; the
// database holds none of them; the plugin process does not hold the token;
// and the output of ctrl, krane and the plugins, all captured at trace
// level, holds no token and no value. The environment's sentinel, deployed
// with a credential, ends with the Secret <k8s_name>-credentials holding
// it (the real sentinel plugin opens it through the same path).
func TestSecretsEndToEnd(t *testing.T) {
	ctx := context.Background()
	cluster := kubeenv.Shared(t)
	restate := testenv.SharedRestate(t)
	keyring := filepath.Join(t.TempDir(), "keyring.yaml")
	if _, err := vault.Init(keyring, time.Now()); err != nil {
		t.Fatal(err)
	}

	// ctrl, everything it says captured.
	ctrlLogs := &syncBuffer{}
	cfg, err := serve.LoadConfig(nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg.DB.DSN = testenv.SharedMySQL(t).Database(t, t.Name())
	cfg.GRPC.Addr, cfg.HTTP.Addr = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Watch.PollInterval = 20 * time.Millisecond
	cfg.Log.Level, cfg.Log.Format = "trace", "text"
	cfg.Restate.IngressURL, cfg.Restate.AdminURL, cfg.Restate.Endpoint.Listen = restate.IngressURL(), restate.AdminURL(), "127.0.0.1:0"
	cfg.Restate.IdentityKeys = restate.IdentityKey()
	cfg.Sentinel.DefaultImage = "registry.example/krane/sentinel:1.0.0"
	cfg.Vault.KeyringFile = keyring
	sctx, cancel := context.WithCancel(ctx)
	srv, err := serve.Start(sctx, cfg, serve.NewLogger(cfg.Log, ctrlLogs), serve.Deps{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); _ = srv.Wait() })
	rctx, rcancel := context.WithTimeout(ctx, 30*time.Second)
	defer rcancel()
	if err := srv.WaitRestateRegistered(rctx); err != nil {
		t.Fatal(err)
	}
	st := srv.Store()
	const region = "e2e-secrets"
	token, err := auth.RegisterCluster(ctx, st, region, region+"-1")
	if err != nil {
		t.Fatal(err)
	}
	operator, err := auth.CreateOperatorToken(ctx, st, "e2e operator")
	if err != nil {
		t.Fatal(err)
	}

	// krane, in this process, with the real deployment plugin binary. The
	// token comes from a variable, as in deploy/base/krane/deployment.yaml: the plugin
	// must not inherit it.
	t.Setenv("E2E_CLUSTER_TOKEN", token)
	plugin := testenv.Build(t, "krane.dev/plugins/deployment", "krane-plugin-deployment")
	// The sentinel plugin too: a deploy waits for the sentinel it creates.
	// Each build has a directory of its own, so it is named by path.
	sentinelPlugin := testenv.Build(t, "krane.dev/plugins/sentinel", "krane-plugin-sentinel")
	kraneLogs := &syncBuffer{}
	cfgPath := filepath.Join(t.TempDir(), "krane.hcl")
	hcl := fmt.Sprintf(`region = %q
cluster_id = "%s-1"
control_plane {
  url = "http://%s"
  token_env = "E2E_CLUSTER_TOKEN"
}
kubernetes {
  kubeconfig = %q
  # The test's admin credentials serve the plugins too.
  plugin_identities { enabled = false }
}
sync {
  reconnect_min = "50ms"
  reconnect_max = "200ms"
}
log { level = "trace" }
plugin_dir = %q
controller "deployment" {
  config { secret_cache_ttl = "2s" }
}
controller "sentinel" {
  path = %q
  config { namespace = "sentinel-e2e-secrets" }
}`, region, region, srv.GRPCAddr(), cluster.Kubeconfig, filepath.Dir(plugin), sentinelPlugin)
	if err := os.WriteFile(cfgPath, []byte(hcl), 0o600); err != nil {
		t.Fatal(err)
	}
	kcfg, err := config.Load(cfgPath, []string{})
	if err != nil {
		t.Fatal(err)
	}
	a := agent.New(kcfg, hclog.New(&hclog.LoggerOptions{Level: hclog.Trace, Output: kraneLogs}), agent.Options{})
	actx, acancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = a.Run(actx) }()
	t.Cleanup(func() { acancel(); <-done })
	waitReady(t, a)

	// The operator deploys with two secrets.
	conn, err := grpc.NewClient(srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			return invoker(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+operator), method, req, reply, cc, opts...)
		}))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	api := ctrlv1.NewDeploymentServiceClient(conn)
	secrets := map[string]string{"DB_PASSWORD": randomSecret(), "API_TOKEN": randomSecret()}
	resp, err := api.CreateDeployment(ctx, &ctrlv1.CreateDeploymentRequest{
		WorkspaceId: "e2e-sec", ProjectId: "proj", EnvironmentId: "env-sec", AppId: "app", Image: "registry.example/team/web:v1",
		Regions: []string{region}, Replicas: 2, EnvVars: map[string]string{"PLAIN": "visible"}, SecretEnv: secrets,
	})
	if err != nil {
		t.Fatal(err)
	}
	id := resp.GetDeploymentId()
	start := time.Now()
	waitFor(t, 2*time.Minute, "deployment ready", func() error {
		d, err := api.GetDeployment(ctx, &ctrlv1.GetDeploymentRequest{DeploymentId: id})
		if err != nil {
			return err
		}
		if d.GetStatus() != ctrlv1.DeploymentStatus_DEPLOYMENT_STATUS_READY {
			return fmt.Errorf("status %s (%s)", d.GetStatus(), d.GetError())
		}
		return nil
	})
	t.Logf("deployment with secrets ready %s after CreateDeployment (2 pods, the Secret opened through host and ctrl)", time.Since(start).Round(time.Millisecond))

	// The cluster: the Secret holds exactly the values; the template and
	// the pods read it with envFrom; the blob is not passed by default.
	sel := metav1.ListOptions{LabelSelector: "unkey.com/deployment.id=" + id}
	secretList, err := cluster.Client.CoreV1().Secrets("").List(ctx, sel)
	if err != nil || len(secretList.Items) != 1 {
		t.Fatalf("Secrets of %s: %v, %v", id, secretList, err)
	}
	sec := secretList.Items[0]
	got := map[string]string{}
	for k, v := range sec.Data {
		got[k] = string(v)
	}
	if !maps.Equal(got, secrets) {
		t.Fatalf("the Secret holds %v, want the deployment's secrets", slices.Sorted(maps.Keys(got)))
	}
	rsList, err := cluster.Client.AppsV1().ReplicaSets(sec.Namespace).List(ctx, sel)
	if err != nil || len(rsList.Items) != 1 {
		t.Fatalf("ReplicaSets of %s: %v", id, err)
	}
	rs := rsList.Items[0]
	if ef := rs.Spec.Template.Spec.Containers[0].EnvFrom; len(ef) != 1 || ef[0].SecretRef.Name != sec.Name {
		t.Fatalf("template envFrom %+v, want Secret %s", ef, sec.Name)
	}
	if len(sec.OwnerReferences) != 1 || sec.OwnerReferences[0].UID != rs.UID {
		t.Fatalf("Secret owners %+v, want ReplicaSet %s", sec.OwnerReferences, rs.Name)
	}
	pods, err := cluster.Client.CoreV1().Pods(sec.Namespace).List(ctx, sel)
	if err != nil || len(pods.Items) != 2 {
		t.Fatalf("pods: %v", err)
	}
	for _, p := range pods.Items {
		if ef := p.Spec.Containers[0].EnvFrom; len(ef) != 1 || ef[0].SecretRef.Name != sec.Name {
			t.Fatalf("pod %s envFrom %+v", p.Name, ef)
		}
		for _, e := range p.Spec.Containers[0].Env {
			if e.Name == "UNKEY_ENCRYPTED_ENV" || slices.Contains(slices.Collect(maps.Values(secrets)), e.Value) {
				t.Fatalf("pod %s carries %s in plain env", p.Name, e.Name)
			}
		}
	}

	// ctrl's audit shows the cluster's request.
	audit, err := st.VaultAudit(ctx, id, 100)
	if err != nil || len(audit) == 0 {
		t.Fatalf("vault audit of %s: %v, %v", id, audit, err)
	}
	for _, e := range audit {
		if e.Outcome != "allowed" || e.Region != region || e.ClusterID != region+"-1" {
			t.Fatalf("audit entry %+v, want allowed for %s", e, region)
		}
	}
	t.Logf("ctrl audited %d DecryptEnv call(s) for the deployment", len(audit))

	// The environment's sentinel, deployed with a credential: sealed by
	// ctrl, opened by the sentinel plugin through the host, it ends as the
	// Secret <k8s_name>-credentials, the last envFrom of the sentinel.
	sentinels := ctrlv1.NewSentinelServiceClient(conn)
	sl, err := sentinels.ListSentinels(ctx, &ctrlv1.ListSentinelsRequest{EnvironmentId: "env-sec", Region: region})
	if err != nil || len(sl.GetSentinels()) != 1 {
		t.Fatalf("the environment's sentinel: %v, %v", sl, err)
	}
	sen := sl.GetSentinels()[0]
	credential := randomSecret()
	start = time.Now()
	sd, err := sentinels.DeploySentinel(ctx, &ctrlv1.DeploySentinelRequest{SentinelId: sen.GetId(), Wait: true,
		Credentials: map[string]string{"DATABASE_PASSWORD": credential}})
	if err != nil || sd.GetResult() != "ready" {
		t.Fatalf("deploy sentinel %s with a credential: %v %s %s", sen.GetId(), err, sd.GetResult(), sd.GetMessage())
	}
	t.Logf("sentinel with a credential ready %s after DeploySentinel (Secret opened through host and ctrl, pods rolled)", time.Since(start).Round(time.Millisecond))
	credSecret, err := cluster.Client.CoreV1().Secrets("sentinel-e2e-secrets").Get(ctx, sen.GetK8SName()+"-credentials", metav1.GetOptions{})
	if err != nil || string(credSecret.Data["DATABASE_PASSWORD"]) != credential || len(credSecret.Data) != 1 {
		t.Fatalf("Secret %s-credentials: %v (want exactly the credential)", sen.GetK8SName(), err)
	}
	senDep, err := cluster.Client.AppsV1().Deployments("sentinel-e2e-secrets").Get(ctx, sen.GetK8SName(), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ef := senDep.Spec.Template.Spec.Containers[0].EnvFrom; len(ef) == 0 || ef[len(ef)-1].SecretRef.Name != credSecret.Name {
		t.Fatalf("sentinel envFrom %+v, want %s last", ef, credSecret.Name)
	}
	senAudit, err := st.VaultAudit(ctx, sen.GetId(), 100)
	if err != nil || len(senAudit) == 0 || senAudit[0].Outcome != "allowed" || senAudit[0].Region != region {
		t.Fatalf("vault audit of sentinel %s: %+v, %v", sen.GetId(), senAudit, err)
	}
	var senBlob []byte
	if err := st.DB().QueryRowContext(ctx, "SELECT encrypted_credentials FROM sentinels WHERE id = ?", sen.GetId()).Scan(&senBlob); err != nil {
		t.Fatal(err)
	}
	if _, err := a.HostFor("deployment").DecryptEnv(ctx, sen.GetId(), senBlob); err == nil || !strings.Contains(err.Error(), "does not reconcile kind") {
		t.Fatalf("the deployment plugin's Host opening a sentinel's credentials: %v, want PermissionDenied", err)
	}

	// Decrypt latency of the whole path a plugin sees: plugin -> broker ->
	// host -> ctrl (token check, MySQL read, audit insert) and back.
	probe := &hostProbe{}
	pc := plugintest.New(t, probe, plugintest.WithHost(a.HostFor("deployment")))
	if _, err := pc.Configure(ctx, &sdk.ConfigureRequest{Region: region, Config: []byte("{}")}); err != nil {
		t.Fatal(err)
	}
	var blob []byte
	if err := st.DB().QueryRowContext(ctx, "SELECT encrypted_env FROM deployments WHERE id = ?", id).Scan(&blob); err != nil {
		t.Fatal(err)
	}
	const n = 100
	lat := make([]time.Duration, n)
	for i := range lat {
		t0 := time.Now()
		env, err := probe.host.DecryptEnv(ctx, id, blob)
		lat[i] = time.Since(t0)
		if err != nil || !maps.Equal(env, secrets) {
			t.Fatalf("DecryptEnv through the broker: %v", err)
		}
	}
	slices.Sort(lat)
	t.Logf("DecryptEnv plugin -> broker -> host -> ctrl -> MySQL, %d calls: p50 %s, p90 %s, max %s", n, lat[n/2].Round(time.Microsecond), lat[n*9/10].Round(time.Microsecond), lat[n-1].Round(time.Microsecond))
	if _, err := a.HostFor("cilium").DecryptEnv(ctx, id, blob); err == nil || !strings.Contains(err.Error(), "does not reconcile kind") {
		t.Fatalf("a controller that does not reconcile deployments: %v, want PermissionDenied", err)
	}

	// The database holds ciphertext only: every cell of every table.
	found, cells, err := testenv.FindInDatabase(ctx, st.DB(), append(slices.Collect(maps.Values(secrets)), credential)...)
	if err != nil {
		t.Fatal(err)
	}
	if len(found) > 0 {
		t.Fatalf("secret values in the database: %v", found)
	}
	t.Logf("database: %d cells of every table searched for the secret values (plain, base64, hex): none found", cells)

	// The plugin process does not hold the token.
	pid := a.Plugin("deployment").Pid()
	environ, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil || len(environ) == 0 {
		t.Fatalf("environment of the plugin process %d: %v", pid, err)
	}
	if bytes.Contains(environ, []byte(token)) || bytes.Contains(environ, []byte("E2E_CLUSTER_TOKEN")) {
		t.Fatal("the plugin process inherited the cluster token")
	}

	// Stop: the Secret goes with the workload.
	if _, err := api.StopDeployment(ctx, &ctrlv1.StopDeploymentRequest{DeploymentId: id}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "Secret removed", func() error {
		l, err := cluster.Client.CoreV1().Secrets("").List(ctx, sel)
		if err != nil || len(l.Items) != 0 {
			return fmt.Errorf("%d Secrets left (%v)", len(l.Items), err)
		}
		return nil
	})

	// No token and no value in anything ctrl, krane or the plugin printed.
	acancel()
	<-done
	logs := map[string]string{"ctrl": ctrlLogs.String(), "krane and plugin": kraneLogs.String()}
	if !strings.Contains(logs["krane and plugin"], "Secret applied") || !strings.Contains(logs["krane and plugin"], "plugin running") {
		t.Fatal("the plugin's output did not reach the captured krane log")
	}
	needles := map[string]string{"the cluster token": token, "the operator token": operator, "the sentinel's credential": credential}
	for k, v := range secrets {
		needles["the value of "+k] = v
	}
	for component, out := range logs {
		for what, v := range needles {
			for _, form := range testenv.LeakForms(v) {
				if strings.Contains(out, form) {
					t.Errorf("%s's log contains %s", component, what)
				}
			}
		}
	}
	t.Logf("scanned %d bytes of ctrl output and %d bytes of krane and plugin output (trace level) for 2 tokens and %d values: none found",
		len(logs["ctrl"]), len(logs["krane and plugin"]), len(secrets)+1)
}

// hostProbe is a plugin that only keeps its Host.
type hostProbe struct{ host sdk.Host }

func (p *hostProbe) Describe(context.Context, *sdk.DescribeRequest) (*sdk.DescribeResponse, error) {
	return &sdk.DescribeResponse{Info: sdk.Info{Name: "probe", Version: "0.0.1", Kinds: []sdk.KindInfo{{Kind: "probe", SpecType: "google.protobuf.Struct"}}}}, nil
}
func (p *hostProbe) Configure(_ context.Context, req *sdk.ConfigureRequest) (*sdk.ConfigureResponse, error) {
	p.host = req.Host
	return &sdk.ConfigureResponse{}, nil
}
func (p *hostProbe) Apply(context.Context, *sdk.ApplyRequest) (*sdk.ApplyResponse, error) {
	return sdk.Done(sdk.Unchanged, nil)
}
func (p *hostProbe) Inventory(context.Context, *sdk.InventoryRequest) (*sdk.InventoryResponse, error) {
	return &sdk.InventoryResponse{}, nil
}
