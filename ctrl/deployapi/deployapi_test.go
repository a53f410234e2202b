package deployapi_test

//lint:file-ignore SA1019 legacy-workload: removed no earlier than v0.3.0 (docs/compatibility.md); this file builds or reads the deprecated top-level workload fields

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"krane.dev/ctrl/internal/ctrltest"
	"krane.dev/ctrl/restateingress"
	"krane.dev/internal/testenv"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
	ctrlv1 "krane.dev/proto/krane/ctrl/v1"
)

func TestMain(m *testing.M) { testenv.Main(m) }

const (
	network = ctrlv1.DeploymentStatus_DEPLOYMENT_STATUS_NETWORK
	ready   = ctrlv1.DeploymentStatus_DEPLOYMENT_STATUS_READY
	failed  = ctrlv1.DeploymentStatus_DEPLOYMENT_STATUS_FAILED
	stopped = ctrlv1.DeploymentStatus_DEPLOYMENT_STATUS_STOPPED
)

func req(env, image string) *ctrlv1.CreateDeploymentRequest {
	return &ctrlv1.CreateDeploymentRequest{WorkspaceId: "ws1", ProjectId: "proj1", AppId: "app1", EnvironmentId: env, Image: image, Replicas: 1}
}

// deploy creates a deployment and makes it ready by reporting from eu.
func deploy(t *testing.T, api ctrlv1.DeploymentServiceClient, eu *ctrltest.FakeCluster, r *ctrlv1.CreateDeploymentRequest) *ctrlv1.DeploymentInfo {
	t.Helper()
	resp, err := api.CreateDeployment(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	return reportReady(t, api, eu, resp.GetDeploymentId())
}

func reportReady(t *testing.T, api ctrlv1.DeploymentServiceClient, eu *ctrltest.FakeCluster, id string) *ctrlv1.DeploymentInfo {
	t.Helper()
	ctrltest.WaitStatus(t, api, id, 30*time.Second, network)
	eu.ReportRunning(t, id, 1)
	d, _ := ctrltest.WaitStatus(t, api, id, 30*time.Second, ready, failed)
	if d.GetStatus() != ready {
		t.Fatalf("deployment %s: %s (%s), want ready", id, d.GetStatus(), d.GetError())
	}
	return d
}

func code(err error) codes.Code { return status.Code(err) }

func TestRollbackPromoteStopAndIdempotency(t *testing.T) {
	env := ctrltest.Start(t, ctrltest.Options{Restate: testenv.SharedRestate(t)})
	api := env.Deployments(t)
	eu := env.FakeCluster(t, "eu", "eu-1")
	ctx := context.Background()

	// Idempotency: the same key returns the same deployment, even when the
	// retry differs.
	r1 := req("env-r", "registry.test/app:1")
	r1.IdempotencyKey = "release-1"
	a, err := api.CreateDeployment(ctx, r1)
	if err != nil {
		t.Fatal(err)
	}
	r1b := req("env-r", "registry.test/app:other")
	r1b.IdempotencyKey = "release-1"
	b, err := api.CreateDeployment(ctx, r1b)
	if err != nil || b.GetDeploymentId() != a.GetDeploymentId() {
		t.Fatalf("repeated idempotency key: %v, %v; want %s", b, err, a.GetDeploymentId())
	}
	v1 := reportReady(t, api, eu, a.GetDeploymentId())
	if !v1.GetLive() || v1.GetImage() != "registry.test/app:1" {
		t.Fatalf("first deployment: live %v image %s", v1.GetLive(), v1.GetImage())
	}

	// A second deploy is ready but not live until promoted.
	v2 := deploy(t, api, eu, req("env-r", "registry.test/app:2"))
	if v2.GetLive() {
		t.Fatal("a second deploy replaced the live one by itself")
	}
	if _, err := api.Promote(ctx, &ctrlv1.PromoteRequest{DeploymentId: v2.GetId()}); err != nil {
		t.Fatal(err)
	}
	if d, _ := api.GetDeployment(ctx, &ctrlv1.GetDeploymentRequest{DeploymentId: v2.GetId()}); !d.GetLive() {
		t.Fatal("promoted deployment is not live")
	}

	// Rollback with no target: the last ready deployment before the live
	// one, as a new deployment, live once ready.
	rb, err := api.Rollback(ctx, &ctrlv1.RollbackRequest{EnvironmentId: "env-r", IdempotencyKey: "rollback-1"})
	if err != nil {
		t.Fatal(err)
	}
	if again, err := api.Rollback(ctx, &ctrlv1.RollbackRequest{EnvironmentId: "env-r", IdempotencyKey: "rollback-1"}); err != nil || again.GetDeploymentId() != rb.GetDeploymentId() {
		t.Fatalf("repeated rollback: %v, %v", again, err)
	}
	v3 := reportReady(t, api, eu, rb.GetDeploymentId())
	if v3.GetId() == v1.GetId() || v3.GetImage() != "registry.test/app:1" || v3.GetRolledBackFrom() != v2.GetId() || !v3.GetLive() {
		t.Fatalf("rollback deployment %s: image %s rolled_back_from %q live %v; want a new deployment of app:1 from %s, live",
			v3.GetId(), v3.GetImage(), v3.GetRolledBackFrom(), v3.GetLive(), v2.GetId())
	}
	events, err := env.Store.DeploymentEvents(ctx, v3.GetId())
	if err != nil || !strings.Contains(events[0].Message, "rollback of "+v2.GetId()+" to the configuration of "+v1.GetId()) {
		t.Fatalf("first history entry of the rollback: %+v, %v", events, err)
	}
	if _, err := api.Rollback(ctx, &ctrlv1.RollbackRequest{EnvironmentId: "env-r", TargetDeploymentId: v3.GetId()}); code(err) != codes.FailedPrecondition {
		t.Fatalf("rollback to the live deployment: %v, want FailedPrecondition", err)
	}

	// Stop: removed from every region at a new version, no longer live.
	v, _ := eu.Version(t, v3.GetId())
	if _, err := api.StopDeployment(ctx, &ctrlv1.StopDeploymentRequest{DeploymentId: v3.GetId()}); err != nil {
		t.Fatal(err)
	}
	d, _ := api.GetDeployment(ctx, &ctrlv1.GetDeploymentRequest{DeploymentId: v3.GetId()})
	if d.GetStatus() != stopped || d.GetLive() || d.GetRegions()[0].GetDesiredStatus() != "stopped" {
		t.Fatalf("after stop: %s live %v regions %v", d.GetStatus(), d.GetLive(), d.GetRegions())
	}
	if nv, deleted := eu.Version(t, v3.GetId()); !deleted || nv <= v {
		t.Fatalf("cluster sees version %d deleted=%v, want a delete above %d", nv, deleted, v)
	}
	if _, err := api.StopDeployment(ctx, &ctrlv1.StopDeploymentRequest{DeploymentId: v3.GetId()}); err != nil {
		t.Fatalf("stopping twice: %v", err)
	}
	if _, err := api.Promote(ctx, &ctrlv1.PromoteRequest{DeploymentId: v3.GetId()}); code(err) != codes.FailedPrecondition {
		t.Fatalf("promote a stopped deployment: %v, want FailedPrecondition", err)
	}
	if _, err := api.Rollback(ctx, &ctrlv1.RollbackRequest{EnvironmentId: "env-r"}); code(err) != codes.FailedPrecondition ||
		!strings.Contains(err.Error(), "no live deployment") {
		t.Fatalf("rollback without a live deployment or target: %v", err)
	}
	// With a target it works, and becomes live (nothing else is).
	rb2, err := api.Rollback(ctx, &ctrlv1.RollbackRequest{EnvironmentId: "env-r", TargetDeploymentId: v2.GetId()})
	if err != nil {
		t.Fatal(err)
	}
	if v4 := reportReady(t, api, eu, rb2.GetDeploymentId()); v4.GetImage() != "registry.test/app:2" || !v4.GetLive() {
		t.Fatalf("rollback to %s: image %s live %v", v2.GetId(), v4.GetImage(), v4.GetLive())
	}

	// List, newest first, in pages.
	var ids []string
	token := ""
	for range 10 {
		page, err := api.ListDeployments(ctx, &ctrlv1.ListDeploymentsRequest{EnvironmentId: "env-r", PageSize: 2, PageToken: token})
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range page.GetDeployments() {
			ids = append(ids, d.GetId())
		}
		if token = page.GetNextPageToken(); token == "" {
			break
		}
	}
	want := []string{rb2.GetDeploymentId(), v3.GetId(), v2.GetId(), v1.GetId()}
	if strings.Join(ids, ",") != strings.Join(want, ",") {
		t.Fatalf("listed %v, want %v", ids, want)
	}
}

func TestStopDuringDeployEndsTheWorkflowAtOnce(t *testing.T) {
	r := testenv.SharedRestate(t)
	env := ctrltest.Start(t, ctrltest.Options{Restate: r})
	api := env.Deployments(t)
	eu := env.FakeCluster(t, "eu", "eu-1")
	ctx := context.Background()
	rq := req("env-s", "registry.test/app:1")
	rq.TimeoutSeconds = 600
	resp, err := api.CreateDeployment(ctx, rq)
	if err != nil {
		t.Fatal(err)
	}
	id := resp.GetDeploymentId()
	ctrltest.WaitStatus(t, api, id, 30*time.Second, network)
	if _, err := api.StopDeployment(ctx, &ctrlv1.StopDeploymentRequest{DeploymentId: id}); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	res, err := restateingress.DeployOutcome(wctx, env.Ingress(t, false), id)
	if err != nil || res.Status != "stopped" {
		t.Fatalf("workflow result %+v, %v; want stopped well before its 600 s timeout", res, err)
	}
	// A late report changes nothing.
	eu.Report(t, id, ctrltest.Running("late-0"))
	d, _ := api.GetDeployment(ctx, &ctrlv1.GetDeploymentRequest{DeploymentId: id})
	if d.GetStatus() != stopped {
		t.Fatalf("status %s after a late report, want stopped", d.GetStatus())
	}
}

func TestCreateRefusesBadInputNamingTheField(t *testing.T) {
	env := ctrltest.Start(t, ctrltest.Options{Restate: testenv.SharedRestate(t)})
	api := env.Deployments(t)
	env.FakeCluster(t, "eu", "eu-1")
	ctx := context.Background()
	for _, c := range []struct {
		name   string
		mutate func(*ctrlv1.CreateDeploymentRequest)
		code   codes.Code
		field  string
	}{
		{"no environment", func(r *ctrlv1.CreateDeploymentRequest) { r.EnvironmentId = "" }, codes.InvalidArgument, "environment_id"},
		{"bad image", func(r *ctrlv1.CreateDeploymentRequest) { r.Image = "not an image" }, codes.InvalidArgument, "image"},
		{"negative replicas", func(r *ctrlv1.CreateDeploymentRequest) { r.Replicas = -1 }, codes.InvalidArgument, "replicas"},
		{"duplicate region", func(r *ctrlv1.CreateDeploymentRequest) { r.Regions = []string{"eu", "eu"} }, codes.InvalidArgument, "regions[1]"},
		{"region without cluster", func(r *ctrlv1.CreateDeploymentRequest) { r.Regions = []string{"mars"} }, codes.FailedPrecondition, "regions"},
		{"bad env var", func(r *ctrlv1.CreateDeploymentRequest) { r.EnvVars = map[string]string{"A-B": "1"} }, codes.InvalidArgument, "env_vars"},
		{"secrets without a vault", func(r *ctrlv1.CreateDeploymentRequest) { r.SecretEnv = map[string]string{"TOKEN": "s3cr3t"} }, codes.FailedPrecondition, "secret_env"},
		{"timeout", func(r *ctrlv1.CreateDeploymentRequest) { r.TimeoutSeconds = -5 }, codes.InvalidArgument, "timeout_seconds"},
		{"healthcheck", func(r *ctrlv1.CreateDeploymentRequest) {
			r.Healthcheck = &clusterv1.Healthcheck{Path: "health"}
		}, codes.InvalidArgument, "healthcheck.path"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := req("env-v", "registry.test/app:1")
			c.mutate(r)
			_, err := api.CreateDeployment(ctx, r)
			if code(err) != c.code || !strings.HasPrefix(status.Convert(err).Message(), c.field) {
				t.Fatalf("error %v, want %s starting with %q", err, c.code, c.field)
			}
			if strings.Contains(status.Convert(err).Message(), "s3cr3t") {
				t.Fatal("the error echoes a secret value")
			}
		})
	}
	var n int
	if err := env.Store.DB().QueryRow("SELECT COUNT(*) FROM deployments").Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d deployments recorded from bad requests (%v), want 0", n, err)
	}
	if _, err := api.GetDeployment(ctx, &ctrlv1.GetDeploymentRequest{DeploymentId: "dep_missing"}); code(err) != codes.NotFound {
		t.Fatalf("GetDeployment of a missing id: %v, want NotFound", err)
	}
}

func TestDeployAPINeedsAnOperatorToken(t *testing.T) {
	env := ctrltest.Start(t, ctrltest.Options{Restate: testenv.SharedRestate(t)})
	ctx := context.Background()
	anon := ctrlv1.NewDeploymentServiceClient(env.Dial(t, ""))
	if _, err := anon.ListDeployments(ctx, &ctrlv1.ListDeploymentsRequest{EnvironmentId: "e"}); code(err) != codes.Unauthenticated {
		t.Fatalf("no token: %v, want Unauthenticated", err)
	}
	clusterTok := ctrlv1.NewDeploymentServiceClient(env.Dial(t, env.ClusterToken(t, "eu", "eu-1")))
	if _, err := clusterTok.ListDeployments(ctx, &ctrlv1.ListDeploymentsRequest{EnvironmentId: "e"}); code(err) != codes.PermissionDenied {
		t.Fatalf("cluster token: %v, want PermissionDenied", err)
	}
}

func TestCreateWhileRestateIsDownIsRecordedAndRetriedWithItsKey(t *testing.T) {
	r := testenv.SharedRestate(t)
	env := ctrltest.Start(t, ctrltest.Options{Restate: r})
	api := env.Deployments(t)
	eu := env.FakeCluster(t, "eu", "eu-1")
	ctx := context.Background()

	r.Kill()
	rq := req("env-down", "registry.test/app:1")
	rq.IdempotencyKey = "while-down"
	_, err := api.CreateDeployment(ctx, rq)
	if code(err) != codes.Unavailable || !strings.Contains(err.Error(), "same idempotency_key") {
		t.Fatalf("create with Restate down: %v, want Unavailable telling to retry with the key", err)
	}
	var id, st string
	if err := env.Store.DB().QueryRow("SELECT id, status FROM deployments WHERE idempotency_key = 'while-down'").Scan(&id, &st); err != nil || st != "pending" {
		t.Fatalf("recorded deployment: %q %q %v, want a pending row", id, st, err)
	}
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	resp, err := api.CreateDeployment(ctx, rq)
	if err != nil || resp.GetDeploymentId() != id {
		t.Fatalf("retry with the key: %v, %v; want %s", resp, err, id)
	}
	reportReady(t, api, eu, id)
}
